"""A deployment's ONNX model: its signature, input validation, and runs on the host or through I/O binding.

On CPU a run is a plain `session.run` on the request's numpy arrays (ORT reads them in place: there is no
transfer to time). On CUDA and TensorRT the inputs are copied to the device once, outputs stay bound on the
device and only the requested ones are copied back, each step timed apart (`RunTimings`). With
`enable_cuda_graph` the inputs and outputs live in fixed device buffers a captured graph replays.

Pinned host buffers are not used: request tensors arrive as pageable numpy arrays decoded from the body,
so staging them in pinned memory would add a host copy to save part of a DMA; for the tensors served here
(kilobytes to a few MB) the copy's fixed latency, not bandwidth, should dominate (reasoned, not yet measured
on a GPU; measure before adding them). String (BYTES) tensors cannot be
bound to a device by ORT, so models with any run through `session.run` on every provider.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator, Set
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from latlab.server.config import DeploymentConfig
from latlab.server.errors import BadRequest, ConfigError
from latlab.server.protocol import datatype_of, shown
from latlab.server.runtime.buckets import bucket_for, capture_refusal, cut_rows, has_conv, pad_rows, session_mode
from latlab.server.runtime.graphs import GRAPH_WARMUP_RUNS, CudaGraphRunner, RunTimings
from latlab.server.runtime.providers import create_session

__all__ = ["CudaGraphRunner", "OnnxModel", "RunTimings", "TensorSpec", "run_bound"]
log = logging.getLogger("latlab.server.runtime.model")

# ORT's type strings for the tensor element types we serve; strings are numpy object arrays.
_ORT_TYPES = {
    "tensor(bool)": np.bool_,
    "tensor(uint8)": np.uint8,
    "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64,
    "tensor(int8)": np.int8,
    "tensor(int16)": np.int16,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(float16)": np.float16,
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(string)": np.object_,
}
WARMUP_LENGTH = 8
"""Size given to dynamic dimensions other than the batch during warm-up (a short sequence)."""


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output: name, numpy dtype and shape with -1 for dynamic dimensions."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def datatype(self) -> str:
        return datatype_of(self.dtype)

    def metadata(self) -> dict:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


def _spec(node: ort.NodeArg) -> TensorSpec:
    if node.type not in _ORT_TYPES:
        raise ConfigError(f"tensor '{node.name}' has type {node.type}, which this server does not serve")
    shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in node.shape)
    return TensorSpec(node.name, np.dtype(_ORT_TYPES[node.type]), shape)


class OnnxModel:
    """A deployment's ONNX Runtime session(s) on its provider, refusing to start on a silent fallback.

    With batch buckets a run is padded up to its bucket and cut back; each bucket runs on the shared
    session, on its own session (`bucket_mode` "per_bucket") or as its own captured CUDA graph
    ("cuda_graph")."""

    def __init__(self, deployment: DeploymentConfig) -> None:
        self.deployment = deployment
        self.session, self.graph_refused = open_session(deployment)
        """The session, and why CUDA graphs are off although enable_cuda_graph asked for them (or None)."""
        self.inputs = [_spec(i) for i in self.session.get_inputs()]
        self.outputs = [_spec(o) for o in self.session.get_outputs()]
        self._output_names = [o.name for o in self.outputs]
        self._input_names = frozenset(spec.name for spec in self.inputs)
        # Per input, the dimensions the model fixes: (axis, size).
        self._fixed_dims = [[(axis, d) for axis, d in enumerate(spec.shape) if d != -1] for spec in self.inputs]
        self._string_inputs = any(spec.dtype == object for spec in self.inputs)
        has_strings = self._string_inputs or any(spec.dtype == object for spec in self.outputs)
        self.device = "cpu" if deployment.provider == "cpu" else "cuda"
        self.bound = self.device != "cpu" and not has_strings
        """Whether runs go through I/O binding (CUDA and TensorRT, unless the model has string tensors)."""
        fixed = {spec.shape[0] for spec in self.inputs if spec.shape and spec.shape[0] != -1}
        self.buckets: tuple[int, ...] = tuple(sorted(fixed)) if fixed else deployment.batcher.batch_buckets
        """The batch sizes runs are padded to (empty: none; a fixed batch dimension is its own only bucket)."""
        self._graph = self._graph_runner(has_strings) if self.graph_refused is None else None
        self.bucket_mode = (
            "cuda_graph"
            if self._graph
            else session_mode(
                deployment.provider,
                deployment.batcher.bucket_sessions,
                self.buckets,
                lambda: has_conv(deployment.model_path),
            )
        )
        """How buckets run: "off" (no buckets), "shared", "per_bucket" or "cuda_graph"."""
        self._sessions = (
            {size: self.session if i == 0 else create_session(deployment) for i, size in enumerate(self.buckets)}
            if self.bucket_mode == "per_bucket"
            else {}
        )
        if self.buckets:
            log.info(
                "deployment '%s': batch buckets %s, run %s",
                deployment.name,
                list(self.buckets),
                {
                    "shared": "on one session",
                    "per_bucket": "on one session each",
                    "cuda_graph": "as one CUDA graph each",
                }[self.bucket_mode],
            )

    def _graph_runner(self, has_strings: bool) -> CudaGraphRunner | None:
        """One graph per bucket when the deployment asks for CUDA graphs on CUDA and the model allows them."""
        config = self.deployment
        if not (config.cuda.enable_cuda_graph and config.provider == "cuda"):
            return None
        dynamic = [s.name for s in (*self.inputs, *self.outputs) if not s.shape or -1 in s.shape[1:]]
        why = capture_refusal(config.model_path, dynamic, has_strings)
        if why is not None:  # found after the session was made with graphs on: make it again without
            self.session, self.graph_refused = _without_graphs(config, why), why
            return None
        specs = lambda specs: [(s.name, s.dtype, s.shape) for s in specs]  # noqa: E731
        return CudaGraphRunner(
            self.session,
            specs(self.inputs),
            specs(self.outputs),
            self.buckets or (config.batcher.max_batch_size,),
            "cuda",
            config.cuda.device_id,
        )

    def bucket_for(self, rows: int) -> int:
        """The batch size a batch of `rows` runs at (padded rows = the difference)."""
        return bucket_for(rows, self.buckets)

    def run(self, inputs: dict[str, np.ndarray], outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        """Run one (batched) forward pass; `outputs` names the outputs to return (None: all)."""
        return self.run_timed(inputs, outputs)[0]

    def run_timed(
        self, inputs: dict[str, np.ndarray], outputs: list[str] | None = None
    ) -> tuple[dict[str, np.ndarray], RunTimings | None]:
        """A run and, on a device, where its time went (None on the host: nothing is transferred). A batch is
        padded up to its bucket and the padded rows cut from the outputs."""
        names = self._output_names if outputs is None else list(outputs)
        rows = _rows(inputs)
        bucket = self.bucket_for(rows) if rows else rows
        if bucket != rows:
            inputs = pad_rows(inputs, bucket)
        results, timings = self._run_at(bucket, inputs, names)
        return (cut_rows(results, rows) if bucket != rows else results), timings

    def _run_at(
        self, bucket: int, inputs: dict[str, np.ndarray], names: list[str]
    ) -> tuple[dict[str, np.ndarray], RunTimings | None]:
        if self._graph is not None:
            return self._graph.run(inputs, names)
        session = self._sessions.get(bucket, self.session)
        if self.bound:
            return run_bound(session, inputs, names, self.device, self.deployment.cuda.device_id)
        if self._string_inputs:
            inputs = {name: _to_ort(array) for name, array in inputs.items()}
        results = session.run(names, inputs)
        return dict(zip(names, results)), None

    def warmup_batches(self, max_batch_size: int, length: int = WARMUP_LENGTH) -> Iterator[dict[str, np.ndarray]]:
        """Zero inputs for every batch size a run can have: each bucket (the model's own size when its batch
        dimension is fixed), else 1..max_batch_size; other dynamic dimensions get `length`. With CUDA graphs
        each bucket comes GRAPH_WARMUP_RUNS times, so its graph is captured before ready."""
        sizes = self.buckets or range(1, max_batch_size + 1)
        repeats = GRAPH_WARMUP_RUNS if self._graph is not None else 1
        for size in sizes:
            for _ in range(repeats):
                yield {
                    spec.name: _zeros((size, *(length if d == -1 else d for d in spec.shape[1:])), spec.dtype)
                    for spec in self.inputs
                    if spec.shape
                }

    def bucket_runs(self) -> dict:
        """How this deployment's runs are made: its buckets, how they run, sessions held, CUDA graphs."""
        graphs = "per bucket" if self._graph else (f"off: {self.graph_refused}" if self.graph_refused else "off")
        return {
            "batch_buckets": list(self.buckets),
            "bucket_mode": self.bucket_mode,
            "sessions": len(self._sessions) or 1,
            **({"cuda_graph": graphs} if self.device != "cpu" else {}),
        }

    def precision(self) -> dict:
        """On a device, the precision and cuDNN choices in force (stated even at ORT's defaults); {} on cpu."""
        if self.device == "cpu":
            return {}
        cuda = self.deployment.cuda
        return {
            "use_tf32": cuda.use_tf32,
            "cudnn_conv_algo_search": cuda.cudnn_conv_algo_search,
            "fuse_conv_bias": cuda.fuse_conv_bias,
        }

    def validate(self, inputs: dict[str, np.ndarray], finite: Set[str] = frozenset()) -> int:
        """Check a request's inputs against the signature before it is queued; returns its batch size.
        A bad request fails here, alone, instead of failing the batch it would have joined.
        NaN and ±Inf in floating-point inputs are refused unless the deployment allows them; the inputs
        named in `finite` are known to hold neither (decoded from JSON) and are not searched again."""
        expected = self._input_names
        if inputs.keys() != expected:
            missing, unknown = sorted(expected - set(inputs)), sorted(shown(n) for n in set(inputs) - expected)
            raise BadRequest(
                f"model '{self.deployment.name}' takes inputs {sorted(expected)}; missing {missing}, unknown {unknown}"
            )
        batch = None
        for spec, fixed in zip(self.inputs, self._fixed_dims):
            array = inputs[spec.name]
            if array.dtype != spec.dtype:
                raise BadRequest(f"input '{spec.name}' must be {spec.datatype}, got {datatype_of(array.dtype)}")
            shape = array.shape
            if len(shape) != len(spec.shape) or any(shape[axis] != size for axis, size in fixed):
                raise BadRequest(f"input '{spec.name}' must have shape {list(spec.shape)} (-1: any), got {list(shape)}")
            if not shape or shape[0] < 1:
                raise BadRequest(f"input '{spec.name}' needs a batch dimension of at least 1")
            if batch is not None and shape[0] != batch:
                raise BadRequest(f"inputs disagree on the batch dimension ({batch} vs {shape[0]})")
            batch = shape[0]
            if spec.name not in finite:
                self._check_values(spec, array)
        return batch

    def _check_values(self, spec: TensorSpec, array: np.ndarray) -> None:
        if spec.dtype.kind == "f" and not self.deployment.allow_non_finite and not np.isfinite(array).all():
            raise BadRequest(
                f"input '{spec.name}' holds NaN or infinite values, which deployment "
                f"'{self.deployment.name}' does not accept (allow_non_finite = false)"
            )
        if spec.dtype == object:
            try:
                _to_ort(array)
            except UnicodeDecodeError as exc:
                # ORT's strings come from Python str: bytes that are not UTF-8 have no faithful form.
                raise BadRequest(
                    f"input '{spec.name}' holds an element that is not UTF-8 text ({exc.reason} "
                    f"at byte {exc.start}); this model's string inputs take UTF-8"
                ) from None

    def metadata(self) -> dict:
        """The protocol's model metadata."""
        return {
            "name": self.deployment.name,
            "versions": ["1"],
            "platform": "onnxruntime_onnx",
            "inputs": [spec.metadata() for spec in self.inputs],
            "outputs": [spec.metadata() for spec in self.outputs],
        }


