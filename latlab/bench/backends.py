"""Bench backends: ONNX files for bench points (cached) and timed callables for ORT / PyTorch on CPU / CUDA."""

from __future__ import annotations

import hashlib
import inspect
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import onnxruntime as ort
import onnxruntime.capi.onnxruntime_pybind11_state as ort_state
import torch
from onnx import TensorProto, helper, numpy_helper

from latlab.export import zoo as zoo_module
from latlab.export.zoo import FFN
from latlab.export.zoo_model import ZooModel
from latlab.server.runtime.providers import provider_load_error

BACKENDS = ("ort-cpu", "ort-cuda", "torch-cpu", "torch-cuda")
OPSET = 18
# Past this many weight bytes the protobuf nears its 2 GiB ceiling: weights go to a side file.
EXTERNAL_DATA_BYTES = 1 << 30
SEQ_LEN_PARAMS = ("seq_len", "seq_length", "sequence_length")


# What a point too big for the device raises (out of memory in PyTorch or ORT): recorded as a skip.
RUN_FAILURES: tuple[type[Exception], ...] = (
    RuntimeError,
    MemoryError,
    ort_state.Fail,
    ort_state.RuntimeException,
    ort_state.EPFail,
)


class BackendUnavailable(Exception):
    """The backend cannot run on this machine (no CUDA, provider failed to load)."""


@dataclass
class PointModel:
    """One benchmark model: the PyTorch module, one input row per name, and where its ONNX file lives."""

    module: torch.nn.Module
    row_inputs: dict[str, torch.Tensor]
    output_names: list[str]
    onnx_path: Path
    config: dict

    def inputs(self, batch: int) -> dict[str, torch.Tensor]:
        """The example row repeated `batch` times (valid token ids and masks stay valid)."""
        return {n: t.expand(batch, *t.shape[1:]).contiguous() for n, t in self.row_inputs.items()}


def ffn_model(d_model: int, n_layers: int, cache_dir: Path) -> PointModel:
    """Seed 003's toy with seeded weights, so the cached ONNX file holds the module's very weights."""
    torch.manual_seed(0)
    module = FFN(d_model, n_layers).eval()
    x = torch.randn(1, d_model, generator=torch.Generator().manual_seed(1))
    path = Path(cache_dir) / f"ffn-d{d_model}-L{n_layers}" / "model.onnx"
    return PointModel(module, {"x": x}, ["y"], path, {"d_model": d_model, "n_layers": n_layers})


def write_ffn_onnx(module: FFN, path: Path) -> None:
    """Write FFN as MatMul/Relu/Add per block. The dynamo exporter takes seconds at 128 blocks
    (minutes at the seed's 3840) and cannot write past 2 GiB; the graph is the same arithmetic."""
    nodes, weights, prev = [], [], "x"
    blocks = list(module.blocks)
    for i, block in enumerate(blocks):
        weight = block.ff[0].weight.detach().numpy().T  # Linear computes x @ W^T
        weights.append(numpy_helper.from_array(np.ascontiguousarray(weight), f"w{i}"))
        out = "y" if i == len(blocks) - 1 else f"h{i}"
        nodes += [
            helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
            helper.make_node("Relu", [f"m{i}"], [f"r{i}"]),
            helper.make_node("Add", [f"r{i}", prev], [out]),
        ]
        prev = out
    d_model = blocks[0].ff[0].in_features
    graph = helper.make_graph(
        nodes,
        "ffn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", d_model])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", d_model])],
        initializer=weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    external = sum(p.numel() for p in module.parameters()) * 4 > EXTERNAL_DATA_BYTES
    onnx.save_model(model, str(path), save_as_external_data=external, location=path.name + ".data")


