"""latlab.server.http.fastpath: the infer route in front of Flask, answering as Flask would; fast refusals."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import orjson
import pytest
import requests
from flask import Flask, request
from prometheus_client import CollectorRegistry
from werkzeug.test import Client

from latlab.server.config import ServerConfig, parse_config
from latlab.server.http.app import create_app
from latlab.server.protocol import HEADER_LENGTH

from tests.reliability.conftest import running_server

INFER = "/v2/models/tiny/infer"
LABELS = {"deployment": "tiny", "model": "tiny", "provider": "cpu"}
TOKEN = "fastpath-token-0123456789"


@pytest.fixture
def build_app() -> Iterator[Callable[..., Flask]]:
    apps: list[Flask] = []

    def build(config: ServerConfig, registry: CollectorRegistry | None = None) -> Flask:
        apps.append(create_app(config, registry=registry or CollectorRegistry()))
        return apps[-1]

    yield build
    for app in apps:
        app.extensions["latlab"].close()


def body(n: int = 1, **extra: object) -> bytes:
    x = np.arange(4 * n, dtype=np.float32).reshape(n, 4)
    return orjson.dumps(
        {"inputs": [{"name": "x", "shape": [n, 4], "datatype": "FP32", "data": x.ravel().tolist()}], **extra}
    )


def binary_body() -> tuple[bytes, dict]:
    header = orjson.dumps(
        {
            "inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "parameters": {"binary_data_size": 32}}],
            "parameters": {"binary_data_output": True},
        }
    )
    return header + np.arange(8, dtype=np.float32).tobytes(), {
        HEADER_LENGTH: str(len(header)),
        "Content-Type": "application/octet-stream",
    }


class WatchedBody(io.BytesIO):
    """A request body that records whether anyone read it."""

    reads = 0

    def read(self, size: int | None = -1) -> bytes:
        self.reads += 1
        return super().read(size)

    def readline(self, size: int | None = -1) -> bytes:
        self.reads += 1
        return super().readline(size)

    def readinto(self, buffer) -> int:
        self.reads += 1
        return super().readinto(buffer)


def test_infer_requests_skip_flask_and_everything_else_goes_through_it(
    build_app, tiny_model: Path, make_config
) -> None:
    app = build_app(make_config(tiny_model))
    through_flask: list[str] = []

    @app.before_request
    def seen() -> None:
        through_flask.append(request.path)

    client = app.test_client()
    assert client.post(INFER, data=body()).status_code == 200
    assert client.post("/v2/models/tiny/versions/1/infer", data=body()).status_code == 200
    assert through_flask == []
    assert client.get("/v2/health/ready").status_code == 200
    assert client.get(INFER).status_code == 405  # Flask still knows the rule, so a GET is 405, not 404
    assert client.post(INFER + "/").status_code == 404
    assert through_flask == ["/v2/health/ready", INFER, INFER + "/"]


def test_both_entries_answer_alike(build_app, tiny_model: Path) -> None:
    """The WSGI layer and the Flask rule behind it give the same status, headers and body for every case."""
    config = parse_config(
        {
            "server": {"max_body_bytes": 2048, "auth_token": TOKEN},
            "deployments": [{"name": "tiny", "model_path": str(tiny_model), "batcher": {"max_batch_size": 4}}],
        }
    )
    app = build_app(config)
    fast, flask_only = Client(app.wsgi_app), Client(app.wsgi_app.app)
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    binary, binary_headers = binary_body()
    cases = [
        (INFER, body(1, id="7"), auth),
        ("/v2/models/tiny/versions/2/infer", body(), auth),
        ("/v2/models/t%C3%A9/infer", body(), auth),
        (INFER, body(), {"Authorization": "Bearer nope"}),
        (INFER, b"{nope", auth),
        (INFER, body(100), auth),
        (INFER, body(), {**auth, "Content-Type": "text/x"}),
        (INFER, binary, {**auth, **binary_headers}),
        (INFER, binary, {**auth, HEADER_LENGTH: "x"}),
        (INFER, body(parameters={"timeout": -1}), auth),
    ]
    statuses = []
    for path, data, headers in cases:
        one, other = fast.post(path, data=data, headers=headers), flask_only.post(path, data=data, headers=headers)
        assert (one.status, sorted(one.headers.items()), one.data) == (
            other.status,
            sorted(other.headers.items()),
            other.data,
        ), path
        statuses.append(one.status_code)
    assert statuses == [200, 404, 404, 401, 400, 413, 415, 200, 400, 400]


@pytest.mark.parametrize("rows, status", [(1, 200), (100, 413)])
def test_chunked_bodies_keep_the_limit(build_app, tiny_model: Path, rows: int, status: int) -> None:
    config = parse_config(
        {"server": {"max_body_bytes": 2048}, "deployments": [{"name": "tiny", "model_path": str(tiny_model)}]}
    )
    client = build_app(config).test_client()
    response = client.post(
        INFER,
        input_stream=io.BytesIO(body(rows)),
        headers={"Content-Type": "application/json"},
        environ_base={"wsgi.input_terminated": True, "HTTP_TRANSFER_ENCODING": "chunked"},
    )
    assert response.status_code == status, response.data


class Trickle(io.BytesIO):
    """A body handed over a few bytes per read, as a WSGI server reading off a slow socket may."""

    def read(self, size: int | None = -1) -> bytes:
        return super().read(7 if size is None or size < 0 else min(size, 7))


def test_a_body_read_in_pieces_is_put_together_and_a_short_one_refused(
    build_app, tiny_model: Path, make_config
) -> None:
    """With a Content-Length the body is read as exactly that many bytes, however the server hands them over;
    a client that sends fewer is told so, and the next request is served."""
    app = build_app(make_config(tiny_model))
    whole = body()

    def post(stream: io.BytesIO) -> tuple[str, dict]:
        environ = {
            "REQUEST_METHOD": "POST",
            "PATH_INFO": INFER,
            "CONTENT_LENGTH": str(len(whole)),
            "wsgi.input": stream,
        }
        statuses: list[str] = []
        answer = b"".join(app.wsgi_app(environ, lambda status, headers: statuses.append(status)))
        return statuses[0], orjson.loads(answer)

    status, answer = post(Trickle(whole))
    assert status == "200 OK" and answer["outputs"][0]["shape"] == [1, 3]
    assert post(Trickle(whole[:-5])) == (
        "400 BAD REQUEST",
        {"error": "the client closed the connection before the body ended"},
    )
    assert post(io.BytesIO(whole))[0] == "200 OK"


def hold_the_queue(app: Flask, registry: CollectorRegistry) -> threading.Thread:
    """One request waiting out a long batching delay: with max_queue_size 1 the queue is then full."""
    answers: list[int] = []
    first = threading.Thread(target=lambda: answers.append(app.test_client().post(INFER, data=body()).status_code))
    first.answers = answers  # type: ignore[attr-defined]
    first.start()
    deadline = time.monotonic() + 5.0
    while registry.get_sample_value("latlab_batcher_queue_depth", LABELS) != 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    return first


def test_full_queue_is_refused_before_the_body_is_read(build_app, tiny_model: Path, make_config) -> None:
    registry = CollectorRegistry()
    app = build_app(make_config(tiny_model, max_batch_size=4, max_queue_delay_ms=500.0, max_queue_size=1), registry)
    first = hold_the_queue(app, registry)
    stream = WatchedBody(body())
    response = app.test_client().post(INFER, input_stream=stream, headers={"Content-Type": "application/json"})
    first.join(5.0)
    assert response.status_code == 503 and response.headers["Retry-After"] == "1"
    assert orjson.loads(response.data) == {"error": "queue is full (1 requests waiting)"}
    assert stream.reads == 0
    assert first.answers == [200]  # type: ignore[attr-defined]
    assert registry.get_sample_value("latlab_server_requests_total", {**LABELS, "outcome": "rejected"}) == 1
    assert registry.get_sample_value("latlab_batcher_rejections_total", {**LABELS, "reason": "queue_full"}) == 1
    assert registry.get_sample_value("latlab_server_inflight_requests", LABELS) == 0


def test_a_full_deployment_is_refused_at_the_door_before_the_body_is_read(
    build_app, tiny_model: Path, make_config
) -> None:
    """Admission counts requests from the door to their answer: max_queue_size + instances x max_batch_size."""
    registry = CollectorRegistry()
    app = build_app(make_config(tiny_model, max_queue_size=2), registry)
    admission = app.extensions["latlab"].deployments["tiny"].admission
    assert admission.limit == 3 == registry.get_sample_value("latlab_server_admission_limit", LABELS)
    for _ in range(3):  # three requests in, as if waiting on their batch
        admission.enter()
    stream = WatchedBody(body())
    response = app.test_client().post(INFER, input_stream=stream, headers={"Content-Type": "application/json"})
    assert response.status_code == 503 and response.headers["Retry-After"] == "1"
    assert orjson.loads(response.data) == {
        "error": "deployment is full (3 requests admitted: max_queue_size 2 waiting + 1 x max_batch_size 1 in flight)"
    }
    assert stream.reads == 0
    assert registry.get_sample_value("latlab_batcher_rejections_total", {**LABELS, "reason": "queue_full"}) == 1
    admission.leave()
    assert app.test_client().post(INFER, data=body(), content_type="application/json").status_code == 200
    assert admission.count == 2, "an answered request leaves"


def test_admission_off_admits_past_the_bound(build_app, tiny_model: Path) -> None:
    config = parse_config(
        {"server": {"admission": False}, "deployments": [{"name": "tiny", "model_path": str(tiny_model)}]}
    )
    app = build_app(config)
    admission = app.extensions["latlab"].deployments["tiny"].admission
    for _ in range(1000):
        admission.enter()
    assert app.test_client().post(INFER, data=body(), content_type="application/json").status_code == 200


def test_a_refusal_costs_less_than_reading_the_body(build_app, tiny_model: Path) -> None:
    """Side by side in one run: a refused 2 MB request against the same request read and found bad."""
    registry = CollectorRegistry()
    config = parse_config(
        {
            "server": {"max_body_bytes": 4 * 2**20},
            "deployments": [
                {
                    "name": "tiny",
                    "model_path": str(tiny_model),
                    "batcher": {"max_batch_size": 4, "max_queue_delay_ms": 5000.0, "max_queue_size": 1},
                }
            ],
        }
    )
    app = build_app(config, registry)
    route = app.wsgi_app
    big = orjson.dumps(
        {"inputs": [{"name": "nope", "shape": [1, 4], "datatype": "FP32", "data": [0.0] * 4}], "pad": "x" * 2 * 2**20}
    )
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": INFER,
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(big)),
    }

    def seconds(n: int = 30) -> list[float]:
        times = []
        for _ in range(n):
            started = time.perf_counter()
            route.answer({**environ, "wsgi.input": io.BytesIO(big)}, "tiny", None)
            times.append(time.perf_counter() - started)
        return sorted(times)

    read_and_refused = seconds()  # 400: unknown input name, found only after reading and parsing 2 MB
    first = hold_the_queue(app, registry)
    refused_at_once = seconds()
    app.extensions["latlab"].close()  # drains: the held request is answered now, not after its delay
    first.join(5.0)
    # The 90th percentile, not the slowest: one stall of this VM (1.26 ms once in a full run, against ~40 us
    # typical) says nothing about the refusal path, and three of thirty may stall without failing the test.
    print(
        f"server-side: refused at once p90 {refused_at_once[26] * 1e6:.0f} us (slowest "
        f"{refused_at_once[-1] * 1e6:.0f}), read and refused p50 {read_and_refused[15] * 1e6:.0f} us"
    )
    assert refused_at_once[26] < 0.2 * read_and_refused[15]


def test_over_http_a_refused_body_does_not_break_the_connection(tmp_path: Path, tiny_model: Path) -> None:
    """Granian must skip the body the fast refusal never read; the next request on the connection is answered."""
    deployments = [
        {
            "name": "tiny",
            "model_path": str(tiny_model),
            # the holder waits this long for its batch to fill: the window in which the queue is full (a busy
            # machine once took longer than 1.5 s to send the next request, and it was served)
            "batcher": {"max_batch_size": 4, "max_queue_delay_ms": 4000.0, "max_queue_size": 1},
        }
    ]
    with running_server(tmp_path, deployments) as server:
        holder = threading.Thread(target=lambda: requests.post(server.url + INFER, data=body(), timeout=30))
        holder.start()
        deadline = time.monotonic() + 5.0
        while server.metric("latlab_batcher_queue_depth", **LABELS) != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.metric("latlab_batcher_queue_depth", **LABELS) == 1, "the holder never queued"
        session = requests.Session()
        padded = body(1, pad="x" * 300_000)
        refused = session.post(
            server.url + INFER, data=padded, headers={"Content-Type": "application/json"}, timeout=10
        )
        holder.join(30)
        after = session.post(server.url + INFER, data=body(), headers={"Content-Type": "application/json"}, timeout=10)
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
        assert after.status_code == 200, after.text
        assert server.metric("latlab_server_requests_total", **LABELS, outcome="rejected") == 1
        assert server.alive()
