"""A deployment: one ONNX model on one provider behind its own dynamic batcher and metric labels."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import orjson
from prometheus_client import Gauge

from latlab.common.machine import cpu_model
from latlab.server.batching.admission import admission_for
from latlab.server.batching.batcher import DynamicBatcher
from latlab.server.config import DeploymentConfig
from latlab.server.errors import BadRequest, ConfigError
from latlab.server.gpu import nvml_gpus
from latlab.server.metrics import DeploymentMetrics, ServerMetrics
from latlab.server.protocol import InferRequest
from latlab.server.runtime.model import OnnxModel
from latlab.server.runtime.text import TextFrontEnd, text_front_end, timed_encode

log = logging.getLogger("latlab.server.runtime.deployment")
WARMUP_WAIT_S = 2.0
"""How long the constructor waits for warm-up; a longer one goes on in the background (the server then
answers /v2/health/live, while ready stays false until it ends). A small model is ready when built."""


class Deployment:
    """Validates a request against the model, queues it and returns the outputs the client asked for."""

    version = "1"

    def __init__(self, config: DeploymentConfig, metrics: ServerMetrics, admission: bool = True) -> None:
        """`admission`: whether requests beyond admitted_bound are refused at the door (batching/admission.py)."""
        self.config = config
        started = time.perf_counter()
        self.model = OnnxModel(config)
        labels = {"deployment": config.name, "model": config.model, "provider": config.provider}
        metrics.model_load.labels(**labels).set(time.perf_counter() - started)
        metrics.queue_capacity.labels(**labels).set(config.batcher.max_queue_size)
        self.metrics: DeploymentMetrics = metrics.for_deployment(labels)
        self.admission = admission_for(config, admission, lambda: self.metrics.rejected("queue_full"))
        if self.admission.limit is not None:
            metrics.admission_limit.labels(**labels).set(self.admission.limit)
        _check_padding(config, {spec.name for spec in self.model.inputs})
        self.text = text_front_end(config, {spec.name: spec.dtype for spec in self.model.inputs})
        padding = config.padding if self.text is None else self.text.padding(config.padding)
        self.batcher = DynamicBatcher(self._run_batch, config.batcher, self.metrics, name=config.name, padding=padding)
        self._output_names = {o.name for o in self.model.outputs}
        self._output_order = [o.name for o in self.model.outputs]
        self.environment = environment(self.model)
        self.variant = variant_of(config.model_path)  # read once: /config is asked for at every load step
        self._warmed, self._closing = threading.Event(), threading.Event()
        self._warmup = threading.Thread(
            target=self._warm_up, args=(metrics.model_warmup, labels), name=f"{config.name}-warmup", daemon=True
        )
        if config.warmup:
            self._warmup.start()
            self._warmed.wait(WARMUP_WAIT_S)
        else:
            self._warmed.set()

    @property
    def ready(self) -> bool:
        """False until warm-up has run every batch size (requests are served meanwhile, only slower)."""
        return self._warmed.is_set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until warm-up is done (or `timeout` passes); returns whether it is."""
        return self._warmed.wait(timeout)

    def _warm_up(self, gauge: Gauge, labels: dict[str, str]) -> None:
        """Run every batch size the batcher can form once, with zeros: the first run at each new shape is
        the slow one (ORT allocates, cuDNN searches kernels), and a client should not pay it."""
        started = time.perf_counter()
        for inputs in self.model.warmup_batches(self.config.batcher.max_batch_size):
            if self._closing.is_set():
                return
            try:
                self.model.run(inputs)
            except Exception as exc:  # zeros may be invalid for some models: log it, serve anyway
                log.warning(
                    "deployment '%s': warm-up run failed (%s); skipping the rest of warm-up", self.config.name, exc
                )
                break
        gauge.labels(**labels).set(time.perf_counter() - started)  # no sample before: absent means not warmed
        self._warmed.set()

    def _run_batch(
        self, inputs: dict[str, np.ndarray], outputs: tuple[str, ...] | None = None
    ) -> dict[str, np.ndarray]:
        """The batcher's model run: `outputs` when the whole batch asked for the same ones (else all), and on
        a device the transfer times reported apart."""
        results, timings = self.model.run_timed(inputs, None if outputs is None else list(outputs))
        rows = next((array.shape[0] for array in inputs.values() if array.ndim), 0)
        self.metrics.rows_run(self.model.bucket_for(rows), rows)
        if timings is not None:
            self.metrics.transfer_done(timings.input_s, timings.output_s)
        return results

    def selection(self, outputs: list[str] | None) -> tuple[str, ...] | None:
        """The outputs a request needs, in the model's order; None when it needs all (or names none)."""
        if not outputs or self._output_names <= set(outputs):
            return None
        return tuple(name for name in self._output_order if name in outputs)

    def infer(self, request: InferRequest) -> dict[str, np.ndarray]:
        self.check_outputs(request.outputs)
        inputs = tokenized(self.text, self.metrics, request)
        outputs = self.batcher.infer(*self.queued(inputs, request.outputs, request.parameters, request.finite))
        return picked(outputs, request.outputs)

    def check_outputs(self, outputs: list[str] | None) -> None:
        if outputs is not None:
            unknown = sorted(set(outputs) - self._output_names)
            if unknown:
                raise BadRequest(
                    f"model '{self.config.name}' has no output(s) {unknown}; it has {sorted(self._output_names)}"
                )

    def queued(
        self, inputs: dict[str, np.ndarray], outputs: list[str] | None, parameters: dict, finite: set[str]
    ) -> tuple:
        """The batcher's arguments for one request's (tokenized) inputs, validated against the model: inputs,
        batch size, timeout, priority and the outputs to compute."""
        size = self.model.validate(inputs, finite)
        return inputs, size, request_timeout_s(parameters), parameters.get("priority", 0), self.selection(outputs)

    def refuse_if_full(self) -> None:
        self.batcher.refuse_if_full()

    def describe(self) -> dict:
        """The deployment's settings, served at .../config so load tests can label their results."""
        return {
            "name": self.config.name,
            "model": self.config.model,
            "provider": self.config.provider,
            "model_path": str(self.config.model_path),
            "batcher": dataclasses.asdict(self.config.batcher),
            "cpu": dataclasses.asdict(self.config.cpu),
            "padding": dataclasses.asdict(self.config.padding),
            **({"cuda": dataclasses.asdict(self.config.cuda)} if self.config.provider != "cpu" else {}),
            **({"tensorrt": dataclasses.asdict(self.config.tensorrt)} if self.config.provider == "tensorrt" else {}),
            "io_binding": self.model.bound,
            "bucket_runs": self.model.bucket_runs(),
            "warmup": self.config.warmup,
            "allow_non_finite": self.config.allow_non_finite,
            "environment": self.environment,
            **({"variant": self.variant} if self.variant else {}),
            **(
                {"tokenizer": {"file": str(self.text.file), "max_length": self.text.max_length}}
                if self.text is not None
                else {}
            ),
        }

    def metadata(self) -> dict:
        """The protocol's model metadata: a text deployment shows its text input, not the token tensors."""
        metadata = self.model.metadata()
        return metadata if self.text is None else self.text.metadata(metadata)

    def close(self) -> None:
        self._closing.set()
        if self._warmup.is_alive():
            self._warmup.join()
        self.batcher.close()


