"""Deployment: warm-up before ready, readiness meanwhile, describe(), output selection, transfers, BYTES served."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import orjson
import pytest
from prometheus_client import CollectorRegistry

import latlab.server.runtime.deployment as deployment_module
from latlab.common.machine import cpu_model
from latlab.server.config import parse_config
from latlab.server.http.app import create_app
from latlab.server.metrics import ServerMetrics
from latlab.server.protocol import HEADER_LENGTH
from latlab.server.runtime.deployment import Deployment
from latlab.server.runtime.model import OnnxModel

from tests.server.test_runtime import strings, two_outputs

WARMUP = "latlab_server_model_warmup_seconds"


def config(path: Path, **extra: object):
    return parse_config({"deployments": [{"name": "m", "model_path": str(path), **extra}]})


def labels(deployment: Deployment) -> dict[str, str]:
    return {"deployment": "m", "model": deployment.config.model, "provider": deployment.config.provider}


class RunSpy:
    """Wraps OnnxModel.run and run_timed: records warm-up batch sizes and the outputs each batch asked for,
    and can hold warm-up runs until released."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.warmup_sizes: list[int] = []
        self.selections: list[list[str] | None] = []
        self.release = threading.Event()
        self.release.set()
        run, run_timed = OnnxModel.run, OnnxModel.run_timed

        def spy_run(model: OnnxModel, inputs: dict, outputs: list[str] | None = None) -> dict:
            if threading.current_thread().name.endswith("-warmup"):
                self.release.wait(30)
                self.warmup_sizes.append(len(next(iter(inputs.values()))))
            return run(model, inputs, outputs)

        def spy_run_timed(model: OnnxModel, inputs: dict, outputs: list[str] | None = None):
            if not threading.current_thread().name.endswith("-warmup"):
                self.selections.append(outputs)
            return run_timed(model, inputs, outputs)

        monkeypatch.setattr(OnnxModel, "run", spy_run)
        monkeypatch.setattr(OnnxModel, "run_timed", spy_run_timed)


