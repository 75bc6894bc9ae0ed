"""`latlab export`: a zoo model, or your own, to models/<name>/model.onnx."""

from __future__ import annotations

import argparse

from latlab.common.user_input import UserError
from latlab.export.options import ExportOptions


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`latlab export`: zoo models and your own."""
    export = sub.add_parser(
        "export",
        help="export a zoo model (or your own) to models/<name>/model.onnx",
        epilog="Your own model: --module package.module:factory --name NAME (the factory returns "
        "(nn.Module, {input name: example tensor, batch first}[, output names])), or "
        "--onnx FILE --name NAME to adopt an existing ONNX file.",
    )
    ExportOptions.add_cli_args(export)
    export.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> None:
    from latlab.export.command import run_export
    from latlab.export.onnx_export import ExportError

    try:
        run_export(ExportOptions.from_cli_args(args))
    except ExportError as exc:
        raise UserError(str(exc)) from None
