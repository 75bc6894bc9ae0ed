"""Factories for `latlab export --module tests.export.factories:NAME` (the user's own PyTorch models)."""

from __future__ import annotations

import torch
from torch import nn

IN_A, IN_B, OUT = 3, 5, 2


class TwoInputs(nn.Module):
    """y = A(a) + B(b), and a second output: the sum of y (two inputs, two outputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(IN_A, OUT), nn.Linear(IN_B, OUT)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.a(a) + self.b(b)
        return y, y.sum(dim=1, keepdim=True)


def two_inputs() -> tuple[nn.Module, dict[str, torch.Tensor], list[str]]:
    torch.manual_seed(0)
    return TwoInputs(), {"a": torch.randn(2, IN_A), "b": torch.randn(2, IN_B)}, ["y", "total"]


def unnamed_outputs() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    return TwoInputs(), {"a": torch.randn(2, IN_A), "b": torch.randn(2, IN_B)}


def not_a_module() -> tuple[object, dict[str, torch.Tensor]]:
    return "a string", {"a": torch.randn(2, IN_A)}


def bad_inputs() -> tuple[nn.Module, list[torch.Tensor]]:
    return nn.Linear(IN_A, OUT), [torch.randn(2, IN_A)]


class FixedBatch(nn.Module):
    """Reshapes to the example's batch size: cannot be exported with a dynamic batch axis."""

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return a.reshape(2, IN_A) * 2


def fixed_batch() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return FixedBatch(), {"a": torch.randn(2, IN_A)}
