"""ONNX Runtime sessions for deployments: provider setup, the model's signature and input validation."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from latlab.server.config import DeploymentConfig
from latlab.server.errors import BadRequest, ConfigError, one_line
from latlab.server.protocol import datatype_of, shown

# ORT's type strings for the tensor element types we serve.
_ORT_TYPES = {
    "tensor(bool)": np.bool_, "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32, "tensor(uint64)": np.uint64, "tensor(int8)": np.int8,
    "tensor(int16)": np.int16, "tensor(int32)": np.int32, "tensor(int64)": np.int64,
    "tensor(float16)": np.float16, "tensor(float)": np.float32, "tensor(double)": np.float64,
}
_PROVIDER_NAMES = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
_PROVIDER_LIBRARIES = {"CUDAExecutionProvider": "cuda", "TensorrtExecutionProvider": "tensorrt"}


def provider_load_error(provider: str) -> str | None:
    """Why ORT's shared library for a provider cannot load (e.g. the missing libcublasLt), or None."""
    short = _PROVIDER_LIBRARIES.get(provider)
    if short is None:
        return None
    library = Path(ort.__file__).parent / "capi" / f"libonnxruntime_providers_{short}.so"
    if not library.exists():
        return f"this onnxruntime build has no {provider} ({library.name} absent)"
    try:
        ctypes.CDLL(str(library))
    except OSError as exc:
        return str(exc)  # names the first missing dependency, e.g. libcublasLt.so.13
    return None


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
    """One ONNX Runtime session on the deployment's provider, refusing to start on a silent fallback."""

    def __init__(self, deployment: DeploymentConfig) -> None:
        self.deployment = deployment
        self.session = _create_session(deployment)
        self.inputs = [_spec(i) for i in self.session.get_inputs()]
        self.outputs = [_spec(o) for o in self.session.get_outputs()]
        self._output_names = [o.name for o in self.outputs]

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one (batched) forward pass."""
        results = self.session.run(self._output_names, inputs)
        return dict(zip(self._output_names, results))

    def validate(self, inputs: dict[str, np.ndarray]) -> int:
        """Check a request's inputs against the signature before it is queued; returns its batch size.
        A bad request fails here, alone, instead of failing the batch it would have joined.
        NaN and ±Inf in floating-point inputs are refused unless the deployment allows them."""
        expected = {spec.name for spec in self.inputs}
        if set(inputs) != expected:
            missing, unknown = sorted(expected - set(inputs)), sorted(shown(n) for n in set(inputs) - expected)
            raise BadRequest(f"model '{self.deployment.name}' takes inputs {sorted(expected)}; "
                             f"missing {missing}, unknown {unknown}")
        batch = None
        for spec in self.inputs:
            array = inputs[spec.name]
            if array.dtype != spec.dtype:
                raise BadRequest(f"input '{spec.name}' must be {spec.datatype}, got {datatype_of(array.dtype)}")
            if len(array.shape) != len(spec.shape) or any(
                    want not in (-1, got) for want, got in zip(spec.shape, array.shape)):
                raise BadRequest(f"input '{spec.name}' must have shape {list(spec.shape)} (-1: any), "
                                 f"got {list(array.shape)}")
            if not array.shape or array.shape[0] < 1:
                raise BadRequest(f"input '{spec.name}' needs a batch dimension of at least 1")
            if batch is not None and array.shape[0] != batch:
                raise BadRequest(f"inputs disagree on the batch dimension ({batch} vs {array.shape[0]})")
            batch = array.shape[0]
            if spec.dtype.kind == "f" and not self.deployment.allow_non_finite and not np.isfinite(array).all():
                raise BadRequest(f"input '{spec.name}' holds NaN or infinite values, which deployment "
                                 f"'{self.deployment.name}' does not accept (allow_non_finite = false)")
        return batch

    def metadata(self) -> dict:
        """The protocol's model metadata."""
        return {
            "name": self.deployment.name,
            "versions": ["1"],
            "platform": "onnxruntime_onnx",
            "inputs": [spec.metadata() for spec in self.inputs],
            "outputs": [spec.metadata() for spec in self.outputs],
        }


def _create_session(deployment: DeploymentConfig) -> ort.InferenceSession:
    path = Path(deployment.model_path)
    if not path.is_file():
        raise ConfigError(f"deployment '{deployment.name}': model file {path} does not exist")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = deployment.cpu.intra_op_threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if deployment.cpu.allow_spinning else "0")
    wanted = _PROVIDER_NAMES[deployment.provider]
    if provider_load_error(wanted):
        ort.set_default_logger_severity(4)  # the fallback is reported below, in one line, not as ORT's banner
    providers = [wanted] if wanted == "CPUExecutionProvider" else [wanted, "CPUExecutionProvider"]
    try:
        session = ort.InferenceSession(str(path), options, providers=providers)
    except Exception as exc:  # ORT raises its own exception types for unreadable files
        raise ConfigError(f"deployment '{deployment.name}': cannot load {path}: {one_line(exc)}") from None
    if session.get_providers()[0] != wanted:
        # ORT falls back to CPU silently when CUDA cannot load; we refuse to serve under a false name.
        reason = provider_load_error(wanted) or "see `latlab doctor`"
        raise ConfigError(f"deployment '{deployment.name}' asked for {wanted} but ONNX Runtime fell back to "
                          f"{session.get_providers()[0]}: {reason}")
    return session
