"""Priority levels (Triton's): queue order, the delay of a mixed batch, bounds, config and the 400 on bad values."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import orjson
import pytest
from prometheus_client import CollectorRegistry

from latlab.server.batching.batch_queue import BatchQueue, Pending
from latlab.server.batching.batcher import DynamicBatcher
from latlab.server.config import BatcherSettings, parse_config
from latlab.server.errors import BadRequest, ConfigError, QueueFull
from latlab.server.http.app import create_app

WAIT_S = 5.0


def queue(**overrides: object) -> BatchQueue:
    base = dict(
        max_batch_size=4, max_queue_delay_ms=1000.0, max_queue_size=16, priority_levels=3, default_priority_level=2
    )
    return BatchQueue(BatcherSettings(**{**base, **overrides}))


def item(at: float, priority: int = 0, size: int = 1) -> Pending:
    return Pending(
        {"x": np.zeros((size, 1), np.float32)}, size, at, at + 100.0, shape_key=(("x", (1,)),), priority=priority
    )


def test_higher_priority_is_served_first_and_fifo_within_a_level() -> None:
    q = queue(max_batch_size=2)
    low1, low2, high1, default, high2 = item(0.0, 3), item(0.1, 3), item(0.2, 1), item(0.3, 0), item(0.4, 1)
    for p in (low1, low2, high1, default, high2):
        q.put(p)
    assert q.take(0.4) == [high1, high2]
    assert q.take(0.4) == [default, low1]  # priority 0 is the default level 2, ahead of level 3
    assert q.take(5.0) == [low2]
    assert q.take(5.0) is None


def test_delay_counts_from_the_oldest_request_of_the_batch_being_formed() -> None:
    q = queue()
    low, high = item(0.0, 3), item(0.5, 1)
    q.put(low)
    q.put(high)
    assert q.take(0.6) == pytest.approx(1.0)  # the batch [high, low] waits from low's arrival, not high's
    assert q.take(1.0) == [high, low]


def test_a_newer_high_priority_request_alone_waits_its_own_delay() -> None:
    q = queue(max_batch_size=2)
    low, high = item(0.0, 3, size=2), item(0.5, 1)
    q.put(low)
    q.put(high)
    assert q.take(0.5) == [high]  # low (2 samples) cannot join: the batch is blocked, high goes at once
    assert q.take(0.5) == [low]  # low has a full batch on its own


def test_queue_bound_counts_every_level() -> None:
    q = queue(max_queue_size=3)
    for priority in (1, 2, 3):
        q.put(item(0.0, priority))
    with pytest.raises(QueueFull):
        q.put(item(0.0, 1))
    assert len(q) == 3


@pytest.mark.parametrize("priority", [4, -1, True, 1.5, "1"])
def test_a_bad_priority_is_a_bad_request_naming_it(priority: object) -> None:
    q = queue()
    with pytest.raises(BadRequest, match=rf"parameters.priority must be an integer in 0..3.*got {priority!r}"):
        q.put(item(0.0, priority))  # type: ignore[arg-type]
    assert len(q) == 0


def test_expiry_works_across_levels() -> None:
    q = queue()
    keep, drop = item(0.0, 3), Pending({"x": np.zeros((1, 1))}, 1, 0.0, 1.0, shape_key=(("x", (1,)),), priority=1)
    q.put(keep)
    q.put(drop)
    assert q.expire(2.0) == [drop]
    assert q.take(5.0) == [keep]


def test_worker_serves_the_high_priority_request_queued_behind_a_busy_instance() -> None:
    gate, started, order = threading.Event(), threading.Event(), []

    def run(inputs):
        order.append(int(inputs["x"][0, 0]))
        started.set()
        gate.wait(WAIT_S)
        return {"y": inputs["x"]}

    def submit(tag: int, priority: int):
        return batcher.submit({"x": np.full((1, 1), tag, np.float32)}, 1, priority=priority)

    batcher = DynamicBatcher(run, BatcherSettings(max_batch_size=1, priority_levels=2, default_priority_level=2))
    try:
        futures = [submit(0, 0)]
        assert started.wait(WAIT_S)  # the only instance is now busy with request 0
        futures += [submit(1, 2), submit(2, 0), submit(3, 1)]
        gate.set()
        for future in futures:
            future.result(WAIT_S)
    finally:
        batcher.close(WAIT_S)
    assert order == [0, 3, 1, 2]


# --- config and HTTP ----------------------------------------------------------------------------------


def test_priority_settings_are_parsed_and_checked(tiny_model: Path) -> None:
    doc = {
        "deployments": [
            {"name": "t", "model_path": str(tiny_model), "batcher": {"priority_levels": 3, "default_priority_level": 3}}
        ]
    }
    assert parse_config(doc).deployments[0].batcher.priority_levels == 3
    for bad in (
        {"priority_levels": 0},
        {"priority_levels": 2, "default_priority_level": 3},
        {"default_priority_level": 0},
    ):
        doc["deployments"][0]["batcher"] = bad
        with pytest.raises(ConfigError, match="priority_levels must be >= 1 and default_priority_level"):
            parse_config(doc)


@pytest.mark.parametrize("priority, status", [(1, 200), (2, 200), (0, 200), (3, 400), ("high", 400), (-2, 400)])
def test_http_priority_parameter(tiny_model: Path, priority: object, status: int) -> None:
    config = parse_config(
        {
            "deployments": [
                {"name": "tiny", "model_path": str(tiny_model), "batcher": {"max_batch_size": 4, "priority_levels": 2}}
            ]
        }
    )
    app = create_app(config, registry=CollectorRegistry())
    try:
        body = {
            "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}],
            "parameters": {"priority": priority},
        }
        response = app.test_client().post("/v2/models/tiny/infer", data=orjson.dumps(body))
        assert response.status_code == status, response.data
        if status == 400:
            error = orjson.loads(response.data)["error"]
            assert "parameters.priority" in error and repr(priority) in error
        else:
            assert orjson.loads(response.data)["outputs"][0]["shape"] == [1, 3]
    finally:
        app.extensions["latlab"].close()
