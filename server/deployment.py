"""A deployment: one ONNX model on one provider behind its own dynamic batcher and metric labels."""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from latlab.server.batcher import DynamicBatcher
from latlab.server.config import DeploymentConfig
from latlab.server.errors import BadRequest
from latlab.server.metrics import DeploymentObserver, ServerMetrics
from latlab.server.protocol import InferRequest
from latlab.server.runtime import OnnxModel


class Deployment:
    """Validates a request against the model, queues it and returns the outputs the client asked for."""

    version = "1"

    def __init__(self, config: DeploymentConfig, metrics: ServerMetrics) -> None:
        self.config = config
        started = time.perf_counter()
        self.model = OnnxModel(config)
        labels = {"deployment": config.name, "model": config.model, "provider": config.provider}
        metrics.model_load.labels(**labels).set(time.perf_counter() - started)
        metrics.queue_capacity.labels(**labels).set(config.batcher.max_queue_size)
        self.observer: DeploymentObserver = metrics.for_deployment(labels)
        self.batcher = DynamicBatcher(self.model.run, config.batcher, self.observer, name=config.name)
        self._output_names = {o.name for o in self.model.outputs}

    @property
    def ready(self) -> bool:
        return True

    def infer(self, request: InferRequest) -> dict[str, np.ndarray]:
        if request.outputs is not None:
            unknown = sorted(set(request.outputs) - self._output_names)
            if unknown:
                raise BadRequest(f"model '{self.config.name}' has no output(s) {unknown}; "
                                 f"it has {sorted(self._output_names)}")
        size = self.model.validate(request.inputs)
        outputs = self.batcher.infer(request.inputs, size, request_timeout_s(request.parameters))
        if request.outputs is None:
            return outputs
        return {name: outputs[name] for name in request.outputs}

    def describe(self) -> dict:
        """The deployment's settings, served at .../config so load tests can label their results."""
        return {
            "name": self.config.name,
            "model": self.config.model,
            "provider": self.config.provider,
            "model_path": str(self.config.model_path),
            "batcher": dataclasses.asdict(self.config.batcher),
            "cpu": dataclasses.asdict(self.config.cpu),
            "allow_non_finite": self.config.allow_non_finite,
        }

    def close(self) -> None:
        self.batcher.close()


def request_timeout_s(parameters: dict) -> float | None:
    """Triton's per-request `timeout` parameter, in microseconds; None when absent."""
    timeout = parameters.get("timeout")
    if timeout is None:
        return None
    if type(timeout) is not int or timeout < 0:
        raise BadRequest(f"parameters.timeout must be a non-negative integer of microseconds, got {timeout!r}")
    return timeout / 1e6
