"""`latlab export`: a zoo model, or your own, to models/<name>/model.onnx."""

from __future__ import annotations

import argparse
from pathlib import Path

from latlab.common.user_input import UserError


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`latlab export`: zoo models and your own."""
    export = sub.add_parser(
        "export",
        help="export a zoo model (or your own) to models/<name>/model.onnx",
        epilog="Your own model: --module package.module:factory --name NAME (the factory returns "
        "(nn.Module, {input name: example tensor, batch first}[, output names])), or "
        "--onnx FILE --name NAME to adopt an existing ONNX file.",
    )
    export.add_argument("model", nargs="?", choices=["mlp", "ffn", "rnn", "cnn", "minilm"])
    export.add_argument("--name", help="folder name under --models-dir (default: the model's)")
    export.add_argument("--models-dir", type=Path, default=Path("models"))
    export.add_argument("--module", metavar="PKG.MOD:FACTORY", help="export your own PyTorch module")
    export.add_argument("--onnx", type=Path, metavar="FILE", help="adopt an existing ONNX file")
    export.add_argument(
        "--allow-fixed-batch",
        action="store_true",
        help="--onnx: adopt a model whose first axis is fixed (serve it with max_batch_size 1)",
    )
    export.add_argument("--fp16", action="store_true", help="also write an fp16 variant to models/<name>-fp16/ (GPU)")
    export.add_argument("--int8", action="store_true", help="also write an int8 variant to models/<name>-int8/ (CPU)")
    export.add_argument(
        "--min-accuracy",
        type=float,
        metavar="X",
        help="the least a variant may keep against FP32, 0 to 1 (default: minilm 0.98 min embedding "
        "cosine, cnn 0.95 top-1 agreement, others 0.98 = 1 - max relative error); a variant "
        "below it is not written (docs/variants.md)",
    )
    export.add_argument(
        "--external-data-threshold",
        type=int,
        default=2 * 1024**3,
        metavar="BYTES",
        help="weights above this size go to model.onnx.data (default 2 GiB, protobuf's limit)",
    )
    export.add_argument("--d-model", type=int, default=128, help="ffn: width")
    export.add_argument("--n-layers", type=int, default=128, help="ffn: residual blocks")
    export.add_argument("--in-features", type=int, help="mlp: input features (4)")
    export.add_argument("--hidden", type=int, help="mlp: hidden units (100); rnn: hidden size (128)")
    export.add_argument("--out-features", type=int, help="mlp: outputs (1); rnn: projected outputs (8)")
    export.add_argument("--cell", choices=["lstm", "gru"], help="rnn: cell (lstm)")
    export.add_argument("--input-size", type=int, help="rnn: features per step (32)")
    export.add_argument("--rnn-layers", type=int, help="rnn: stacked layers (2)")
    export.add_argument(
        "--seq-len", type=int, help="rnn, minilm: the example's sequence length (32, 16); the axis is dynamic"
    )
    export.add_argument("--image-size", type=int, help="cnn: image height and width (224)")
    export.add_argument("--width", type=int, help="cnn: first stage's channels (64)")
    export.add_argument("--classes", type=int, help="cnn: classes (1000)")
    export.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> None:
    from latlab.export.command import run_export
    from latlab.export.onnx_export import ExportError

    try:
        run_export(args)
    except ExportError as exc:
        raise UserError(str(exc)) from None
