"""latlab.server.http.rsgi: the one-process server under Granian's RSGI interface, real Granian on a free port."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import orjson
import pytest
import requests

from latlab.common.settings import BatcherSettings
from latlab.server.batching.batcher import DynamicBatcher
from latlab.server.config import (
    FRONTENDS_ENV,
    INTERFACE_ENV,
    parse_config,
    save_config,
    served_config,
    served_interface,
)
from latlab.server.errors import ConfigError
from latlab.server.http.answers import LoopAnswers
from latlab.server.protocol import HEADER_LENGTH

from tests.reliability.conftest import Server, assert_error, output_of, running_server, tiny_body, tiny_y

HOLD_MS = 1500
"""How long a lone request waits for its batch to fill in the held server: far longer than a request takes to
arrive, so the requests sent while it waits find it still queued."""


@pytest.fixture(autouse=True)
def one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """RSGI serves one process: the suite's run with LATLAB_FRONTENDS=2 must not make these servers front ends, nor
    one with LATLAB_INTERFACE another interface than the tests ask for."""
    monkeypatch.delenv(FRONTENDS_ENV, raising=False)
    monkeypatch.delenv(INTERFACE_ENV, raising=False)


@pytest.fixture
def served(tmp_path: Path, tiny_model: Path):
    deployment = {"name": "tiny", "model_path": str(tiny_model), "batcher": {"max_batch_size": 8}}
    with running_server(tmp_path, [deployment], interface="rsgi", max_body_bytes=4096) as server:
        yield server


@pytest.fixture(params=["rsgi", "native"])
def held(request: pytest.FixtureRequest, tmp_path: Path, tiny_model: Path):
    """A server whose batches wait HOLD_MS to fill, with room for 2 queued requests, under each interface that has
    no thread per request (tests/server/test_native.py tests the native one's own framing)."""
    batcher = {"max_batch_size": 8, "max_queue_delay_ms": HOLD_MS, "max_queue_size": 2}
    deployment = {"name": "tiny", "model_path": str(tiny_model), "batcher": batcher}
    with running_server(tmp_path, [deployment], interface=request.param) as server:
        yield server


def test_json_infer_is_answered_and_counted(served: Server) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    labels = {"deployment": "tiny", "model": "tiny", "provider": "cpu", "outcome": "ok"}
    before = served.metric("latlab_server_requests_total", **labels)
    response = served.infer(tiny_body(x, id="r1"))
    assert response.status_code == 200 and response.headers["Content-Type"] == "application/json"
    assert response.json()["id"] == "r1"
    np.testing.assert_allclose(output_of(response, (2, 3)), tiny_y(x), rtol=1e-5)
    assert served.metric("latlab_server_requests_total", **labels) == before + 1


def test_binary_tensors_round_trip(served: Server) -> None:
    x = np.ones((3, 4), np.float32)
    raw = x.tobytes()
    tensor = {"name": "x", "shape": [3, 4], "datatype": "FP32", "parameters": {"binary_data_size": len(raw)}}
    header = orjson.dumps({"inputs": [tensor], "outputs": [{"name": "y", "parameters": {"binary_data": True}}]})
    response = served.infer(
        header + raw, headers={"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(header))}
    )
    assert response.status_code == 200 and response.headers["Content-Type"] == "application/octet-stream"
    length = int(response.headers[HEADER_LENGTH])
    assert orjson.loads(response.content[:length])["outputs"][0]["parameters"] == {"binary_data_size": 36}
    np.testing.assert_allclose(np.frombuffer(response.content[length:], np.float32).reshape(3, 3), tiny_y(x), rtol=1e-5)


def test_errors_keep_their_status_and_body(served: Server) -> None:
    assert_error(served.infer(b"{not json"), 400)
    assert_error(served.infer(tiny_body(np.ones((1, 4), np.float32)), model="nope"), 404, "unknown model 'nope'")
    assert_error(served.infer(b"x" * 5000), 413, "max_body_bytes")
    chunked = served.session.post(
        f"{served.url}/v2/models/tiny/infer", data=iter([b"x" * 3000, b"x" * 3000]), timeout=15
    )  # a generator body goes chunked: no length to refuse it by, so the limit cuts it while it is read
    assert_error(chunked, 413, "max_body_bytes")
    assert served.infer(tiny_body(np.ones((1, 4), np.float32))).status_code == 200  # the server still serves


def test_the_other_routes_go_to_flask(served: Server) -> None:
    config = served.session.get(f"{served.url}/v2/models/tiny/config", timeout=10).json()
    assert config["interface"] == "rsgi" and config["frontends"] == 1
    assert served.session.get(f"{served.url}/v2/health/ready", timeout=10).status_code == 200
    assert served.session.get(f"{served.url}/v2/models/tiny/infer", timeout=10).status_code == 405
    assert "latlab_batcher_queue_depth{" in served.session.get(f"{served.url}/metrics", timeout=10).text


def test_a_full_queue_refuses_with_retry_after_and_the_waiting_are_answered(held: Server) -> None:
    x = np.ones((1, 4), np.float32)
    labels = {"deployment": "tiny", "model": "tiny", "provider": "cpu"}
    with ThreadPoolExecutor(2) as pool:
        waiting = [pool.submit(requests.post, f"{held.url}/v2/models/tiny/infer", data=tiny_body(x), timeout=15)]
        waiting.append(pool.submit(requests.post, f"{held.url}/v2/models/tiny/infer", data=tiny_body(x), timeout=15))
        while held.metric("latlab_batcher_queue_depth", **labels) < 2:
            assert not any(w.done() for w in waiting), "a request was answered before its batch's delay"
        refused = held.infer(tiny_body(x))
        assert_error(refused, 503, "queue is full")
        assert refused.headers["Retry-After"] == "1"
        assert [w.result().status_code for w in waiting] == [200, 200]
    assert held.metric("latlab_batcher_rejections_total", **labels, reason="queue_full") >= 1


def test_a_request_past_its_timeout_gets_504(held: Server) -> None:
    response = held.infer(tiny_body(np.ones((1, 4), np.float32), parameters={"timeout": 1000}))
    assert_error(response, 504, "expired")


def test_a_batch_wakes_the_loop_once() -> None:
    """Eight requests answered by one batch reach the loop with one scheduled call, not eight. The loop is held
    busy while the batch answers, so the count does not hang on the machine's thread scheduling: the first answer
    schedules the call and the next six find it scheduled; the last answer's callback runs just after its slot is
    done, and so may come after the loop delivered the others, which makes two calls at most."""
    runs = threading.Event()

    def run_batch(inputs: dict) -> dict:
        runs.set()
        return {"y": inputs["x"] * 2}

    settings = BatcherSettings(max_batch_size=8, max_queue_delay_ms=60_000)
    batcher = DynamicBatcher(run_batch, settings)

    async def main() -> tuple[list, int]:
        loop = asyncio.get_running_loop()
        answers = LoopAnswers(loop)
        calls = []
        threadsafe = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *args: calls.append(args) or threadsafe(*args)  # type: ignore[method-assign]
        slots = [batcher.submit({"x": np.full((1, 2), i, np.float32)}, 1, wake=False) for i in range(8)]
        waits = [asyncio.ensure_future(answers.wait(slot, 30.0)) for slot in slots]
        await asyncio.sleep(0)  # every wait has registered with its slot
        assert not calls and not any(slot.done() for slot in slots)
        answers.wake_soon(batcher)
        loop.call_soon(lambda: [slot.result(30.0) for slot in slots])  # the loop's thread blocked while they answer
        answered = await asyncio.gather(*waits)
        assert answered == [True] * 8
        return [slot.result()["y"][0, 0] for slot in slots], len(calls)

    try:
        values, wakes = asyncio.run(main())
    finally:
        batcher.close()
    assert runs.is_set() and values == [2.0 * i for i in range(8)]
    assert 1 <= wakes <= 2


def test_the_interface_setting_is_checked_overridden_and_wsgi_for_front_ends(tmp_path: Path, tiny_model: Path) -> None:
    deployments = [{"name": "tiny", "model_path": str(tiny_model)}]
    with pytest.raises(ConfigError, match=r"interface must be one of \('wsgi', 'rsgi', 'native'\), got 'asgi'"):
        parse_config({"server": {"interface": "asgi"}, "deployments": deployments})
    path = save_config({"server": {"frontends": 2}, "deployments": deployments}, tmp_path / "server.toml")
    assert served_config(path).interface == "wsgi"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(INTERFACE_ENV, "rsgi")
        config = served_config(path)
    assert config.interface == "rsgi" and served_interface(config) == "wsgi"  # front ends forward: no batcher
    assert served_interface(dataclasses.replace(config, frontends=1)) == "rsgi"