def variant_of(model_path: Path) -> dict | None:
    """What variant of an export the model file is, as `latlab export --int8 / --fp16` recorded it beside the file
    (docs/variants.md): its precision and its accuracy against FP32; None for an export itself or a file with no
    such record."""
    try:
        meta = orjson.loads((Path(model_path).parent / "metadata.json").read_bytes())
    except (OSError, ValueError):  # orjson.JSONDecodeError is a ValueError
        return None
    if not isinstance(meta, dict) or "precision" not in meta or "fp32_model" not in meta:
        return None
    accuracy = meta.get("accuracy") or {}
    return {
        "name": "int8" if str(meta["precision"]).startswith("int8") else "fp16",
        "precision": meta["precision"],
        "of": meta["fp32_model"],
        "accuracy": {k: accuracy.get(k) for k in ("status", "label", "figure", "min_accuracy")},
    }


def environment(model: OnnxModel) -> dict:
    """What served this deployment: ORT version, the providers the session really got, CPU and GPU."""
    gpus = nvml_gpus() or []
    on_cpu = model.deployment.provider == "cpu"
    device = 0 if on_cpu else model.deployment.cuda.device_id
    gpu = next((g.name for g in gpus if g.index == device), None)
    # What a CPU deployment computes on, for the report's "N CPU cores vs 1 GPU" and core-hour prices;
    # 0 intra-op threads is ORT's "one per core".
    threads = {"cpu_threads": model.deployment.cpu.intra_op_threads or os.cpu_count()} if on_cpu else {}
    return {
        "onnxruntime": ort.__version__,
        "providers": model.session.get_providers(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "gpu": gpu,
        **threads,
        **model.precision(),
    }


def tokenized(text: TextFrontEnd | None, metrics: DeploymentMetrics, request: InferRequest) -> dict[str, np.ndarray]:
    """A request's model inputs: a text deployment's sentences tokenized here, on the request's thread before
    queueing (a bad sentence fails its request alone), and the truncation said in the response."""
    if text is None:
        return request.inputs
    inputs, truncated, seconds = timed_encode(text, request.inputs)
    metrics.preprocessed(seconds)
    request.response_parameters["truncated"] = truncated
    return inputs


def picked(outputs: dict[str, np.ndarray], wanted: list[str] | None) -> dict[str, np.ndarray]:
    """The outputs a request asked for, in its order; all of them when it named none."""
    return outputs if wanted is None else {name: outputs[name] for name in wanted}


def request_timeout_s(parameters: dict) -> float | None:
    """Triton's per-request `timeout` parameter, in microseconds; None when absent."""
    timeout = parameters.get("timeout")
    if timeout is None:
        return None
    if type(timeout) is not int or timeout < 0:
        raise BadRequest(f"parameters.timeout must be a non-negative integer of microseconds, got {timeout!r}")
    return timeout / 1e6


def _check_padding(config: DeploymentConfig, inputs: set[str]) -> None:
    unknown = sorted(set(config.padding.values) - inputs)
    if unknown:
        raise ConfigError(
            f"deployment '{config.name}' [padding]: values name input(s) {unknown} the model does "
            f"not have; it has {sorted(inputs)}"
        )