def open_session(deployment: DeploymentConfig) -> tuple[ort.InferenceSession, str | None]:
    """The deployment's session, and why CUDA graphs are off although it asked for them (None otherwise).
    A model with control flow is found before ORT is asked; nodes ORT places off CUDA when it refuses."""
    if not (deployment.cuda.enable_cuda_graph and deployment.provider == "cuda"):
        return create_session(deployment), None
    why = capture_refusal(deployment.model_path, (), False)
    if why is None:
        try:
            return create_session(deployment), None
        except ConfigError as exc:
            if "graph capture" not in str(exc):
                raise
            why = f"ONNX Runtime refused it ({str(exc).split(': ', 1)[-1]})"
    return _without_graphs(deployment, why), why


def _without_graphs(deployment: DeploymentConfig, why: str) -> ort.InferenceSession:
    """A session without CUDA graphs when the config allows serving so (said in the log), else ConfigError."""
    if not deployment.cuda.cuda_graph_fallback:
        raise ConfigError(
            f"deployment '{deployment.name}': enable_cuda_graph cannot capture {deployment.model_path}"
            f": {why}; set [cuda] cuda_graph_fallback = true to serve it without graphs"
        )
    log.warning("deployment '%s': served without CUDA graphs: %s", deployment.name, why)
    cuda = dataclasses.replace(deployment.cuda, enable_cuda_graph=False)
    return create_session(dataclasses.replace(deployment, cuda=cuda))


