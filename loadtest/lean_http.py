"""The generator's HTTP/1.1 client for infer requests: keep-alive connections, requests encoded once.

Locust's FastHttpSession spends most of a request's client CPU on what a load generator never needs
(URL parsing, cookies, a liveness probe of the socket, response objects), and when the generator shares
the server's machine that CPU is taken from the server under test (figures: docs/performance.md). As wrk
does, every body is encoded once with its request line and headers (`Prepared`), so a request is one
`sendall` and a small parse of the answer. Responses may carry Content-Length, chunked encoding or
neither (read to close).

It runs under gevent (Locust patches `socket`), one connection per outstanding request, reused afterwards.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["Answer", "HttpError", "LeanClient", "Prepared"]

_HEAD_END = b"\r\n\r\n"
_READ = 65536


class HttpError(ConnectionError):
    """The server's answer was cut short or was not HTTP."""


@dataclass(frozen=True)
class Prepared:
    """One request, encoded once: request line, headers and body."""

    raw: bytes


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    """Header names in lower case."""
    body: bytes


class LeanClient:
    """Keep-alive connections to one `http://host:port` origin."""

    def __init__(self, base_url: str, timeout_s: float = 30.0, connect_timeout_s: float = 5.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the load generator speaks plain http://host:port, not {base_url!r}")
        self.address = (parts.hostname, parts.port or 80)
        self._host_header = parts.netloc
        self._prefix = parts.path.rstrip("/")
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._idle: list[socket.socket] = []

    def prepare(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> Prepared:
        lines = [
            f"{method} {self._prefix}{path} HTTP/1.1",
            f"Host: {self._host_header}",
            f"Content-Length: {len(body)}",
        ]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items() if name.lower() != "content-length"]
        return Prepared(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)

    def send(self, request: Prepared) -> Answer:
        """Send and read the whole answer. A kept-alive connection the server closed meanwhile is replaced
        once, when it failed before a single byte of the answer came; any other failure raises."""
        while self._idle:
            sock = self._idle.pop()
            try:
                return self._exchange(sock, request)
            except _Stale:
                continue
        try:
            return self._exchange(self._connect(), request)
        except _Stale as exc:
            raise HttpError("connection closed before any answer") from exc.__cause__

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self.address, timeout=self._connect_timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self._timeout_s)
        return sock

    def _exchange(self, sock: socket.socket, request: Prepared) -> Answer:
        try:
            try:
                sock.sendall(request.raw)
                first = sock.recv(_READ)
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise _Stale() from exc
            if not first:
                raise _Stale()
            answer, keep = _read_answer(sock, first)
        except BaseException:
            sock.close()
            raise
        if keep:
            self._idle.append(sock)
        else:
            sock.close()
        return answer


class _Stale(Exception):
    """The connection was closed before the answer began."""


def _read_answer(sock: socket.socket, received: bytes) -> tuple[Answer, bool]:
    """Parse one answer that begins with `received`; returns it and whether the connection stays open."""
    buffer = bytearray(received)
    while (end := buffer.find(_HEAD_END)) < 0:
        if len(buffer) > 1 << 20:
            raise HttpError("answer head over 1 MiB")
        buffer += _recv(sock)
    lines = bytes(buffer[:end]).decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    if not version.startswith("HTTP/") or not rest[:3].isdigit():
        raise HttpError(f"not an HTTP answer: {lines[0][:80]!r}")
    status = int(rest[:3])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    body = buffer[end + len(_HEAD_END) :]
    keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = _read_chunked(sock, body)
    elif "content-length" in headers:
        length = int(headers["content-length"])
        while len(body) < length:
            body += _recv(sock)
        del body[length:]
    elif status in (204, 304) or status < 200:
        body = bytearray()
    else:  # neither length nor chunks: the body runs to the end of the connection
        while chunk := sock.recv(_READ):
            body += chunk
        keep = False
    return Answer(status, headers, bytes(body)), keep


def _read_chunked(sock: socket.socket, buffer: bytearray) -> bytearray:
    body = bytearray()
    while True:
        while (eol := buffer.find(b"\r\n")) < 0:
            buffer += _recv(sock)
        size = int(bytes(buffer[:eol]).split(b";")[0], 16)
        del buffer[: eol + 2]
        if size == 0:  # trailers, if any, end with an empty line
            while (end := buffer.find(b"\r\n")) != 0:
                if end < 0:
                    buffer += _recv(sock)
                else:
                    del buffer[: end + 2]
            return body
        while len(buffer) < size + 2:
            buffer += _recv(sock)
        body += buffer[:size]
        del buffer[: size + 2]


def _recv(sock: socket.socket) -> bytes:
    chunk = sock.recv(_READ)
    if not chunk:
        raise HttpError("connection closed in the middle of an answer")
    return chunk
