"""ONNX Runtime sessions from a deployment's settings: session options, provider options, no silent fallback."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import io
import logging
from pathlib import Path

import onnxruntime as ort

from latlab.common.settings import CpuOptions, CudaOptions, TensorrtOptions
from latlab.server.config import DeploymentConfig
from latlab.server.errors import ConfigError, one_line

PROVIDER_NAMES = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}
_PROVIDER_LIBRARIES = {"CUDAExecutionProvider": "cuda", "TensorrtExecutionProvider": "tensorrt"}
_OPTIMIZATION = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
_EXECUTION = {"sequential": ort.ExecutionMode.ORT_SEQUENTIAL, "parallel": ort.ExecutionMode.ORT_PARALLEL}
_ARENA = {"next_power_of_two": "kNextPowerOfTwo", "same_as_requested": "kSameAsRequested"}
log = logging.getLogger("latlab.server.runtime.providers")


@functools.cache
def preload_cuda_libraries() -> None:
    """Load the CUDA and cuDNN libraries of pip's nvidia-* packages before a CUDA session, as ONNX Runtime's
    `preload_dlls` does (ORT >= 1.21): otherwise its CUDA provider finds them only when torch was imported
    first or LD_LIBRARY_PATH names them. What it prints goes to the log; a library still missing is named
    by provider_load_error."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is None:
        return
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said):
            preload()
    except (OSError, RuntimeError) as exc:
        log.debug("onnxruntime.preload_dlls failed: %s", exc)
    if said.getvalue().strip():
        log.debug("onnxruntime.preload_dlls: %s", said.getvalue().strip())


def provider_load_error(provider: str) -> str | None:
    """Why ORT's shared library for a provider cannot load (e.g. the missing libcublasLt), or None."""
    short = _PROVIDER_LIBRARIES.get(provider)
    if short is None:
        return None
    preload_cuda_libraries()
    library = Path(ort.__file__).parent / "capi" / f"libonnxruntime_providers_{short}.so"
    if not library.exists():
        return f"this onnxruntime build has no {provider} ({library.name} absent)"
    try:
        ctypes.CDLL(str(library))
    except OSError as exc:
        return str(exc)  # names the first missing dependency, e.g. libcublasLt.so.13
    return None


def session_options(cpu: CpuOptions) -> ort.SessionOptions:
    """SessionOptions from a deployment's [cpu] table (they shape the CPU side of every provider)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = cpu.intra_op_threads
    options.inter_op_num_threads = cpu.inter_op_threads
    options.graph_optimization_level = _OPTIMIZATION[cpu.graph_optimization_level]
    options.execution_mode = _EXECUTION[cpu.execution_mode]
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if cpu.allow_spinning else "0")
    return options


def cuda_provider_options(cuda: CudaOptions) -> dict[str, str]:
    """The CUDA provider's option dictionary, in ORT's own key names and string values."""
    options = {
        "device_id": str(cuda.device_id),
        "cudnn_conv_algo_search": cuda.cudnn_conv_algo_search.upper(),
        "arena_extend_strategy": _ARENA[cuda.arena_extend_strategy],
        "do_copy_in_default_stream": "1" if cuda.copy_in_default_stream else "0",
        "enable_cuda_graph": "1" if cuda.enable_cuda_graph else "0",
        # Always stated, even at ORT's own defaults (TF32 on, no fusion): a results file says what ran.
        "use_tf32": "1" if cuda.use_tf32 else "0",
        "fuse_conv_bias": "1" if cuda.fuse_conv_bias else "0",
    }
    if cuda.gpu_mem_limit:
        options["gpu_mem_limit"] = str(cuda.gpu_mem_limit)
    return options


def tensorrt_provider_options(tensorrt: TensorrtOptions, device_id: int) -> dict[str, str]:
    """The TensorRT provider's option dictionary (it shares the CUDA table's device)."""
    options = {"device_id": str(device_id), "trt_fp16_enable": "1" if tensorrt.fp16 else "0"}
    if tensorrt.engine_cache_dir:
        options["trt_engine_cache_enable"] = "1"
        options["trt_engine_cache_path"] = tensorrt.engine_cache_dir
    if tensorrt.max_workspace_bytes:
        options["trt_max_workspace_size"] = str(tensorrt.max_workspace_bytes)
    return options


def provider_chain(deployment: DeploymentConfig) -> list[tuple[str, dict[str, str]]]:
    """The providers to ask ORT for, in order, with their options: the wanted one first, then the ones
    that run what it cannot (TensorRT -> CUDA -> CPU; CUDA -> CPU)."""
    cpu = ("CPUExecutionProvider", {})
    cuda = ("CUDAExecutionProvider", cuda_provider_options(deployment.cuda))
    if deployment.provider == "cuda":
        return [cuda, cpu]
    if deployment.provider == "tensorrt":
        tensorrt = tensorrt_provider_options(deployment.tensorrt, deployment.cuda.device_id)
        return [("TensorrtExecutionProvider", tensorrt), cuda, cpu]
    return [cpu]


def create_session(deployment: DeploymentConfig) -> ort.InferenceSession:
    """A session on the deployment's provider; ConfigError when the file is unusable or ORT fell back."""
    path = Path(deployment.model_path)
    if not path.is_file():
        raise ConfigError(f"deployment '{deployment.name}': model file {path} does not exist")
    wanted = PROVIDER_NAMES[deployment.provider]
    if provider_load_error(wanted):
        ort.set_default_logger_severity(4)  # the fallback is reported below, in one line, not as ORT's banner
    chain = provider_chain(deployment)
    try:
        session = ort.InferenceSession(
            str(path),
            session_options(deployment.cpu),
            providers=[name for name, _ in chain],
            provider_options=[options for _, options in chain],
        )
    except Exception as exc:  # ORT raises its own exception types for unreadable files and bad options
        raise ConfigError(f"deployment '{deployment.name}': cannot load {path}: {one_line(exc)}") from None
    check_no_fallback(deployment.name, wanted, session.get_providers())
    return session


def check_no_fallback(deployment: str, wanted: str, got: list[str]) -> None:
    """Refuse to serve under a false name: ORT falls back to CPU silently when CUDA or TensorRT cannot load."""
    if got and got[0] == wanted:
        return
    reason = provider_load_error(wanted) or "see `latlab doctor`"
    raise ConfigError(
        f"deployment '{deployment}' asked for {wanted} but ONNX Runtime fell back to "
        f"{got[0] if got else 'nothing'}: {reason}"
    )
