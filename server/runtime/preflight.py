"""Checks `latlab serve` makes in the parent before any worker starts: one line per broken deployment.

Each model file must exist, parse as an ONNX model (the protobuf only: no session is created, so the
check costs one read of the file), and its provider's library must load. What only a real session can
find (an operator ONNX Runtime lacks) still fails in the worker, with the same kind of message.
"""

from __future__ import annotations

import logging
from pathlib import Path

from latlab.server.config import DeploymentConfig, ServerConfig
from latlab.server.errors import ConfigError

log = logging.getLogger("latlab.server.runtime.preflight")
_PROVIDER = {"cuda": ["CUDAExecutionProvider"], "tensorrt": ["TensorrtExecutionProvider", "CUDAExecutionProvider"]}
"""The libraries each device provider needs (TensorRT runs what it cannot on CUDA)."""


def deployment_problem(deployment: DeploymentConfig) -> str | None:
    """Why this deployment cannot start, naming its file and the cause; None when it looks loadable."""
    path = Path(deployment.model_path)
    where = f"deployment '{deployment.name}': model file {path}"
    if not path.is_file():
        return f"{where} does not exist"
    problem = _onnx_problem(path)
    if problem:
        return f"{where} {problem}"
    for provider in _PROVIDER.get(deployment.provider, []):
        from latlab.server.runtime.providers import provider_load_error  # imports onnxruntime: only when needed

        reason = provider_load_error(provider)
        if reason:
            return f"{where} needs provider {deployment.provider}, which cannot load: {reason}"
    return None


def _onnx_problem(path: Path) -> str | None:
    import onnx

    try:
        model = onnx.load_model(str(path), load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError, or onnx's own errors for odd files
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return f"is not a valid ONNX model: {first}"
    if not model.graph.node and not model.graph.output:
        return "is not a valid ONNX model: it has no graph"
    return None


def check_deployments(config: ServerConfig) -> list[str]:
    """Raise ConfigError on the first broken deployment under on_load_failure = "fail"; under "skip",
    log and return the problems, and raise only when no deployment is left to serve."""
    problems = []
    for deployment in config.deployments:
        problem = deployment_problem(deployment)
        if problem and config.on_load_failure == "fail":
            raise ConfigError(problem)
        if problem:
            log.error('%s; serving the other deployments (on_load_failure = "skip")', problem)
            problems.append(problem)
    if len(problems) == len(config.deployments):
        raise ConfigError("no deployment can be loaded: " + "; ".join(problems))
    return problems
