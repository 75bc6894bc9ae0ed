"""latlab.server.http.native: the one-process server under the native interface, a real `latlab serve` on a free
port, driven by real HTTP clients and by raw sockets where the framing itself is under test."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import numpy as np
import orjson
import psutil
import pytest
import requests

from latlab.common import procs
from latlab.common.native_build import CACHE_ENV
from latlab.server.batching.batcher import WAIT_MARGIN_S
from latlab.server.config import FRONTENDS_ENV
from latlab.server.protocol import HEADER_LENGTH

from tests.conftest import build_tiny_model
from tests.reliability.conftest import (
    CLI,
    Server,
    wait_live,
    write_config,
    assert_error,
    output_of,
    running_server,
    tiny_body,
    tiny_y,
)


@pytest.fixture(scope="module", autouse=True)
def one_process() -> Iterator[None]:
    """The native interface serves one process: the suite's run with LATLAB_FRONTENDS=2 must not make these servers
    front ends."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(FRONTENDS_ENV, raising=False)
        yield


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    """One server for the tests that leave it as they found it (started once: a start loads a model)."""
    folder = tmp_path_factory.mktemp("native")
    model = build_tiny_model(folder / "tiny" / "model.onnx")
    deployment = {"name": "tiny", "model_path": str(model), "batcher": {"max_batch_size": 8}}
    with running_server(folder, [deployment], interface="native", max_body_bytes=4 << 20) as server:
        yield server


def address(server: Server) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").split(":")
    return host, int(port)


