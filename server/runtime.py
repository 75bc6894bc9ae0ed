"""A deployment's ONNX model: its signature, input validation, and runs on the host or through I/O binding.

On CPU a run is a plain `session.run` on the request's numpy arrays (ORT reads them in place: there is no
transfer to time). On CUDA and TensorRT the inputs are copied to the device once, outputs stay bound on the
device and only the requested ones are copied back, each step timed apart (`RunTimings`). With
`enable_cuda_graph` the inputs and outputs live in fixed device buffers a captured graph replays.

Pinned host buffers are not used: request tensors arrive as pageable numpy arrays decoded from the body,
so staging them in pinned memory would add a host copy to save part of a DMA; for the tensors served here
(kilobytes to a few MB) the copy's fixed latency, not bandwidth, should dominate (reasoned, not measured:
no GPU was available; measure before adding them). String (BYTES) tensors cannot be
bound to a device by ORT, so models with any run through `session.run` on every provider.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Set
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from latlab.server.config import DeploymentConfig
from latlab.server.errors import BadRequest, ConfigError
from latlab.server.protocol import datatype_of, shown
from latlab.server.providers import create_session, provider_load_error  # noqa: F401  (re-exported)

# ORT's type strings for the tensor element types we serve; strings are numpy object arrays.
_ORT_TYPES = {
    "tensor(bool)": np.bool_, "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32, "tensor(uint64)": np.uint64, "tensor(int8)": np.int8,
    "tensor(int16)": np.int16, "tensor(int32)": np.int32, "tensor(int64)": np.int64,
    "tensor(float16)": np.float16, "tensor(float)": np.float32, "tensor(double)": np.float64,
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


@dataclass(frozen=True)
class RunTimings:
    """Where one bound run's time went: host-to-device copy, the run itself, device-to-host copy."""

    input_s: float
    compute_s: float
    output_s: float


def _spec(node: ort.NodeArg) -> TensorSpec:
    if node.type not in _ORT_TYPES:
        raise ConfigError(f"tensor '{node.name}' has type {node.type}, which this server does not serve")
    shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in node.shape)
    return TensorSpec(node.name, np.dtype(_ORT_TYPES[node.type]), shape)


