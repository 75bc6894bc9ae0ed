"""Export a zoo model to ONNX: dynamic axes, checker, parity against PyTorch, metadata file (+ fp16 variant).

Variants (fp16 here, int8 in export/int8.py) are also held to an accuracy bound against the FP32 model
(export/accuracy.py); one that misses it is refused and no folder of it is left to serve.

Somewhat over 400 lines on purpose: the FP32 export and its FP16 variant share the staging folder, the writer
(external data past a size), the parity check and the metadata, and `export(fp16=True)` writes both; split,
the variant would import the export and the export the variant."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import onnx
import onnxruntime as ort
import torch

from latlab.export import fp16 as half
from latlab.export import samples
from latlab.export.accuracy import Bound, compare, run
from latlab.export.flops import flops_per_sample
from latlab.export.options import EXTERNAL_DATA_THRESHOLD
from latlab.export.zoo_model import ZooModel

OPSET = 18
PARITY_BATCHES = (1, 7)
MAX_REL_ERROR = 1e-4
METADATA_FILE = "metadata.json"
MODEL_FILE = "model.onnx"
DATA_SUFFIX = ".data"  # external weights: model.onnx + model.onnx.data
DEFAULT_AXIS_LIMIT = 65536

__all__ = [
    "ExportError",
    "ParityError",
    "AccuracyBelowBound",
    "Parity",
    "export",
    "check_parity",
    "flops_per_sample",
    "load_metadata",
]


class ParityError(Exception):
    """ONNX Runtime's outputs differ from PyTorch's beyond the tolerance."""


class ProviderUnavailable(Exception):
    """The execution provider asked for the parity check did not load."""


class ExportError(Exception):
    """The model cannot be exported or adopted as asked (bad factory, fixed batch axis, unreadable file)."""


class AccuracyBelowBound(ExportError):
    """A variant (int8, fp16) strays further from the FP32 model than the accuracy bound allows."""


@dataclass
class Parity:
    max_abs_error: float
    max_rel_error: float


def export(
    name: str,
    zoo: ZooModel,
    models_dir: Path,
    source: str,
    *,
    fp16: bool = False,
    external_data_threshold: int = EXTERNAL_DATA_THRESHOLD,
    fp16_providers: list[str] | None = None,
    bound: Bound | None = None,
) -> dict:
    """Write models_dir/name/model.onnx (+ .data past the threshold) and metadata.json; return the metadata.

    With fp16, also write the half-precision variant to models_dir/name-fp16/ (see export/fp16.py), held to
    `bound` (default: relative error, export/accuracy.py)."""
    out_dir = Path(models_dir) / name
    with staged(out_dir) as scratch:
        metadata = _export_fp32(name, zoo, scratch, source, external_data_threshold)
    if fp16:
        variant = export_fp16(
            name, zoo, out_dir / MODEL_FILE, models_dir, source, external_data_threshold, fp16_providers, bound
        )
        metadata["fp16_variant"] = variant["name"]
        write_metadata(out_dir, metadata)
    return metadata


def _export_fp32(name: str, zoo: ZooModel, out_dir: Path, source: str, external_data_threshold: int) -> dict:
    path = out_dir / MODEL_FILE
    external = _to_onnx(zoo, path, external_data_threshold)
    onnx.checker.check_model(str(path), full_check=True)  # by path: works past 2 GiB and with external data
    parity = check_parity(zoo, path)
    graph = onnx.load(str(path), load_external_data=False)
    metadata = {
        "name": name,
        "source": source,
        "config": zoo.config,
        **describe(graph, zoo.extras.get("flops_at")),
        "params": sum(p.numel() for p in zoo.module.parameters()),
        "dynamic_axes": {n: {str(a): d for a, d in axes.items()} for n, axes in zoo.axes().items()},
        "external_data": external,
        "parity": _parity_record(parity, MAX_REL_ERROR),
        "torch_version": torch.__version__,
        **{k: v for k, v in zoo.extras.items() if k != "flops_at"},
    }
    for relative, src in zoo.files.items():
        (out_dir / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, out_dir / relative)
    write_metadata(out_dir, metadata)
    return metadata


def describe(model: onnx.ModelProto, flops_at: dict[str, int] | None = None) -> dict:
    """What any ONNX file says about itself: opset, signature, FLOPs per sample, initializer parameters."""
    initializers = {i.name for i in model.graph.initializer}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    flops = flops_per_sample(model, flops_at)
    return {
        "opset": opset,
        "params_in_initializers": sum(math.prod(i.dims) for i in model.graph.initializer),
        "flops_per_sample": flops,
        **({"flops_at": flops_at} if flops_at and flops is not None else {}),
        "inputs": [_signature(v) for v in model.graph.input if v.name not in initializers],
        "outputs": [_signature(v) for v in model.graph.output],
        "onnx_version": onnx.__version__,
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


@contextlib.contextmanager
def staged(out_dir: Path) -> Iterator[Path]:
    """A scratch folder that replaces out_dir only when the block succeeds.

    A failed export leaves the previous model (or nothing) rather than half a folder, and a new export
    never inherits stale files (an old model.onnx.data beside a now self-contained model)."""
    scratch = out_dir.parent / f".{out_dir.name}.partial"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        yield scratch
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    shutil.rmtree(out_dir, ignore_errors=True)
    scratch.rename(out_dir)


@contextlib.contextmanager
def staged_variant(out_dir: Path) -> Iterator[Path]:
    """staged(), and a variant refused for its accuracy also takes away the one an earlier export left there:
    that one was made from an FP32 model this export has just replaced."""
    try:
        with staged(out_dir) as scratch:
            yield scratch
    except AccuracyBelowBound:
        shutil.rmtree(out_dir, ignore_errors=True)
        raise


def _to_onnx(zoo: ZooModel, path: Path, external_data_threshold: int) -> bool:
    """Export with the zoo's dynamic axes; return whether the weights went to external data."""
    names = list(zoo.inputs)
    axes = zoo.axes()
    dims = {
        d: torch.export.Dim(d, min=1, max=zoo.axis_limits.get(d, DEFAULT_AXIS_LIMIT))
        for per_input in axes.values()
        for d in per_input.values()
    }
    dynamic_shapes = {n: {a: dims[d] for a, d in axes.get(n, {}).items()} for n in names}
    size = sum(t.numel() * t.element_size() for t in [*zoo.module.parameters(), *zoo.module.buffers()])
    external = size > external_data_threshold
    # The exporter narrates every pass on stdout and warns about internals; the CLI prints its own summary.
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            zoo.module,
            tuple(zoo.inputs.values()),
            None,
            input_names=names,
            dynamic_shapes=dynamic_shapes,
            opset_version=OPSET,
            dynamo=True,
            verbose=False,
        )
        _name_outputs(program.model.graph, zoo.output_names)
        program.save(str(path), external_data=external)
    return external


