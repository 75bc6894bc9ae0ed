"""Export a zoo model to ONNX: dynamic batch axis, checker, parity against PyTorch, metadata file."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

from latlab.export.zoo import ZooModel

OPSET = 18
PARITY_BATCHES = (1, 7)
MAX_REL_ERROR = 1e-4
METADATA_FILE = "metadata.json"


class ParityError(Exception):
    """ONNX Runtime's outputs differ from PyTorch's beyond the tolerance."""


@dataclass
class Parity:
    max_abs_error: float
    max_rel_error: float


def export(name: str, zoo: ZooModel, models_dir: Path, source: str) -> dict:
    """Write models_dir/name/model.onnx and metadata.json; return the metadata."""
    out_dir = Path(models_dir) / name
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.onnx"
    _to_onnx(zoo, path)
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    parity = check_parity(zoo, path)
    metadata = {
        "name": name,
        "source": source,
        "config": zoo.config,
        "opset": OPSET,
        "params": sum(p.numel() for p in zoo.module.parameters()),
        "flops_per_sample": flops_per_sample(model),
        "inputs": [_signature(v) for v in model.graph.input],
        "outputs": [_signature(v) for v in model.graph.output],
        "parity": {"batches": list(PARITY_BATCHES), "max_abs_error": parity.max_abs_error,
                   "max_rel_error": parity.max_rel_error, "tolerance_rel": MAX_REL_ERROR},
        "torch_version": torch.__version__,
        "onnx_version": onnx.__version__,
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (out_dir / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
    return metadata


def _to_onnx(zoo: ZooModel, path: Path) -> None:
    names = list(zoo.inputs)
    batch = torch.export.Dim("batch", min=1, max=65536)
    dynamic_shapes = {n: {0: batch} for n in names}
    # The exporter narrates every pass on stdout and warns about internals; the CLI prints its own summary.
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(zoo.module, tuple(zoo.inputs.values()), str(path), input_names=names,
                          output_names=zoo.output_names, dynamic_shapes=dynamic_shapes, opset_version=OPSET,
                          dynamo=True, external_data=False, verbose=False)


def check_parity(zoo: ZooModel, path: Path, batches: tuple[int, ...] = PARITY_BATCHES) -> Parity:
    """Compare ORT (CPU) with PyTorch on fresh random inputs; raise ParityError past the tolerance."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = Parity(0.0, 0.0)
    for batch in batches:
        inputs = {n: torch.randn(batch, *t.shape[1:], dtype=t.dtype) for n, t in zoo.inputs.items()}
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
    if worst.max_rel_error > MAX_REL_ERROR:
        raise ParityError(f"ONNX Runtime differs from PyTorch: max rel error {worst.max_rel_error:.2e} "
                          f"> {MAX_REL_ERROR:.0e} (max abs {worst.max_abs_error:.2e})")
    return worst


def flops_per_sample(model: onnx.ModelProto) -> int:
    """Multiply-adds x2 of MatMul/Gemm nodes whose weight is a constant (the dense layers' FLOPs)."""
    weights = {init.name: list(init.dims) for init in model.graph.initializer}
    total = 0
    for node in model.graph.node:
        if node.op_type in ("MatMul", "Gemm") and len(node.input) > 1 and node.input[1] in weights:
            total += 2 * math.prod(weights[node.input[1]])
    return total


def _signature(value: onnx.ValueInfoProto) -> dict:
    tensor = value.type.tensor_type
    shape = [d.dim_param if d.HasField("dim_param") else d.dim_value for d in tensor.shape.dim]
    return {"name": value.name, "datatype": _DATATYPES.get(tensor.elem_type, str(tensor.elem_type)), "shape": shape}


_DATATYPES = {
    onnx.TensorProto.FLOAT: "FP32", onnx.TensorProto.FLOAT16: "FP16", onnx.TensorProto.DOUBLE: "FP64",
    onnx.TensorProto.INT64: "INT64", onnx.TensorProto.INT32: "INT32", onnx.TensorProto.INT16: "INT16",
    onnx.TensorProto.INT8: "INT8", onnx.TensorProto.UINT8: "UINT8", onnx.TensorProto.UINT16: "UINT16",
    onnx.TensorProto.UINT32: "UINT32", onnx.TensorProto.UINT64: "UINT64", onnx.TensorProto.BOOL: "BOOL",
}


def load_metadata(model_dir: Path) -> dict:
    """Read a model folder's metadata.json."""
    path = Path(model_dir) / METADATA_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist; run `latlab export` first") from None
