"""A ResNet-18-shaped image network in plain PyTorch (no torchvision), with a configurable base width."""

from __future__ import annotations

import torch
from torch import nn


def _conv_bn(c_in: int, c_out: int, kernel: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, kernel, stride, padding=kernel // 2, bias=False), nn.BatchNorm2d(c_out))


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm, plus the input (1x1-projected when the shape changes)."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(_conv_bn(c_in, c_out, 3, stride), nn.ReLU(), _conv_bn(c_out, c_out, 3, 1))
        changes_shape = stride != 1 or c_in != c_out
        self.shortcut = _conv_bn(c_in, c_out, 1, stride) if changes_shape else nn.Identity()
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


class ResNet18(nn.Module):
    """He et al.'s ResNet-18: a 7x7 stem, four stages of two BasicBlocks ([2,2,2,2]), average pool, classifier.

    `width` is the first stage's channels (64 in the paper; the stages double it); tests use 8."""

    def __init__(self, width: int = 64, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(_conv_bn(3, width, 7, 2), nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1))
        stages, c_in = [], width
        for i, blocks in enumerate([2, 2, 2, 2]):
            c_out = width * 2**i
            for j in range(blocks):
                stages.append(BasicBlock(c_in, c_out, stride=2 if i > 0 and j == 0 else 1))
                c_in = c_out
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(c_in, classes)
        # halve the last BN's scale in each block (torchvision offers zero) so random-init activations stay
        # bounded through 8 residual additions; parity is then measured on outputs of a sensible scale
        for block in stages:
            nn.init.constant_(block.body[2][1].weight, 0.5)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        features = self.stages(self.stem(image))
        return self.fc(features.mean(dim=(2, 3)))
