"""`latlab export`: pick the source (zoo model, user factory or ONNX file), export (+ variants), print a summary."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from latlab.export.accuracy import Bound
from latlab.export.onnx_export import ExportError, ParityError, export
from latlab.export.options import ExportOptions

if TYPE_CHECKING:
    from latlab.export.zoo_model import ZooModel


def run_export(options: ExportOptions) -> dict:
    """Export what the options name; print where it went, its size and its parity; return the metadata."""
    sources = [s for s in (options.model, options.module, options.onnx) if s is not None]
    if len(sources) != 1:
        raise ExportError("name exactly one of: a zoo model (mlp, ffn, rnn, cnn, minilm), --module or --onnx")
    if (options.module or options.onnx) and not options.name:
        raise ExportError("--module and --onnx need --name (the folder under --models-dir)")
    bound = _bound(options)
    started = time.perf_counter()
    if options.onnx is not None:
        from latlab.export.adopt import adopt_onnx

        meta = adopt_onnx(
            options.onnx,
            options.name,
            options.models_dir,
            allow_fixed_batch=options.allow_fixed_batch,
            external_data_threshold=options.external_data_threshold,
        )
        _print_summary(meta, options, time.perf_counter() - started)
        return meta
    zoo, source = _build(options)
    meta = _export_torch(options, zoo, source, bound)
    _print_summary(meta, options, time.perf_counter() - started)
    if options.int8:  # after the summary: a refused variant leaves the FP32 export, said so
        meta = _add_int8(meta, zoo, source, options, bound)
    return meta


def _export_torch(options: ExportOptions, zoo: ZooModel, source: str, bound: Bound) -> dict:
    try:
        return export(
            options.name or options.model,
            zoo,
            options.models_dir,
            source,
            fp16=options.fp16,
            external_data_threshold=options.external_data_threshold,
            bound=bound,
        )
    except (ExportError, ParityError):
        raise
    except Exception as exc:
        if options.module is None:
            raise  # a zoo model that fails to export is a bug: keep its traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExportError(
            f"--module {options.module}: torch.onnx.export failed ({type(exc).__name__}: {first}); "
            f"the first axis of every input must be free (no hard-coded batch size)"
        ) from exc


def _bound(options: ExportOptions) -> Bound:
    """The accuracy the variants must keep: --min-accuracy, or the default of the model's measure."""
    int8, minimum = options.int8, options.min_accuracy
    if int8 and options.onnx is not None:
        raise ExportError(
            "--int8 needs a PyTorch source (a zoo model or --module): the check set comes from its input generator"
        )
    if minimum is not None and not (int8 or options.fp16):
        raise ExportError("--min-accuracy bounds a variant: add --int8 or --fp16")
    if minimum is not None and not 0.0 <= minimum <= 1.0:
        raise ExportError(f"--min-accuracy must be between 0 and 1, not {minimum}")
    return Bound.for_model(options.model, minimum)


def _add_int8(meta: dict, zoo: ZooModel, source: str, options: ExportOptions, bound: Bound) -> dict:
    from latlab.export.int8 import export_int8

    started = time.perf_counter()
    variant = export_int8(meta["name"], zoo, options.models_dir, source, bound)
    sizes = variant["file_bytes"]
    print(
        f"int8 variant: {options.models_dir / variant['name'] / 'model.onnx'} ({variant['quantization']['recipe']}; "
        f"{_size(sizes['int8'])}, FP32 {_size(sizes['fp32'])}){_accuracy_text(variant)}  "
        f"({time.perf_counter() - started:.1f} s)"
    )
    return {**meta, "int8_variant": variant["name"]}


def _build(options: ExportOptions) -> tuple[ZooModel, str]:
    if options.module is not None:
        from latlab.export.adopt import load_factory

        zoo = load_factory(options.module)
        return zoo, f"user module {options.module}"
    from latlab.export.zoo import BUILDERS

    settings = options.zoo_settings()
    for key, value in settings.items():
        if isinstance(value, int) and value < 1:
            raise ExportError(f"--{key.replace('_', '-')} must be a positive integer, not {value}")
    try:
        zoo = BUILDERS[options.model](**settings)
    except ValueError as exc:
        raise ExportError(f"{options.model}: {exc}") from None
    return zoo, f"latlab zoo: {options.model}({zoo.config})"


def _print_summary(meta: dict, options: ExportOptions, seconds: float) -> None:
    flops = meta.get("flops_per_sample")
    flops_text = f"{flops:,}" if flops is not None else "unknown"
    print(
        f"exported {meta['name']}: {options.models_dir / meta['name'] / 'model.onnx'}"
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
        folder = options.models_dir / meta["name"]
        print(
            f'sentences in: serve with [deployments.tokenizer] file = "{folder / text["tokenizer"]["file"]}", '
            f"max_length = {text['tokenizer']['max_length']} (input '{text['input']['name']}', BYTES)"
        )
    if meta.get("fp16_variant"):
        from latlab.export.onnx_export import load_metadata

        variant = load_metadata(options.models_dir / meta["fp16_variant"])
        half = variant["parity"]
        detail = (
            f"max rel error {half['max_rel_error']:.3e} (tolerance {half['tolerance_rel']:.0e})"
            if half.get("status") == "checked"
            else half["status"]
        )
        print(
            f"fp16 variant: {options.models_dir / variant['name'] / 'model.onnx'}  parity: {detail}"
            f"{_accuracy_text(variant)}"
        )


def _size(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.1f} kB"


def _accuracy_text(variant: dict) -> str:
    accuracy = variant.get("accuracy")
    if not accuracy or accuracy["status"] != "checked":
        return ""  # its parity line already says why nothing was checked
    return f"  {accuracy['label']}: {accuracy['figure']:.4f} (min {accuracy['min_accuracy']:g})"
