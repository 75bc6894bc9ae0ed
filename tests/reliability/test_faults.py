"""A fault fails only what it touched: a batch whose ONNX Runtime run raises fails its own requests with a 500
and a message, is counted, and the batcher goes on serving; no trace or path ever reaches a client."""

from __future__ import annotations

import logging
import re
import threading
from pathlib import Path
from typing import Iterator

import numpy as np
import orjson
import pytest
import requests
from prometheus_client import CollectorRegistry

from latlab.server.http.app import create_app
from latlab.server.runtime.deployment import Deployment

from tests.conftest import server_config
from tests.reliability.conftest import (
    COUNTS,
    POISON,
    Server,
    assert_error,
    build_poison_model,
    output_of,
    running_server,
)

pytestmark = pytest.mark.e2e
BATCH = 3
LABELS = {"deployment": "poison", "model": "poison", "provider": "cpu"}
TABLE = np.arange(32, dtype=np.float32).reshape(8, 4)
PATH_LIKE = re.compile(r"/\w+/\w+|\.py\b|\.onnx\b")


def request_body(index: int, x: np.ndarray) -> bytes:
    return orjson.dumps(
        {
            "inputs": [
                {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": x.reshape(-1).tolist()},
                {"name": "i", "shape": [1], "datatype": "INT64", "data": [index]},
            ]
        }
    )


@pytest.fixture(scope="module")
def poison_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Batches of exactly 3 (a long delay, so a batch leaves only when full), one instance."""
    folder = tmp_path_factory.mktemp("poison-server")
    model = build_poison_model(folder / "poison" / "model.onnx")
    deployments = [
        {"name": "poison", "model_path": str(model), "batcher": {"max_batch_size": BATCH, "max_queue_delay_ms": 2000}}
    ]
    with running_server(folder, deployments) as server:
        yield server


def send_together(server: Server, indexes: list[int]) -> list[tuple[int, requests.Response]]:
    """Send one request per index at the same moment; answers in the order of `indexes`."""
    results: list = [None] * len(indexes)
    start = threading.Barrier(len(indexes))

    def send(slot: int) -> None:
        x = np.full((1, 4), slot, np.float32)
        start.wait()
        results[slot] = (
            indexes[slot],
            requests.post(f"{server.url}/v2/models/poison/infer", data=request_body(indexes[slot], x), timeout=30),
        )

    threads = [threading.Thread(target=send, args=(slot,)) for slot in range(len(indexes))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(40)
    return results


@pytest.mark.parametrize("round_", range(3))
def test_a_failing_batch_fails_only_its_own_requests(poison_server: Server, round_: int) -> None:
    errors_before = poison_server.metric("latlab_batcher_batches_total", **LABELS, outcome="error")
    ok_before = poison_server.metric("latlab_batcher_batches_total", **LABELS, outcome="ok")
    indexes = [1, 2, POISON, 3, 4, 5]
    results = send_together(poison_server, indexes)  # two full batches of 3: one holds the poison

    failed = [(index, r) for index, r in results if r.status_code == 500]
    answered = [(index, r) for index, r in results if r.status_code == 200]
    assert len(failed) == BATCH and len(answered) == BATCH, [r.status_code for _, r in results]
    assert POISON in [index for index, _ in failed]
    for _, response in failed:
        assert_error(response, 500, "model run failed", "indices element out of data bounds")
    for index, response in answered:
        slot = indexes.index(index)
        np.testing.assert_allclose(output_of(response, (1, 4)), slot + TABLE[index : index + 1], rtol=1e-6)
    assert poison_server.metric("latlab_batcher_batches_total", **LABELS, outcome="error") == errors_before + 1
    assert poison_server.metric("latlab_batcher_batches_total", **LABELS, outcome="ok") == ok_before + 1
    assert poison_server.metric("latlab_server_requests_total", **LABELS, outcome="error") == BATCH * (round_ + 1)
    assert poison_server.alive()
    COUNTS["faults injected (failing batches)"] += 1
    COUNTS["requests failed with their batch"] += len(failed)
    COUNTS["requests in other batches answered"] += len(answered)


def test_the_batcher_keeps_serving_after_faults(poison_server: Server) -> None:
    results = send_together(poison_server, [0, 1, 7])  # one full batch, no poison
    assert [r.status_code for _, r in results] == [200, 200, 200]


def test_a_500_carries_a_message_but_no_trace_or_path_and_the_log_has_the_trace(poison_server: Server) -> None:
    results = send_together(poison_server, [POISON, POISON, POISON])
    for _, response in results:
        message = assert_error(response, 500, "model run failed")
        assert "Traceback" not in response.text and not PATH_LIKE.search(message), message
    log = poison_server.log.read_text(errors="replace")
    assert "batch of 3 request(s) failed" in log and "Traceback (most recent call last)" in log
    COUNTS["faults injected (failing batches)"] += 1


def test_an_unexpected_error_is_a_bare_500_and_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Any bug past the error classes: the client sees only 'internal server error'; the log has the trace."""
    from tests.conftest import build_tiny_model

    app = create_app(server_config(build_tiny_model(tmp_path / "tiny" / "model.onnx")), registry=CollectorRegistry())

    def broken(self: Deployment, request: object) -> None:
        raise RuntimeError(f"secret detail in {tmp_path}/server/module.py")

    monkeypatch.setattr(Deployment, "infer", broken)
    try:
        with caplog.at_level(logging.ERROR, logger="latlab.server"):
            response = app.test_client().post(
                "/v2/models/tiny/infer",
                data=orjson.dumps(
                    {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]}]}
                ),
            )
    finally:
        app.extensions["latlab"].close()
    assert response.status_code == 500
    assert orjson.loads(response.data) == {"error": "internal server error"}
    assert "secret detail" in caplog.text and "Traceback" in caplog.text