def raw_request(body: bytes, extra: str = "", version: str = "1.1") -> bytes:
    return (
        f"POST /v2/models/tiny/infer HTTP/{version}\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


def read_answer(sock: socket.socket, buffered: bytearray) -> tuple[int, dict, bytes]:
    """One HTTP answer (Content-Length framed) from `sock`, what follows it left in `buffered`."""
    while b"\r\n\r\n" not in buffered:
        chunk = sock.recv(65536)
        assert chunk, "the connection closed before an answer's head"
        buffered += chunk
    head, _, rest = bytes(buffered).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", 0))
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "the connection closed inside an answer's body"
        rest += chunk
    buffered[:] = rest[length:]
    return status, headers, rest[:length]


def value_of(body: bytes) -> np.ndarray:
    return np.asarray(orjson.loads(body)["outputs"][0]["data"], np.float32)


def test_json_infer_is_answered_and_counted(served: Server) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    labels = {"deployment": "tiny", "model": "tiny", "provider": "cpu", "outcome": "ok"}
    before = served.metric("latlab_server_requests_total", **labels)
    response = served.infer(tiny_body(x, id="r1"))
    assert response.status_code == 200 and response.headers["Content-Type"] == "application/json"
    assert response.json()["id"] == "r1" and "Date" in response.headers
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
    assert_error(served.infer(b"x" * (5 << 20)), 413, "max_body_bytes")
    chunked = served.session.post(
        f"{served.url}/v2/models/tiny/infer", data=iter([b"x" * (3 << 20), b"x" * (3 << 20)]), timeout=15
    )  # a generator body goes chunked: no length to refuse it by, so the limit cuts it while it is read
    assert_error(chunked, 413, "max_body_bytes")
    assert_error(served.infer(b"{}", headers={"Content-Type": "text/plain"}), 415)
    assert served.infer(tiny_body(np.ones((1, 4), np.float32))).status_code == 200  # the server still serves


def test_a_chunked_body_and_a_body_larger_than_one_take_are_read_whole(served: Server) -> None:
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    body = tiny_body(x)
    chunked = served.session.post(
        f"{served.url}/v2/models/tiny/infer", data=iter([body[:7], body[7:20], body[20:]]), timeout=15
    )
    assert chunked.status_code == 200
    np.testing.assert_allclose(output_of(chunked, (1, 3)), tiny_y(x), rtol=1e-5)
    padded = served.infer(body + b" " * (3 << 20))  # JSON allows trailing blanks: 3 MiB, past the first take buffer
    assert padded.status_code == 200
    np.testing.assert_allclose(output_of(padded, (1, 3)), tiny_y(x), rtol=1e-5)


def test_the_other_routes_go_to_flask(served: Server) -> None:
    config = served.session.get(f"{served.url}/v2/models/tiny/config", timeout=10).json()
    assert config["interface"] == "native" and config["frontends"] == 1
    assert served.session.get(f"{served.url}/v2/health/ready", timeout=10).status_code == 200
    head = served.session.head(f"{served.url}/v2/models/tiny", timeout=10)
    assert head.status_code == 200 and head.content == b"" and int(head.headers["Content-Length"]) > 0
    assert served.session.get(f"{served.url}/v2/models/tiny/infer", timeout=10).status_code == 405
    assert served.session.get(f"{served.url}/nowhere", timeout=10).status_code == 404
    assert "latlab_batcher_queue_depth{" in served.session.get(f"{served.url}/metrics", timeout=10).text


def test_pipelined_requests_are_answered_in_order_on_one_connection(served: Server) -> None:
    inputs = [np.full((1, 4), i, np.float32) for i in range(5)]
    with socket.create_connection(address(served), timeout=15) as sock:
        sock.sendall(b"".join(raw_request(tiny_body(x, id=str(i))) for i, x in enumerate(inputs)))
        buffered = bytearray()
        for i, x in enumerate(inputs):
            status, _headers, body = read_answer(sock, buffered)
            assert status == 200 and orjson.loads(body)["id"] == str(i)
            np.testing.assert_allclose(value_of(body), tiny_y(x).reshape(-1), rtol=1e-5)


def test_expect_continue_http10_and_keep_alive_framing(served: Server) -> None:
    x = np.ones((1, 4), np.float32)
    body = tiny_body(x)
    with socket.create_connection(address(served), timeout=15) as sock:
        head = raw_request(b"", "Expect: 100-continue\r\n").replace(
            b"Content-Length: 0", b"Content-Length: %d" % len(body)
        )
        sock.sendall(head)
        buffered = bytearray()
        status, _headers, _body = read_answer(sock, buffered)
        assert status == 100  # the client may send its body now
        sock.sendall(body)
        status, headers, answer = read_answer(sock, buffered)
        assert status == 200 and "close" not in headers.get("connection", "")
        sock.sendall(raw_request(body))  # the connection stays open for the next request
        assert read_answer(sock, buffered)[0] == 200
    with socket.create_connection(address(served), timeout=15) as sock:
        sock.sendall(raw_request(body, version="1.0"))
        buffered = bytearray()
        status, headers, answer = read_answer(sock, buffered)
        assert status == 200 and headers["connection"] == "close"
        assert sock.recv(1) == b""  # HTTP/1.0 without keep-alive: closed after the answer


def test_malformed_and_abandoned_requests_lose_nothing(served: Server) -> None:
    with socket.create_connection(address(served), timeout=15) as sock:
        sock.sendall(b"NONSENSE\r\n\r\n")
        status, headers, body = read_answer(sock, bytearray())
        assert status == 400 and headers["connection"] == "close" and b"error" in body
    with socket.create_connection(address(served), timeout=15) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nX-Long: " + b"a" * 70000 + b"\r\n\r\n")
        assert read_answer(sock, bytearray())[0] == 431
    for _ in range(3):  # a client that leaves mid-body, or just after sending
        with socket.create_connection(address(served), timeout=15) as sock:
            sock.sendall(raw_request(tiny_body(np.ones((1, 4), np.float32)))[:-5])
        with socket.create_connection(address(served), timeout=15) as sock:
            sock.sendall(raw_request(tiny_body(np.ones((1, 4), np.float32))))
    x = np.full((2, 4), 3, np.float32)
    response = served.infer(tiny_body(x))
    assert response.status_code == 200
    np.testing.assert_allclose(output_of(response, (2, 3)), tiny_y(x), rtol=1e-5)


def test_concurrent_connections_each_get_their_own_answer(served: Server) -> None:
    """Answers of shared batches go to the connection that asked: every request carries its own input."""

    def client(index: int) -> list[bool]:
        with requests.Session() as session:
            checks = []
            for k in range(15):
                x = np.full((1, 4), index * 100 + k, np.float32)
                response = session.post(f"{served.url}/v2/models/tiny/infer", data=tiny_body(x), timeout=15)
                checks.append(response.status_code == 200 and np.allclose(output_of(response, (1, 3)), tiny_y(x)))
            return checks

    with ThreadPoolExecutor(12) as pool:
        results = [check for checks in pool.map(client, range(12)) for check in checks]
    assert len(results) == 180 and all(results)


def test_a_connections_later_requests_outlive_its_first_requests_wait_limit(tmp_path: Path, tiny_model: Path) -> None:
    """Requests on one kept-alive connection share its token; the caller's wait limit of the first, passing while a
    later one waits, must give up only on the first (it was answered long before), never answer the later with 504."""
    batcher = {"max_batch_size": 8, "max_queue_delay_ms": 20, "timeout_ms": 50}
    deployment = {"name": "tiny", "model_path": str(tiny_model), "batcher": batcher}
    limit_s = batcher["timeout_ms"] / 1000 + WAIT_MARGIN_S
    x = np.ones((1, 4), np.float32)
    with running_server(tmp_path, [deployment], interface="native") as server:
        statuses = []
        started = time.monotonic()
        while time.monotonic() - started < 1.5 * limit_s:  # past the first request's limit, requests still arrive
            statuses.append(server.infer(tiny_body(x)).status_code)
        assert len(statuses) > 10 and set(statuses) == {200}
        assert (
            server.metric(
                "latlab_server_requests_total", deployment="tiny", model="tiny", provider="cpu", outcome="timeout"
            )
            == 0
        )


def test_without_a_place_to_build_its_native_part_the_server_says_why_and_stops(
    tmp_path: Path, tiny_model: Path
) -> None:
    blocked = tmp_path / "cache"
    blocked.write_text("a file, not a folder")  # latlab's cache folder cannot be made: nothing can be built
    config = write_config(
        tmp_path / "server.toml",
        [{"name": "tiny", "model_path": str(tiny_model)}],
        port=procs.free_port(),
        interface="native",
    )
    done = subprocess.run(
        [*CLI, "serve", "--config", str(config)],
        env={**os.environ, CACHE_ENV: str(blocked / "inside")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert 'interface = "native" needs its native part built' in done.stderr + done.stdout


def test_the_serve_command_chooses_the_interface(tmp_path: Path, tiny_model: Path) -> None:
    port = procs.free_port()
    config = write_config(tmp_path / "server.toml", [{"name": "tiny", "model_path": str(tiny_model)}], port=port)
    log = tmp_path / "server.log"
    process = procs.start([*CLI, "serve", "--config", str(config), "--interface", "native"], log_path=log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_live(url, process, log)
        assert requests.get(f"{url}/v2/models/tiny/config", timeout=10).json()["interface"] == "native"
        assert not psutil.Process(process.pid).children()  # served in its own process: no Granian worker
    finally:
        procs.stop(process)
