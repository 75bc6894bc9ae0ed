"""`latlab export`: pick the source (zoo model, user factory or ONNX file), export (+ variants), print a summary."""

from __future__ import annotations

import argparse
import time

from typing import TYPE_CHECKING

from latlab.export.accuracy import Bound
from latlab.export.onnx_export import ExportError, ParityError, export

if TYPE_CHECKING:
    from latlab.export.zoo_model import ZooModel

# which command-line options each zoo builder takes (the others are left to the builder's defaults)
ZOO_OPTIONS = {
    "mlp": ("in_features", "hidden", "out_features"),
    "ffn": ("d_model", "n_layers"),
    "rnn": ("cell", "input_size", "hidden", "rnn_layers", "seq_len", "out_features"),
    "cnn": ("image_size", "width", "classes"),
    "minilm": ("seq_len",),
}


def run_export(args: argparse.Namespace) -> dict:
    """Export what the arguments name; print where it went, its size and its parity; return the metadata."""
    sources = [s for s in (args.model, args.module, args.onnx) if s is not None]
    if len(sources) != 1:
        raise ExportError("name exactly one of: a zoo model (mlp, ffn, rnn, cnn, minilm), --module or --onnx")
    if (args.module or args.onnx) and not args.name:
        raise ExportError("--module and --onnx need --name (the folder under --models-dir)")
    bound = _bound(args)
    started = time.perf_counter()
    if args.onnx is not None:
        from latlab.export.adopt import adopt_onnx

        meta = adopt_onnx(
            args.onnx,
            args.name,
            args.models_dir,
            allow_fixed_batch=args.allow_fixed_batch,
            external_data_threshold=args.external_data_threshold,
        )
        _print_summary(meta, args, time.perf_counter() - started)
        return meta
    zoo, source = _build(args)
    meta = _export_torch(args, zoo, source, bound)
    _print_summary(meta, args, time.perf_counter() - started)
    if getattr(args, "int8", False):  # after the summary: a refused variant leaves the FP32 export, said so
        meta = _add_int8(meta, zoo, source, args, bound)
    return meta


def _export_torch(args: argparse.Namespace, zoo: ZooModel, source: str, bound: Bound) -> dict:
    try:
        return export(
            args.name or args.model,
            zoo,
            args.models_dir,
            source,
            fp16=args.fp16,
            external_data_threshold=args.external_data_threshold,
            bound=bound,
        )
    except (ExportError, ParityError):
        raise
    except Exception as exc:
        if args.module is None:
            raise  # a zoo model that fails to export is a bug: keep its traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExportError(
            f"--module {args.module}: torch.onnx.export failed ({type(exc).__name__}: {first}); "
            f"the first axis of every input must be free (no hard-coded batch size)"
        ) from exc


def _bound(args: argparse.Namespace) -> Bound:
    """The accuracy the variants must keep: --min-accuracy, or the default of the model's measure."""
    # a caller that builds its own Namespace (the lab exporting the user's module) names only the flags it uses
    int8, minimum = getattr(args, "int8", False), getattr(args, "min_accuracy", None)
    if int8 and args.onnx is not None:
        raise ExportError(
            "--int8 needs a PyTorch source (a zoo model or --module): the check set comes from its input generator"
        )
    if minimum is not None and not (int8 or args.fp16):
        raise ExportError("--min-accuracy bounds a variant: add --int8 or --fp16")
    if minimum is not None and not 0.0 <= minimum <= 1.0:
        raise ExportError(f"--min-accuracy must be between 0 and 1, not {minimum}")
    return Bound.for_model(args.model, minimum)


def _add_int8(meta: dict, zoo: ZooModel, source: str, args: argparse.Namespace, bound: Bound) -> dict:
    from latlab.export.int8 import export_int8

    started = time.perf_counter()
    variant = export_int8(meta["name"], zoo, args.models_dir, source, bound)
    sizes = variant["file_bytes"]
    print(
        f"int8 variant: {args.models_dir / variant['name'] / 'model.onnx'} ({variant['quantization']['recipe']}; "
        f"{_size(sizes['int8'])}, FP32 {_size(sizes['fp32'])}){_accuracy_text(variant)}  "
        f"({time.perf_counter() - started:.1f} s)"
    )
    return {**meta, "int8_variant": variant["name"]}


def _build(args: argparse.Namespace) -> tuple[ZooModel, str]:
    if args.module is not None:
        from latlab.export.adopt import load_factory

        zoo = load_factory(args.module)
        return zoo, f"user module {args.module}"
    from latlab.export.zoo import BUILDERS

    settings = {k: getattr(args, k) for k in ZOO_OPTIONS[args.model] if getattr(args, k, None) is not None}
    for key, value in settings.items():
        if isinstance(value, int) and value < 1:
            raise ExportError(f"--{key.replace('_', '-')} must be a positive integer, not {value}")
    try:
        zoo = BUILDERS[args.model](**settings)
    except ValueError as exc:
        raise ExportError(f"{args.model}: {exc}") from None
    return zoo, f"latlab zoo: {args.model}({zoo.config})"


def _print_summary(meta: dict, args: argparse.Namespace, seconds: float) -> None:
    flops = meta.get("flops_per_sample")
    flops_text = f"{flops:,}" if flops is not None else "unknown"
    print(
        f"exported {meta['name']}: {args.models_dir / meta['name'] / 'model.onnx'}"
        f"{' (+ model.onnx.data)' if meta.get('external_data') else ''}  params {meta['params']:,}  "
        f"FLOPs/sample {flops_text}  opset {meta['opset']}  ({seconds:.1f} s)"
    )
    parity = meta["parity"]
    if isinstance(parity, str):
        print(f"parity vs PyTorch: {parity}; CPU smoke run: {meta.get('cpu_smoke_run')}")
    else:
        print(
            f"parity vs PyTorch at batch {parity['batches']}: max abs error {parity['max_abs_error']:.3e}, "
            f"max rel error {parity['max_rel_error']:.3e} (tolerance {parity['tolerance_rel']:.0e})"
        )
    if meta.get("warning"):
        print(f"warning: {meta['warning']}")
    text = meta.get("text_deployment")
    if text:
        folder = args.models_dir / meta["name"]
        print(
            f'sentences in: serve with [deployments.tokenizer] file = "{folder / text["tokenizer"]["file"]}", '
            f"max_length = {text['tokenizer']['max_length']} (input '{text['input']['name']}', BYTES)"
        )
    if meta.get("fp16_variant"):
        from latlab.export.onnx_export import load_metadata

        variant = load_metadata(args.models_dir / meta["fp16_variant"])
        half = variant["parity"]
        detail = (
            f"max rel error {half['max_rel_error']:.3e} (tolerance {half['tolerance_rel']:.0e})"
            if half.get("status") == "checked"
            else half["status"]
        )
        print(
            f"fp16 variant: {args.models_dir / variant['name'] / 'model.onnx'}  parity: {detail}"
            f"{_accuracy_text(variant)}"
        )


def _size(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.1f} kB"


def _accuracy_text(variant: dict) -> str:
    accuracy = variant.get("accuracy")
    if not accuracy or accuracy["status"] != "checked":
        return ""  # its parity line already says why nothing was checked
    return f"  {accuracy['label']}: {accuracy['figure']:.4f} (min {accuracy['min_accuracy']:g})"