def test_warmup_runs_every_batch_size_before_ready(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = RunSpy(monkeypatch)
    registry = CollectorRegistry()
    deployment = Deployment(
        config(two_outputs(tmp_path), batcher={"max_batch_size": 6}).deployments[0], ServerMetrics(registry)
    )
    try:
        assert deployment.wait_ready(30)
        assert spy.warmup_sizes == [1, 2, 3, 4, 5, 6]
        assert registry.get_sample_value(WARMUP, labels(deployment)) > 0
    finally:
        deployment.close()


def test_readiness_is_false_until_warmup_ends_while_live_answers(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = RunSpy(monkeypatch)
    spy.release.clear()
    monkeypatch.setattr(deployment_module, "WARMUP_WAIT_S", 0.0)
    registry = CollectorRegistry()
    app = create_app(config(tiny_model, batcher={"max_batch_size": 2}), registry)
    client = app.test_client()
    try:
        assert client.get("/v2/health/live").status_code == 200
        assert client.get("/v2/health/ready").status_code == 400
        assert client.get("/v2/models/m/ready").status_code == 400
        assert client.get("/v2/models/m").get_json()["inputs"][0]["shape"] == [-1, 4]
        assert registry.get_sample_value(WARMUP, {"deployment": "m", "model": "tiny", "provider": "cpu"}) is None
        # Requests are served during warm-up (only slower): readiness is for load balancers.
        body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
        assert client.post("/v2/models/m/infer", json=body).status_code == 200
        spy.release.set()
        assert app.extensions["latlab"].deployments["m"].wait_ready(30)
        assert client.get("/v2/health/ready").status_code == 200
        assert client.get("/v2/models/m/ready").status_code == 200
        assert registry.get_sample_value(WARMUP, {"deployment": "m", "model": "tiny", "provider": "cpu"}) > 0
    finally:
        spy.release.set()
        app.extensions["latlab"].close()


def test_small_model_is_ready_when_built(tiny_model: Path) -> None:
    deployment = Deployment(
        config(tiny_model, batcher={"max_batch_size": 8}).deployments[0], ServerMetrics(CollectorRegistry())
    )
    try:
        assert deployment.ready  # the constructor waits up to WARMUP_WAIT_S for a warm-up this small
    finally:
        deployment.close()


def test_warmup_false_skips_it(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = RunSpy(monkeypatch)
    registry = CollectorRegistry()
    deployment = Deployment(config(tiny_model, warmup=False).deployments[0], ServerMetrics(registry))
    try:
        assert deployment.ready and spy.warmup_sizes == []
        assert registry.get_sample_value(WARMUP, labels(deployment)) is None
        assert deployment.describe()["warmup"] is False
    finally:
        deployment.close()


def test_close_during_warmup_stops_it(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = RunSpy(monkeypatch)
    spy.release.clear()
    monkeypatch.setattr(deployment_module, "WARMUP_WAIT_S", 0.0)
    deployment = Deployment(
        config(tiny_model, batcher={"max_batch_size": 50}).deployments[0], ServerMetrics(CollectorRegistry())
    )
    closer = threading.Thread(target=deployment.close)
    closer.start()
    spy.release.set()
    closer.join(30)
    assert not closer.is_alive()
    assert len(spy.warmup_sizes) < 50 and not deployment.ready


def test_failed_warmup_run_is_logged_and_the_deployment_serves(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse_zeros(model: OnnxModel, inputs: dict, outputs: list[str] | None = None) -> dict:
        raise RuntimeError("zeros are not valid for this model")

    monkeypatch.setattr(OnnxModel, "run", refuse_zeros)
    deployment = Deployment(config(tiny_model).deployments[0], ServerMetrics(CollectorRegistry()))
    try:
        assert deployment.wait_ready(30)
        assert "deployment 'm': warm-up run failed (zeros are not valid for this model)" in caplog.text
    finally:
        deployment.close()


def test_describe_names_the_environment_and_options(tiny_model: Path) -> None:
    deployment = Deployment(
        config(tiny_model, cpu={"intra_op_threads": 1}).deployments[0], ServerMetrics(CollectorRegistry())
    )
    try:
        described = deployment.describe()
        assert described["environment"] == {
            "onnxruntime": ort.__version__,
            "providers": ["CPUExecutionProvider"],
            "cpu": cpu_model(),
            "cores": deployment.environment["cores"],
            "gpu": None,
            "cpu_threads": 1,
        }
        assert described["environment"]["cores"] >= 1
        assert described["cpu"]["intra_op_threads"] == 1
        assert "cuda" not in described and "tensorrt" not in described  # CPU deployment: no device options
        assert described["io_binding"] is False
    finally:
        deployment.close()


def test_a_batch_runs_the_outputs_all_its_requests_asked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = RunSpy(monkeypatch)
    deployment = Deployment(
        config(
            two_outputs(tmp_path),
            warmup=False,
            batcher={"max_batch_size": 4, "max_queue_delay_ms": 10_000, "preferred_batch_sizes": [2]},
        ).deployments[0],
        ServerMetrics(CollectorRegistry()),
    )
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    try:

        def submit_pair(first: list[str] | None, second: list[str] | None) -> list[dict]:
            futures = [
                deployment.batcher.submit({"x": x}, 1, outputs=deployment.selection(wanted))
                for wanted in (first, second)
            ]
            return [future.result(30) for future in futures]

        same = submit_pair(["square"], ["square"])
        assert spy.selections[-1] == ["square"]
        assert all(list(result) == ["square"] for result in same)
        mixed = submit_pair(["square"], None)
        assert spy.selections[-1] is None  # the requests differ: every output is computed and copied
        assert all(set(result) == {"double", "square"} for result in mixed)
        np.testing.assert_array_equal(mixed[0]["square"], x * x)
    finally:
        deployment.close()


def test_cpu_runs_observe_no_transfers_and_bound_runs_do(tiny_model: Path) -> None:
    registry = CollectorRegistry()
    deployment = Deployment(config(tiny_model).deployments[0], ServerMetrics(registry))
    x = {"x": np.ones((1, 4), dtype=np.float32)}
    try:
        deployment.batcher.infer(x, 1)
        for name in ("input", "output"):
            metric = f"latlab_batcher_{name}_transfer_duration_seconds_count"
            assert registry.get_sample_value(metric, labels(deployment)) is None
        deployment.model.bound = True  # the I/O-binding path, on the CPU device
        deployment.batcher.infer(x, 1)
        for name in ("input", "output"):
            metric = f"latlab_batcher_{name}_transfer_duration_seconds_count"
            assert registry.get_sample_value(metric, labels(deployment)) == 1
    finally:
        deployment.close()


def test_a_string_model_is_served_with_bytes_in_json_and_binary(tmp_path: Path) -> None:
    app = create_app(config(strings(tmp_path), batcher={"max_batch_size": 4}), CollectorRegistry())
    client = app.test_client()
    try:
        meta = client.get("/v2/models/m").get_json()
        assert meta["inputs"] == [{"name": "s", "datatype": "BYTES", "shape": [-1, 2]}]
        body = {"inputs": [{"name": "s", "shape": [1, 2], "datatype": "BYTES", "data": ["caf\u00e9", ""]}]}
        answer = client.post("/v2/models/m/infer", json=body).get_json()
        assert answer["outputs"] == [{"name": "t", "datatype": "BYTES", "shape": [1, 2], "data": ["caf\u00e9", ""]}]

        raw = b"".join(len(x).to_bytes(4, "little") + x for x in [b"ab", b"\xe2\x98\x83"])
        header = orjson.dumps(
            {
                "inputs": [
                    {"name": "s", "shape": [1, 2], "datatype": "BYTES", "parameters": {"binary_data_size": len(raw)}}
                ],
                "parameters": {"binary_data_output": True},
            }
        )
        response = client.post(
            "/v2/models/m/infer",
            data=header + raw,
            headers={HEADER_LENGTH: str(len(header)), "Content-Type": "application/octet-stream"},
        )
        assert response.status_code == 200
        length = int(response.headers[HEADER_LENGTH])
        assert orjson.loads(response.data[:length])["outputs"][0]["parameters"] == {"binary_data_size": len(raw)}
        assert response.data[length:] == raw

        bad = {"inputs": [{"name": "s", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
        refused = client.post("/v2/models/m/infer", json=bad)
        assert refused.status_code == 400 and "must be BYTES, got FP32" in refused.get_json()["error"]
    finally:
        app.extensions["latlab"].close()
