"""What `latlab export` is asked to do, as a value: `ExportOptions` owns the command's options (the CLI only adds
them), so library code that exports (the lab, for a user's module) builds one instead of a command line.

Only the standard library at import: the CLI imports this module whatever command it runs."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from pathlib import Path

EXTERNAL_DATA_THRESHOLD = 2 * 1024**3
"""protobuf cannot serialise a message over 2 GiB, so bigger models keep their weights beside the graph."""
ZOO_MODELS = ("mlp", "ffn", "rnn", "cnn", "minilm")
ZOO_OPTIONS = {
    "mlp": ("in_features", "hidden", "out_features"),
    "ffn": ("d_model", "n_layers"),
    "rnn": ("cell", "input_size", "hidden", "rnn_layers", "seq_len", "out_features"),
    "cnn": ("image_size", "width", "classes"),
    "minilm": ("seq_len",),
}
"""Which options each zoo builder takes (the others are left to the builder's defaults)."""


@dataclass(frozen=True)
class ExportOptions:
    """The options of `latlab export` (their help: add_cli_args). Exactly one source: a zoo model, `module` or
    `onnx`."""

    model: str | None = None
    """A zoo model, one of ZOO_MODELS."""
    module: str | None = None
    """Your own PyTorch module, 'package.module:factory'."""
    onnx: Path | None = None
    """An existing ONNX file to adopt."""
    name: str | None = None
    """The folder under models_dir (default: the zoo model's name; `module` and `onnx` need one)."""
    models_dir: Path = Path("models")
    allow_fixed_batch: bool = False
    fp16: bool = False
    int8: bool = False
    min_accuracy: float | None = None
    external_data_threshold: int = EXTERNAL_DATA_THRESHOLD
    # the zoo builders' sizes (ZOO_OPTIONS); None leaves a size to the builder
    d_model: int = 128
    n_layers: int = 128
    in_features: int | None = None
    hidden: int | None = None
    out_features: int | None = None
    cell: str | None = None
    input_size: int | None = None
    rnn_layers: int | None = None
    seq_len: int | None = None
    image_size: int | None = None
    width: int | None = None
    classes: int | None = None

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        """The options of `latlab export`, with these defaults."""
        parser.add_argument("model", nargs="?", choices=list(ZOO_MODELS))
        parser.add_argument("--name", help="folder name under --models-dir (default: the model's)")
        parser.add_argument("--models-dir", type=Path, default=cls.models_dir)
        parser.add_argument("--module", metavar="PKG.MOD:FACTORY", help="export your own PyTorch module")
        parser.add_argument("--onnx", type=Path, metavar="FILE", help="adopt an existing ONNX file")
        parser.add_argument(
            "--allow-fixed-batch",
            action="store_true",
            help="--onnx: adopt a model whose first axis is fixed (serve it with max_batch_size 1)",
        )
        parser.add_argument(
            "--fp16", action="store_true", help="also write an fp16 variant to models/<name>-fp16/ (GPU)"
        )
        parser.add_argument(
            "--int8", action="store_true", help="also write an int8 variant to models/<name>-int8/ (CPU)"
        )
        parser.add_argument(
            "--min-accuracy",
            type=float,
            metavar="X",
            help="the least a variant may keep against FP32, 0 to 1 (default: minilm 0.98 min embedding "
            "cosine, cnn 0.95 top-1 agreement, others 0.98 = 1 - max relative error); a variant "
            "below it is not written (docs/variants.md)",
        )
        parser.add_argument(
            "--external-data-threshold",
            type=int,
            default=cls.external_data_threshold,
            metavar="BYTES",
            help="weights above this size go to model.onnx.data (default 2 GiB, protobuf's limit)",
        )
        _add_zoo_args(parser)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> ExportOptions:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})

    def zoo_settings(self) -> dict[str, int | str]:
        """The sizes given for the zoo model, as its builder's keywords."""
        return {key: getattr(self, key) for key in ZOO_OPTIONS[self.model] if getattr(self, key) is not None}


def _add_zoo_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--d-model", type=int, default=ExportOptions.d_model, help="ffn: width")
    parser.add_argument("--n-layers", type=int, default=ExportOptions.n_layers, help="ffn: residual blocks")
    parser.add_argument("--in-features", type=int, help="mlp: input features (4)")
    parser.add_argument("--hidden", type=int, help="mlp: hidden units (100); rnn: hidden size (128)")
    parser.add_argument("--out-features", type=int, help="mlp: outputs (1); rnn: projected outputs (8)")
    parser.add_argument("--cell", choices=["lstm", "gru"], help="rnn: cell (lstm)")
    parser.add_argument("--input-size", type=int, help="rnn: features per step (32)")
    parser.add_argument("--rnn-layers", type=int, help="rnn: stacked layers (2)")
    parser.add_argument(
        "--seq-len", type=int, help="rnn, minilm: the example's sequence length (32, 16); the axis is dynamic"
    )
    parser.add_argument("--image-size", type=int, help="cnn: image height and width (224)")
    parser.add_argument("--width", type=int, help="cnn: first stage's channels (64)")
    parser.add_argument("--classes", type=int, help="cnn: classes (1000)")