def _name_outputs(graph, names: list[str]) -> None:  # graph: an onnx_ir Graph
    """Give the graph's outputs their names, renaming any internal value that already holds one.

    The exporter names values after the ops that made them, so an output called `embedding` would
    clash with the `embedding` lookup inside the model (the checker then refuses the graph)."""
    if len(graph.outputs) != len(names):
        raise ExportError(
            f"the module returns {len(graph.outputs)} output(s) but {len(names)} name(s) were given: {names}"
        )
    values = {v.name: v for node in graph for v in node.outputs}
    values.update({v.name: v for v in graph.inputs})
    for value, wanted in zip(graph.outputs, names):
        clash = values.get(wanted)
        if clash is not None and clash is not value:
            clash.name = f"{wanted}__internal"
        value.name = wanted


def save(model: onnx.ModelProto, path: Path, external_data_threshold: int = EXTERNAL_DATA_THRESHOLD) -> bool:
    """Write an ONNX model, its weights in path + '.data' when they exceed the threshold; return which."""
    size = sum(len(i.raw_data) or math.prod(i.dims) * 4 for i in model.graph.initializer)
    external = size > external_data_threshold
    path.parent.mkdir(parents=True, exist_ok=True)
    if external:
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=path.name + DATA_SUFFIX,
            size_threshold=0,
        )
    else:
        onnx.save_model(model, str(path))
    return external


