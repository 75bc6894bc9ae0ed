"""A module ready to export (`ZooModel`): the zoo's, the user's (adopt.py, command.py) and minilm's alike."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn


@dataclass
class ZooModel:
    """A module ready to export: example inputs by name (batch first) and how it was built."""

    module: nn.Module
    inputs: dict[str, torch.Tensor]
    output_names: list[str]
    config: dict = field(default_factory=dict)
    # input name -> {axis: symbolic name}; None means "axis 0 of every input is `batch`"
    dynamic_axes: dict[str, dict[int, str]] | None = None
    # symbolic name -> largest size the export must accept (default 65536)
    axis_limits: dict[str, int] = field(default_factory=dict)
    # batch -> fresh random inputs for the parity check; None: like the examples (randn / randint)
    make_inputs: Callable[[int], dict[str, torch.Tensor]] | None = None
    # extra metadata, and files to copy into the model folder (relative destination -> source; a tokenizer)
    extras: dict = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)

    def axes(self) -> dict[str, dict[int, str]]:
        """The dynamic axes of every input (batch-first by default)."""
        return self.dynamic_axes if self.dynamic_axes is not None else {n: {0: "batch"} for n in self.inputs}

    def random_inputs(self, batch: int) -> dict[str, torch.Tensor]:
        """Fresh inputs at this batch size, never the examples the export traced."""
        if self.make_inputs is not None:
            return self.make_inputs(batch)
        return {n: _like(t, batch) for n, t in self.inputs.items()}


def _like(example: torch.Tensor, batch: int) -> torch.Tensor:
    shape = (batch, *example.shape[1:])
    if example.dtype.is_floating_point:
        return torch.randn(shape, dtype=example.dtype)
    if example.dtype == torch.bool:
        return torch.rand(shape) < 0.5
    # integers: stay inside the examples' range so embedding lookups remain valid
    high = max(int(example.max().item()) + 1, 1) if example.numel() else 1
    return torch.randint(0, high, shape, dtype=example.dtype)
