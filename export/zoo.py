"""The model zoo: PyTorch modules with example inputs, built from a name and a few sizes."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class ZooModel:
    """A module ready to export: example inputs by name (batch first) and how it was built."""

    module: nn.Module
    inputs: dict[str, torch.Tensor]
    output_names: list[str]
    config: dict = field(default_factory=dict)


class MLP(nn.Module):
    """The seed question's network: a few input features, one hidden layer (100 units by default)."""

    def __init__(self, in_features: int, hidden: int, out_features: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ResidualBlock(nn.Module):
    """Seed 003's block: a bias-free d_model x d_model Linear and ReLU, plus the input."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.ff = nn.Sequential(nn.Linear(d_model, d_model, bias=False), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ff(x) + x


class FFN(nn.Module):
    """Seed 003's toy: n_layers residual blocks; compute grows with d_model^2, sequential depth with n_layers."""

    def __init__(self, d_model: int, n_layers: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[ResidualBlock(d_model) for _ in range(n_layers)])
        # PyTorch's default init grows the residual stream ~8% per block (1e13 after 128, inf after
        # ~1000); the ReLU branch always adds a positive drift, so scaling it by 1/depth keeps outputs
        # within a small factor of the input at any n_layers, without changing the compute.
        for block in self.blocks:
            nn.init.normal_(block.ff[0].weight, std=(2.0 / d_model) ** 0.5 / n_layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


def build_mlp(in_features: int = 4, hidden: int = 100, out_features: int = 1, batch: int = 2) -> ZooModel:
    module = MLP(in_features, hidden, out_features).eval()
    return ZooModel(module, {"x": torch.randn(batch, in_features)}, ["y"],
                    {"in_features": in_features, "hidden": hidden, "out_features": out_features})


def build_ffn(d_model: int = 128, n_layers: int = 128, batch: int = 2) -> ZooModel:
    module = FFN(d_model, n_layers).eval()
    return ZooModel(module, {"x": torch.randn(batch, d_model)}, ["y"],
                    {"d_model": d_model, "n_layers": n_layers})


BUILDERS = {"mlp": build_mlp, "ffn": build_ffn}
