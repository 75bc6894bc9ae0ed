"""The user's own models: a PyTorch factory (`package.module:factory`) or an existing .onnx file."""

from __future__ import annotations

import importlib
import math
import os
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from latlab.export.onnx_export import (
    EXTERNAL_DATA_THRESHOLD,
    MODEL_FILE,
    ExportError,
    describe,
    save,
    staged,
    write_metadata,
)
from latlab.export.zoo_model import ZooModel

NO_PARITY = "not applicable (no PyTorch source)"
# sizes given to symbolic non-batch axes (a sequence) when the adopted model is run once to prove it loads
SMOKE_AXIS_SIZE = 8


def load_factory(spec: str) -> ZooModel:
    """Call `package.module:factory`; it returns (module, {name: example tensor, batch first}[, output names])."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ExportError(f"--module {spec!r}: write package.module:factory")
    if os.getcwd() not in sys.path:  # `latlab` is a console script: make the user's folder importable, like python -m
        sys.path.insert(0, os.getcwd())
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except ImportError as exc:
        raise ExportError(f"--module {spec!r}: cannot import {module_name}: {exc}") from None
    except AttributeError:
        raise ExportError(f"--module {spec!r}: {module_name} has no attribute {attr!r}") from None
    result = factory()
    if not isinstance(result, tuple) or len(result) not in (2, 3):
        raise ExportError(
            f"--module {spec!r}: the factory must return (module, inputs) or (module, inputs, output names)"
        )
    module, inputs = result[0], result[1]
    if not isinstance(module, nn.Module):
        raise ExportError(
            f"--module {spec!r}: the factory's first value is a {type(module).__name__}, not an nn.Module"
        )
    if (
        not isinstance(inputs, dict)
        or not inputs
        or not all(isinstance(k, str) and isinstance(v, torch.Tensor) and v.dim() >= 1 for k, v in inputs.items())
    ):
        raise ExportError(f"--module {spec!r}: example inputs must be a non-empty dict of name -> tensor, batch first")
    module = module.eval()
    names = list(result[2]) if len(result) == 3 else _output_names(module, inputs)
    return ZooModel(module, dict(inputs), names, {"module": spec})


def _output_names(module: nn.Module, inputs: dict[str, torch.Tensor]) -> list[str]:
    with torch.no_grad():
        out = module(*inputs.values())
    count = 1 if isinstance(out, torch.Tensor) else len(out)
    return ["y"] if count == 1 else [f"y{i}" for i in range(count)]


def adopt_onnx(
    src: Path,
    name: str,
    models_dir: Path,
    *,
    allow_fixed_batch: bool = False,
    external_data_threshold: int = EXTERNAL_DATA_THRESHOLD,
) -> dict:
    """Copy an existing ONNX file into models_dir/name/, check it and describe it in metadata.json.

    The first axis of every input must be dynamic (the batcher stacks requests along it) unless
    allow_fixed_batch: then the metadata says so and such a model can only be served with max_batch_size 1."""
    src = Path(src)
    if not src.is_file():
        raise FileNotFoundError(f"--onnx: {src} does not exist")
    try:
        onnx.checker.check_model(str(src), full_check=True)
        model = onnx.load(str(src))  # with any external data, from beside the file
    except Exception as exc:  # protobuf DecodeError, ValidationError, missing external data ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExportError(f"--onnx: {src} is not a valid ONNX model: {first}") from None
    info = describe(model)
    fixed = [i["name"] for i in info["inputs"] if not i["shape"] or not isinstance(i["shape"][0], str)]
    if fixed and not allow_fixed_batch:
        raise ExportError(
            f"--onnx: {src}: the first axis of input(s) {', '.join(fixed)} is fixed, but the batcher "
            f"stacks requests along it; re-export with a dynamic batch axis, or pass "
            f"--allow-fixed-batch to serve it with max_batch_size = 1"
        )
    with staged(Path(models_dir) / name) as scratch:
        metadata = _write(model, info, src, name, scratch, fixed, external_data_threshold)
    return metadata


def _write(
    model: onnx.ModelProto,
    info: dict,
    src: Path,
    name: str,
    out_dir: Path,
    fixed: list[str],
    external_data_threshold: int,
) -> dict:
    external = save(model, out_dir / MODEL_FILE, external_data_threshold)
    metadata = {
        "name": name,
        "source": f"adopted ONNX file {src.resolve()}",
        "config": {"onnx": str(src.resolve())},
        **info,
        "params": info["params_in_initializers"],
        "external_data": external,
        "batch_dynamic": not fixed,
        "parity": NO_PARITY,
        "cpu_smoke_run": _smoke_run(out_dir / MODEL_FILE),
    }
    if fixed:
        metadata["warning"] = f"fixed first axis in {', '.join(fixed)}: serve with max_batch_size = 1"
    write_metadata(out_dir, metadata)
    return metadata


def _smoke_run(path: Path) -> str:
    """Run the model once on random inputs (batch 1) with ORT's CPU provider, to prove it loads and runs."""
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        feeds = {}
        for arg in session.get_inputs():
            shape = [d if isinstance(d, int) else (1 if i == 0 else SMOKE_AXIS_SIZE) for i, d in enumerate(arg.shape)]
            dtype = _NUMPY.get(arg.type, np.float32)
            feeds[arg.name] = (
                rng.standard_normal(shape) if np.issubdtype(dtype, np.floating) else np.zeros(shape)
            ).astype(dtype)
        outputs = session.run(None, feeds)
    except Exception as exc:  # the model may need another provider; say so, it is still adopted
        return f"failed: {str(exc).strip().splitlines()[0][:300]}"
    return f"ok: {len(outputs)} output(s), {sum(math.prod(o.shape) for o in outputs)} values at batch 1"


_NUMPY = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}