def check_parity(
    zoo: ZooModel,
    path: Path,
    batches: tuple[int, ...] = PARITY_BATCHES,
    tolerance: float = MAX_REL_ERROR,
    providers: list[str] | None = None,
) -> Parity:
    """Compare ORT with PyTorch on fresh random inputs; raise ParityError past the tolerance."""
    wanted = providers or ["CPUExecutionProvider"]
    session = ort.InferenceSession(str(path), providers=wanted)
    if session.get_providers()[0] != wanted[0]:  # ORT falls back silently; a check on the wrong device is no check
        raise ProviderUnavailable(f"{wanted[0]} did not load (ONNX Runtime fell back to {session.get_providers()[0]})")
    worst = Parity(0.0, 0.0)
    for batch in batches:
        inputs = zoo.random_inputs(batch)
        with torch.no_grad():
            expected = zoo.module(*inputs.values())
        expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
        got = session.run(zoo.output_names, {n: t.numpy() for n, t in inputs.items()})
        for want, have in zip(expected, got):
            want = want.numpy().astype(np.float64)
            abs_err = float(np.max(np.abs(want - have))) if want.size else 0.0
            scale = float(np.max(np.abs(want))) if want.size else 0.0
            rel_err = abs_err / scale if scale > 0 else abs_err
            worst = Parity(max(worst.max_abs_error, abs_err), max(worst.max_rel_error, rel_err))
    if not worst.max_rel_error <= tolerance:  # NaN fails too
        raise ParityError(
            f"ONNX Runtime differs from PyTorch: max rel error {worst.max_rel_error:.2e} "
            f"> {tolerance:.0e} (max abs {worst.max_abs_error:.2e})"
        )
    return worst


def _parity_record(parity: Parity, tolerance: float) -> dict:
    return {
        "batches": list(PARITY_BATCHES),
        "inputs": "fresh random inputs, not the traced examples",
        "max_abs_error": parity.max_abs_error,
        "max_rel_error": parity.max_rel_error,
        "tolerance_rel": tolerance,
    }


def export_fp16(
    name: str,
    zoo: ZooModel,
    fp32_path: Path,
    models_dir: Path,
    source: str,
    external_data_threshold: int = EXTERNAL_DATA_THRESHOLD,
    providers: list[str] | None = None,
    bound: Bound | None = None,
) -> dict:
    """Convert the exported fp32 model to fp16 in models_dir/name-fp16/ and check it with fp16's tolerance.

    The check runs on `providers` (default: CPU, which runs fp16 ops it lacks kernels for through inserted
    fp32 casts): parity against PyTorch, then the accuracy figure against the FP32 model, which must meet
    `bound` (AccuracyBelowBound otherwise). Where the provider cannot load or run the graph, the metadata
    says so under parity.status and accuracy.status (and the export goes on: the GPU it is meant for may
    still run it)."""
    out_dir = half.fp16_folder(models_dir, name)
    with staged_variant(out_dir) as scratch:
        metadata = _write_fp16(
            name, zoo, fp32_path, scratch, source, external_data_threshold, providers, bound or Bound.for_model(None)
        )
    return metadata