class OnnxModel:
    """One ONNX Runtime session on the deployment's provider, refusing to start on a silent fallback."""

    def __init__(self, deployment: DeploymentConfig) -> None:
        self.deployment = deployment
        self.session = create_session(deployment)
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
        self._graph = CudaGraphRunner(self) if deployment.cuda.enable_cuda_graph and self.bound else None
        if deployment.cuda.enable_cuda_graph and self.device != "cpu" and self._graph is None:
            raise ConfigError(f"deployment '{deployment.name}': enable_cuda_graph needs I/O binding, which "
                              "models with string tensors cannot use")

    def run(self, inputs: dict[str, np.ndarray], outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        """Run one (batched) forward pass; `outputs` names the outputs to return (None: all)."""
        return self.run_timed(inputs, outputs)[0]

    def run_timed(self, inputs: dict[str, np.ndarray], outputs: list[str] | None = None
                  ) -> tuple[dict[str, np.ndarray], RunTimings | None]:
        """A run and, on a device, where its time went (None on the host: nothing is transferred)."""
        names = self._output_names if outputs is None else list(outputs)
        if self._graph is not None:
            return self._graph.run(inputs, names)
        if self.bound:
            return run_bound(self.session, inputs, names, self.device, self.deployment.cuda.device_id)
        if self._string_inputs:
            inputs = {name: _to_ort(array) for name, array in inputs.items()}
        results = self.session.run(names, inputs)
        return dict(zip(names, results)), None

    def warmup_batches(self, max_batch_size: int, length: int = WARMUP_LENGTH) -> Iterator[dict[str, np.ndarray]]:
        """Zero inputs for every batch size the batcher can form (1..max_batch_size; only the model's own
        size when its batch dimension is fixed); other dynamic dimensions get `length`."""
        fixed = {spec.shape[0] for spec in self.inputs if spec.shape and spec.shape[0] != -1}
        sizes = sorted(fixed) if fixed else range(1, max_batch_size + 1)
        for size in sizes:
            yield {spec.name: _zeros((size, *(length if d == -1 else d for d in spec.shape[1:])), spec.dtype)
                   for spec in self.inputs if spec.shape}

    def validate(self, inputs: dict[str, np.ndarray], finite: Set[str] = frozenset()) -> int:
        """Check a request's inputs against the signature before it is queued; returns its batch size.
        A bad request fails here, alone, instead of failing the batch it would have joined.
        NaN and ±Inf in floating-point inputs are refused unless the deployment allows them; the inputs
        named in `finite` are known to hold neither (decoded from JSON) and are not searched again."""
        expected = self._input_names
        if inputs.keys() != expected:
            missing, unknown = sorted(expected - set(inputs)), sorted(shown(n) for n in set(inputs) - expected)
            raise BadRequest(f"model '{self.deployment.name}' takes inputs {sorted(expected)}; "
                             f"missing {missing}, unknown {unknown}")
        batch = None
        for spec, fixed in zip(self.inputs, self._fixed_dims):
            array = inputs[spec.name]
            if array.dtype != spec.dtype:
                raise BadRequest(f"input '{spec.name}' must be {spec.datatype}, got {datatype_of(array.dtype)}")
            shape = array.shape
            if len(shape) != len(spec.shape) or any(shape[axis] != size for axis, size in fixed):
                raise BadRequest(f"input '{spec.name}' must have shape {list(spec.shape)} (-1: any), "
                                 f"got {list(shape)}")
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
            raise BadRequest(f"input '{spec.name}' holds NaN or infinite values, which deployment "
                             f"'{self.deployment.name}' does not accept (allow_non_finite = false)")
        if spec.dtype == object:
            try:
                _to_ort(array)
            except UnicodeDecodeError as exc:
                # ORT's strings come from Python str: bytes that are not UTF-8 have no faithful form.
                raise BadRequest(f"input '{spec.name}' holds an element that is not UTF-8 text ({exc.reason} "
                                 f"at byte {exc.start}); this model's string inputs take UTF-8") from None

    def metadata(self) -> dict:
        """The protocol's model metadata."""
        return {
            "name": self.deployment.name,
            "versions": ["1"],
            "platform": "onnxruntime_onnx",
            "inputs": [spec.metadata() for spec in self.inputs],
            "outputs": [spec.metadata() for spec in self.outputs],
        }


def _zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    if dtype == object:
        return np.full(shape, "", dtype=object)
    return np.zeros(shape, dtype=dtype)


def _to_ort(array: np.ndarray) -> np.ndarray:
    """ORT reads a bytes element as its repr ("b'..'"): string tensors are handed over as str."""
    if array.dtype != object or not any(isinstance(item, bytes) for item in array.flat):
        return array
    return np.array([item.decode("utf-8") if isinstance(item, bytes) else item for item in array.flat],
                    dtype=object).reshape(array.shape)


def run_bound(session: ort.InferenceSession, inputs: dict[str, np.ndarray], outputs: list[str],
              device: str, device_id: int) -> tuple[dict[str, np.ndarray], RunTimings]:
    """One run through I/O binding: inputs copied to `device` once, the requested outputs bound there and
    copied to the host after the run. Works with device "cpu" too (no copies), which is how it is tested
    off a GPU box."""
    binding = session.io_binding()
    started = time.perf_counter()
    on_device = [ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), device, device_id)
                 for array in inputs.values()]
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


class CudaGraphRunner:
    """Runs a model captured as a CUDA graph: fixed-shape device buffers for every input and output,
    bound once; a run copies the inputs into them, replays the graph and copies the outputs out."""

    def __init__(self, model: OnnxModel, device: str = "cuda") -> None:
        config = model.deployment
        dynamic = [s.name for s in (*model.inputs, *model.outputs) if -1 in s.shape[1:] or not s.shape]
        if dynamic:
            raise ConfigError(f"deployment '{config.name}': enable_cuda_graph needs fixed shapes, but "
                              f"{dynamic} have dynamic dimensions besides the batch")
        self._session = model.session
        device_id = config.cuda.device_id

        def buffer(spec: TensorSpec) -> ort.OrtValue:
            shape = [1 if spec.shape[0] == -1 else spec.shape[0], *spec.shape[1:]]
            return ort.OrtValue.ortvalue_from_shape_and_type(shape, spec.dtype.type, device, device_id)

        self._inputs = {spec.name: buffer(spec) for spec in model.inputs}
        self._outputs = {spec.name: buffer(spec) for spec in model.outputs}
        self._binding = model.session.io_binding()
        self._lock = threading.Lock()  # one set of buffers: batches in flight (instances > 1) take turns
        for name, value in self._inputs.items():
            self._binding.bind_ortvalue_input(name, value)
        for name, value in self._outputs.items():
            self._binding.bind_ortvalue_output(name, value)

    def run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> tuple[dict[str, np.ndarray], RunTimings]:
        with self._lock:
            started = time.perf_counter()
            for name, array in inputs.items():
                self._inputs[name].update_inplace(np.ascontiguousarray(array))
            copied_in = time.perf_counter()
            self._session.run_with_iobinding(self._binding)
            computed = time.perf_counter()
            results = {name: self._outputs[name].numpy() for name in outputs}
        return results, RunTimings(copied_in - started, computed - copied_in, time.perf_counter() - computed)