def zoo_model(name: str, seq_len: int, cache_dir: Path) -> PointModel:
    """A zoo model built with its defaults (plus the sequence length where the builder takes one)."""
    builder = zoo_module.BUILDERS[name]
    params = inspect.signature(builder).parameters
    kwargs = {p: seq_len for p in SEQ_LEN_PARAMS if p in params}
    torch.manual_seed(0)
    zoo: ZooModel = builder(**kwargs)
    zoo.module.eval()
    rows = {n: t[:1] for n, t in zoo.inputs.items()}
    config = {**zoo.config, **({"seq_len": seq_len} if kwargs else {})}
    key = hashlib.sha1(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return PointModel(zoo.module, rows, zoo.output_names, Path(cache_dir) / f"zoo-{name}-{key}" / "model.onnx", config)


def ensure_onnx(point: PointModel, zoo_name: str | None = None) -> Path:
    """Write the point's ONNX file unless the cache already holds it (zoo models go through export())."""
    if point.onnx_path.exists():
        return point.onnx_path
    if zoo_name is None:
        write_ffn_onnx(point.module, point.onnx_path)  # type: ignore[arg-type]
    else:
        from latlab.export.onnx_export import export

        zoo = ZooModel(point.module, point.inputs(2), point.output_names)
        export(point.onnx_path.parent.name, zoo, point.onnx_path.parent.parent, source=f"latlab bench: {zoo_name}")
    return point.onnx_path


Runner = Callable[[], None]
Prepare = Callable[[int], Runner]


def make_runner(backend: str, point: PointModel, threads: int) -> Prepare:
    """Load the model on `backend` once; the result binds a batch size and returns a callable that runs
    one inference and returns only when the result is ready (CUDA work synchronised)."""
    factories = {"ort-cpu": _ort_cpu, "ort-cuda": _ort_cuda, "torch-cpu": _torch_cpu, "torch-cuda": _torch_cuda}
    return factories[backend](point, threads)


def _session_options(threads: int) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads  # 0 = ORT's default (one per physical core)
    options.log_severity_level = 3
    return options


def _numpy_inputs(point: PointModel, batch: int) -> dict[str, np.ndarray]:
    return {n: t.numpy() for n, t in point.inputs(batch).items()}


def _ort_cpu(point: PointModel, threads: int) -> Prepare:
    session = ort.InferenceSession(str(point.onnx_path), _session_options(threads), providers=["CPUExecutionProvider"])

    def prepare(batch: int) -> Runner:
        feeds = _numpy_inputs(point, batch)

        def run() -> None:
            session.run(point.output_names, feeds)

        return run

    return prepare


def ort_cuda_session(path: Path, threads: int) -> ort.InferenceSession:
    """A CUDA session, or BackendUnavailable when ORT fell back to CPU (it does so silently)."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise BackendUnavailable("this onnxruntime build has no CUDAExecutionProvider")
    reason = provider_load_error("CUDAExecutionProvider")  # loads pip's CUDA libraries first
    if reason:
        raise BackendUnavailable(f"CUDAExecutionProvider cannot load: {reason}")
    try:
        session = ort.InferenceSession(
            str(path), _session_options(threads), providers=["CUDAExecutionProvider", "CPUExecutionProvider"]
        )
    except Exception as exc:  # ORT raises its own Fail/RuntimeException types when CUDA libraries are missing
        raise BackendUnavailable(f"CUDAExecutionProvider failed: {str(exc).splitlines()[0]}") from None
    if session.get_providers()[0] != "CUDAExecutionProvider":
        raise BackendUnavailable("CUDAExecutionProvider did not load (ORT fell back to CPU)")
    return session


def _ort_cuda(point: PointModel, threads: int) -> Prepare:
    session = ort_cuda_session(point.onnx_path, threads)

    def prepare(batch: int) -> Runner:
        binding = session.io_binding()
        for name, array in _numpy_inputs(point, batch).items():
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array, "cuda", 0))
        for name in point.output_names:
            binding.bind_output(name, "cuda", 0)

        def run() -> None:
            binding.synchronize_inputs()
            session.run_with_iobinding(binding)
            binding.synchronize_outputs()

        return run

    return prepare


def _torch_cpu(point: PointModel, threads: int) -> Prepare:
    module = point.module.to("cpu")

    def prepare(batch: int) -> Runner:
        inputs = list(point.inputs(batch).values())

        def run() -> None:
            with torch.no_grad():
                module(*inputs)

        return run

    return prepare


def _torch_cuda(point: PointModel, threads: int) -> Prepare:
    if not torch.cuda.is_available():
        raise BackendUnavailable("torch.cuda.is_available() is False (CPU build of PyTorch or no device)")
    module = point.module.to("cuda")

    def prepare(batch: int) -> Runner:
        inputs = [t.to("cuda") for t in point.inputs(batch).values()]

        def run() -> None:
            with torch.no_grad():
                module(*inputs)
            torch.cuda.synchronize()

        return run

    return prepare


def gpu_name() -> str | None:
    """The first GPU's name (PyTorch's view, else nvidia-smi's: ORT can use a GPU a CPU-only torch cannot see)."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = [line.strip() for line in out.splitlines() if line.strip()]
    return names[0] if names else None


def release(point: PointModel) -> None:
    """Bring a module back from the GPU so the next point has the memory."""
    if torch.cuda.is_available():
        point.module.to("cpu")
        torch.cuda.empty_cache()
