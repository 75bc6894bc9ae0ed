"""The model zoo: PyTorch modules with example inputs, built from a name and a few sizes."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from latlab.export import minilm
from latlab.export.zoo_model import ZooModel


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
    return ZooModel(
        module,
        {"x": torch.randn(batch, in_features)},
        ["y"],
        {"in_features": in_features, "hidden": hidden, "out_features": out_features},
    )


def build_ffn(d_model: int = 128, n_layers: int = 128, batch: int = 2) -> ZooModel:
    module = FFN(d_model, n_layers).eval()
    return ZooModel(module, {"x": torch.randn(batch, d_model)}, ["y"], {"d_model": d_model, "n_layers": n_layers})


class RNN(nn.Module):
    """An LSTM or GRU over a sequence; the last step's top hidden state, projected."""

    def __init__(self, cell: str, input_size: int, hidden: int, layers: int, out_features: int) -> None:
        super().__init__()
        kinds = {"lstm": nn.LSTM, "gru": nn.GRU}
        if cell not in kinds:
            raise ValueError(f"rnn cell must be one of {sorted(kinds)}, not {cell!r}")
        self.rnn = kinds[cell](input_size, hidden, num_layers=layers, batch_first=True)
        self.proj = nn.Linear(hidden, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.proj(out[:, -1])


def build_rnn(
    cell: str = "lstm",
    input_size: int = 32,
    hidden: int = 128,
    rnn_layers: int = 2,
    seq_len: int = 32,
    out_features: int = 8,
    batch: int = 2,
) -> ZooModel:
    module = RNN(cell, input_size, hidden, rnn_layers, out_features).eval()

    def make_inputs(n: int) -> dict[str, torch.Tensor]:
        # a sequence length the export never saw proves the seq axis is really dynamic
        return {"x": torch.randn(n, seq_len + 3, input_size)}

    return ZooModel(
        module,
        {"x": torch.randn(batch, seq_len, input_size)},
        ["y"],
        {
            "cell": cell,
            "input_size": input_size,
            "hidden": hidden,
            "rnn_layers": rnn_layers,
            "seq_len": seq_len,
            "out_features": out_features,
        },
        dynamic_axes={"x": {0: "batch", 1: "seq"}},
        make_inputs=make_inputs,
        extras={"flops_at": {"seq": seq_len}},
    )


def build_cnn(image_size: int = 224, width: int = 64, classes: int = 1000, batch: int = 2) -> ZooModel:
    from latlab.export.resnet import ResNet18

    module = ResNet18(width, classes).eval()
    return ZooModel(
        module,
        {"image": torch.randn(batch, 3, image_size, image_size)},
        ["logits"],
        {"image_size": image_size, "width": width, "classes": classes},
    )


def build_minilm(seq_len: int = 16, batch: int = 2) -> ZooModel:
    return minilm.build(seq_len, batch)


BUILDERS: dict[str, Callable[..., ZooModel]] = {
    "mlp": build_mlp,
    "ffn": build_ffn,
    "rnn": build_rnn,
    "cnn": build_cnn,
    "minilm": build_minilm,
}