def _rows(inputs: dict[str, np.ndarray]) -> int:
    """A batch's rows (its inputs' first dimension); 0 when no input has a batch axis."""
    return next((array.shape[0] for array in inputs.values() if array.ndim), 0)


def _zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    if dtype == np.dtype(object):
        return np.full(shape, "", dtype=object)
    return np.zeros(shape, dtype=dtype)


def _to_ort(array: np.ndarray) -> np.ndarray:
    """ORT reads a bytes element as its repr ("b'..'"): string tensors are handed over as str."""
    if array.dtype != object or not any(isinstance(item, bytes) for item in array.flat):
        return array
    return np.array(
        [item.decode("utf-8") if isinstance(item, bytes) else item for item in array.flat], dtype=object
    ).reshape(array.shape)


def run_bound(
    session: ort.InferenceSession, inputs: dict[str, np.ndarray], outputs: list[str], device: str, device_id: int
) -> tuple[dict[str, np.ndarray], RunTimings]:
    """One run through I/O binding: inputs copied to `device` once, the requested outputs bound there and
    copied to the host after the run. Works with device "cpu" too (no copies), which is how it is tested
    off a GPU box."""
    binding = session.io_binding()
    started = time.perf_counter()
    on_device = [
        ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), device, device_id) for array in inputs.values()
    ]
    for name, value in zip(inputs, on_device):
        binding.bind_ortvalue_input(name, value)
    binding.synchronize_inputs()
    copied_in = time.perf_counter()
    for name in outputs:
        binding.bind_output(name, device, device_id)
    session.run_with_iobinding(binding)  # ORT synchronises the device at the end of a run
    computed = time.perf_counter()
    results = [value.numpy() for value in binding.get_outputs()]
    finished = time.perf_counter()
    return dict(zip(outputs, results)), RunTimings(copied_in - started, computed - copied_in, finished - computed)