def _write_fp16(
    name: str,
    zoo: ZooModel,
    fp32_path: Path,
    out_dir: Path,
    source: str,
    external_data_threshold: int,
    providers: list[str] | None,
    bound: Bound,
) -> dict:
    path = out_dir / MODEL_FILE
    external = save(half.convert(onnx.load(str(fp32_path))), path, external_data_threshold)
    onnx.checker.check_model(str(path), full_check=True)
    providers = providers or ["CPUExecutionProvider"]
    try:
        parity = _parity_record(
            check_parity(zoo, path, tolerance=half.FP16_MAX_REL_ERROR, providers=providers), half.FP16_MAX_REL_ERROR
        )
        parity.update(status="checked", provider=providers[0])
    except ParityError:
        raise
    except Exception as exc:  # ORT refuses the graph or an op: report it, the GPU may still run it
        reason = str(exc).strip().splitlines()[0][:300]
        parity = {
            "status": f"not checked: {providers[0]} cannot run this fp16 graph: {reason}",
            "tolerance_rel": half.FP16_MAX_REL_ERROR,
        }
    graph = onnx.load(str(path), load_external_data=False)
    metadata = {
        "name": half.fp16_folder(Path(), name).name,
        "source": f"{source}, converted to fp16",
        "config": {**zoo.config, "fp16": True},
        **describe(graph, zoo.extras.get("flops_at")),
        "params": sum(p.numel() for p in zoo.module.parameters()),
        "precision": "fp16 weights and compute; inputs and outputs FP32 (casts inside the graph)",
        "fp32_model": name,
        "external_data": external,
        "parity": parity,
        "accuracy": _fp16_accuracy(name, zoo, fp32_path, path, bound, providers, parity),
    }
    write_metadata(out_dir, metadata)
    return metadata


def _fp16_accuracy(
    name: str, zoo: ZooModel, fp32_path: Path, path: Path, bound: Bound, providers: list[str], parity: dict
) -> dict:
    """The fp16 variant's figure against FP32 on the check set; AccuracyBelowBound below the bound."""
    if parity["status"] != "checked":  # the same reason stops this check
        return {"status": parity["status"], "min_accuracy": bound.minimum}
    batches = samples.check_batches(zoo)
    accuracy = compare(bound.measure, run(fp32_path, batches), run(path, batches, providers))
    if not accuracy.meets(bound):
        folder = half.fp16_folder(Path(), name)
        raise AccuracyBelowBound(f"{accuracy.shortfall(f'the fp16 variant of {name}', bound)}; no {folder} written")
    return accuracy.record(bound, provider=providers[0], inputs=samples.describe(zoo, batches))


def _signature(value: onnx.ValueInfoProto) -> dict:
    tensor = value.type.tensor_type
    shape = [
        d.dim_param if d.HasField("dim_param") else (d.dim_value if d.HasField("dim_value") else "?")
        for d in tensor.shape.dim
    ]
    return {"name": value.name, "datatype": _DATATYPES.get(tensor.elem_type, str(tensor.elem_type)), "shape": shape}


_DATATYPES = {
    onnx.TensorProto.FLOAT: "FP32",
    onnx.TensorProto.FLOAT16: "FP16",
    onnx.TensorProto.DOUBLE: "FP64",
    onnx.TensorProto.INT64: "INT64",
    onnx.TensorProto.INT32: "INT32",
    onnx.TensorProto.INT16: "INT16",
    onnx.TensorProto.INT8: "INT8",
    onnx.TensorProto.UINT8: "UINT8",
    onnx.TensorProto.UINT16: "UINT16",
    onnx.TensorProto.UINT32: "UINT32",
    onnx.TensorProto.UINT64: "UINT64",
    onnx.TensorProto.BOOL: "BOOL",
}


def write_metadata(model_dir: Path, metadata: dict) -> None:
    """Write a model folder's metadata.json."""
    (Path(model_dir) / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")


def load_metadata(model_dir: Path) -> dict:
    """Read a model folder's metadata.json."""
    path = Path(model_dir) / METADATA_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist; run `latlab export` first") from None
