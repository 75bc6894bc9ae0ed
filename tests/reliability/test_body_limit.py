"""Bodies over max_body_bytes against the real server (Granian): 413 before the body is read whole."""

from __future__ import annotations

import socket
import threading
import time
from typing import Iterator
from urllib.parse import urlsplit

import numpy as np
import pytest
import requests

from tests.reliability.conftest import COUNTS, MAX_BODY, Server, assert_error, output_of, tiny_body, tiny_y

pytestmark = pytest.mark.e2e
X = np.ones((1, 4), np.float32)


SOCKET_TIMEOUT_S = 10.0  # the client's patience; a server waiting for the gigabyte would exhaust it


def connect(server: Server) -> socket.socket:
    parts = urlsplit(server.url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=SOCKET_TIMEOUT_S)
    return sock


def read_response(sock: socket.socket, timeout_s: float = SOCKET_TIMEOUT_S) -> bytes:
    """Everything the server sends until it closes the connection (or the timeout)."""
    sock.settimeout(timeout_s)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return data


def status_and_body(raw: bytes) -> tuple[int, bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def assert_still_serving(server: Server) -> None:
    response = server.infer(tiny_body(X))
    assert response.status_code == 200
    np.testing.assert_allclose(output_of(response, (1, 3)), tiny_y(X), rtol=1e-5)


def test_declared_length_over_the_limit_is_413_before_any_body_is_sent(shared_server: Server) -> None:
    declared = 1024**3  # a gigabyte announced; only the headers and a few bytes ever go out
    with connect(shared_server) as sock:
        sock.sendall(
            b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b'Content-Length: %d\r\n\r\n{"in' % declared
        )
        started = time.monotonic()
        raw = read_response(sock)
    status, body = status_and_body(raw)
    assert status == 413, raw[:300]
    assert f"body of {declared} bytes is over this server's limit of {MAX_BODY} bytes".encode() in body
    assert time.monotonic() - started < SOCKET_TIMEOUT_S / 2  # answered without waiting for the gigabyte
    assert_still_serving(shared_server)
    COUNTS["bad requests (body limit)"] += 1


def test_chunked_body_over_the_limit_is_413_and_the_rest_is_never_read(shared_server: Server) -> None:
    """No Content-Length to check up front: the server must stop reading once past the limit."""
    total = 64 * 1024 * 1024  # 1024 times the limit
    chunk = b"%x\r\n" % 65536 + b" " * 65536 + b"\r\n"
    sent = 0
    with connect(shared_server) as sock:
        sock.sendall(
            b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        responses: list[bytes] = []
        reader = threading.Thread(target=lambda: responses.append(read_response(sock, 20)))
        reader.start()
        try:
            while sent < total:
                sock.sendall(chunk)
                sent += 65536
        except OSError:  # the server answered and closed: nobody reads the rest
            pass
        reader.join(30)
    status, body = status_and_body(responses[0])
    assert status == 413, responses[0][:300]
    assert f"limit of {MAX_BODY} bytes".encode() in body
    assert sent < total / 4, f"the client could send {sent} bytes: the server read far past the limit"
    assert_still_serving(shared_server)
    COUNTS["bad requests (body limit)"] += 1


def padded(size: int) -> bytes:
    """A valid request padded with JSON whitespace to exactly `size` bytes."""
    body = tiny_body(X)
    return body[:-1] + b" " * (size - len(body)) + b"}"


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_limit_is_exact(shared_server: Server, chunked: bool) -> None:
    url = f"{shared_server.url}/v2/models/tiny/infer"

    def send(data: bytes) -> requests.Response:
        payload: bytes | Iterator[bytes] = iter([data[:1000], data[1000:]]) if chunked else data
        return requests.post(url, data=payload, headers={"Content-Type": "application/json"}, timeout=15)

    at_limit = send(padded(MAX_BODY))
    assert at_limit.status_code == 200, at_limit.content
    np.testing.assert_allclose(output_of(at_limit, (1, 3)), tiny_y(X), rtol=1e-5)
    assert_error(send(padded(MAX_BODY + 1)), 413, f"limit of {MAX_BODY} bytes")
    COUNTS["bad requests (body limit)"] += 1
