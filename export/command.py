"""`latlab export`: pick the source (zoo model, user factory or ONNX file), export, print a summary."""

from __future__ import annotations

import argparse
import time

from typing import TYPE_CHECKING

from latlab.export.onnx_export import ExportError, ParityError, export

if TYPE_CHECKING:
    from latlab.export.zoo import ZooModel

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
    started = time.perf_counter()
    if args.onnx is not None:
        from latlab.export.adopt import adopt_onnx

        meta = adopt_onnx(args.onnx, args.name, args.models_dir, allow_fixed_batch=args.allow_fixed_batch,
                          external_data_threshold=args.external_data_threshold)
    else:
        zoo, source = _build(args)
        try:
            meta = export(args.name or args.model, zoo, args.models_dir, source, fp16=args.fp16,
                          external_data_threshold=args.external_data_threshold)
        except (ExportError, ParityError):
            raise
        except Exception as exc:
            if args.module is None:
                raise  # a zoo model that fails to export is a bug: keep its traceback
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ExportError(f"--module {args.module}: torch.onnx.export failed ({type(exc).__name__}: {first}); "
                              f"the first axis of every input must be free (no hard-coded batch size)") from exc
    _print_summary(meta, args, time.perf_counter() - started)
    return meta


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
    print(f"exported {meta['name']}: {args.models_dir / meta['name'] / 'model.onnx'}"
          f"{' (+ model.onnx.data)' if meta.get('external_data') else ''}  params {meta['params']:,}  "
          f"FLOPs/sample {flops_text}  opset {meta['opset']}  ({seconds:.1f} s)")
    parity = meta["parity"]
    if isinstance(parity, str):
        print(f"parity vs PyTorch: {parity}; CPU smoke run: {meta.get('cpu_smoke_run')}")
    else:
        print(f"parity vs PyTorch at batch {parity['batches']}: max abs error {parity['max_abs_error']:.3e}, "
              f"max rel error {parity['max_rel_error']:.3e} (tolerance {parity['tolerance_rel']:.0e})")
    if meta.get("warning"):
        print(f"warning: {meta['warning']}")
    text = meta.get("text_deployment")
    if text:
        folder = args.models_dir / meta["name"]
        print(f"sentences in: serve with [deployments.tokenizer] file = \"{folder / text['tokenizer']['file']}\", "
              f"max_length = {text['tokenizer']['max_length']} (input '{text['input']['name']}', BYTES)")
    if meta.get("fp16_variant"):
        from latlab.export.onnx_export import load_metadata

        variant = load_metadata(args.models_dir / meta["fp16_variant"])
        half = variant["parity"]
        detail = (f"max rel error {half['max_rel_error']:.3e} (tolerance {half['tolerance_rel']:.0e})"
                  if half.get("status") == "checked" else half["status"])
        print(f"fp16 variant: {args.models_dir / variant['name'] / 'model.onnx'}  parity: {detail}")
