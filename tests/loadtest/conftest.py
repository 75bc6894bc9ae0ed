"""The load-test tests' real socket server on 127.0.0.1 (the `server` fixture): every way an HTTP answer can be
framed, chosen by the request's path, for the generator's HTTP clients (lean_http.py, loop_sender.py)."""

from __future__ import annotations

import socketserver
import threading
import time
from typing import Iterator

import pytest

from latlab.common import procs


def _answer(path: str) -> tuple[bytes, bool]:
    """The raw answer for a request path, and whether the server closes the connection after it."""
    if path == "/length":
        return b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\nhello", False
    if path == "/longer":  # /length's head but for its length
        return b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\nContent-Type: text/plain\r\n\r\nhello!!", False
    if path == "/chunked":
        return (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"4;ext=1\r\nwiki\r\n6\r\npedia \r\n0\r\nX-Trailer: t\r\n\r\n"
        ), False
    if path == "/to-close":
        return b"HTTP/1.1 200 OK\r\n\r\nuntil the end", True
    if path == "/busy":
        return b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 4\r\n\r\nfull", False
    if path == "/once":  # answers, then closes the kept-alive connection without saying so
        return b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", True
    if path == "/cut":
        return b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", True
    if path == "/garbage":
        return b"SSH-2.0-OpenSSH_9.6\r\n\r\n", True
    if path == "/close-header":
        return b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\nbye", True
    return b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", False


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.server.connections += 1
        buffer = b""
        while True:
            while b"\r\n\r\n" not in buffer:
                chunk = self.request.recv(65536)
                if not chunk:
                    return
                buffer += chunk
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            length = next((int(line.split(":")[1]) for line in lines if line.lower().startswith("content-length")), 0)
            while len(buffer) < length:
                chunk = self.request.recv(65536)
                if not chunk:  # the client left in the middle of its body
                    return
                buffer += chunk
            self.server.bodies.append(buffer[:length])
            buffer = buffer[length:]
            path = lines[0].split()[1]
            if path == "/silent":  # never answers: the connection stays open until the client gives up
                self.request.recv(1)
                return
            if path == "/length-split":  # /length's answer, its body in two reads: the same head, cut short first
                whole, _ = _answer("/length")
                self.request.sendall(whole[:-2])
                time.sleep(0.02)
                self.request.sendall(whole[-2:])
                continue
            raw, close = _answer(path)
            self.request.sendall(raw)
            if close:
                return


class StubServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.connections = 0
        self.bodies: list[bytes] = []


@pytest.fixture
def server() -> Iterator[StubServer]:
    served = StubServer(procs.free_port())
    thread = threading.Thread(target=served.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        served.shutdown()
        served.server_close()
