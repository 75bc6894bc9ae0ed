"""The observer listener: /metrics, health, metadata and config on a port and threads of their own.

On the main port these routes share Granian's request threads with infer requests; when those threads are all
waiting on batches, a scrape or a readiness probe waits behind them (seconds under overload, docs/overload.md).
Here they have their own socket and a few threads of their own, in the same process (the app and its metrics
registry are the ones the infer route uses), as Triton gives its metrics a port.
"""

from __future__ import annotations

import io
import logging
import socket
import sys
import threading
from typing import Callable, Iterable
from urllib.parse import unquote_to_bytes

from latlab.server.errors import ConfigError
from latlab.server.protocol import encode_error

log = logging.getLogger("latlab.server.http.observer")
THREADS = 4
"""Observer requests answered at once; more wait in the listen backlog. Scrapers and probes are few."""
CLIENT_TIMEOUT_S = 2.0
"""A client that has not sent its request within this long is dropped: slow clients cannot hold the threads."""
MAX_HEAD_BYTES = 16 * 1024
METHODS = ("GET", "HEAD")
WSGIApp = Callable[[dict, Callable], Iterable[bytes]]


def read_only(app: WSGIApp) -> WSGIApp:
    """`app` for GET and HEAD only (health, metadata, config, metrics): infer stays on the main port, behind
    its admission bound. Other methods get 405 naming where to go."""

    def observe(environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD", "GET").upper() not in METHODS:
            body = encode_error("the observer port answers GET and HEAD only; infer on the main port")
            start_response(
                "405 METHOD NOT ALLOWED",
                [("Content-Type", "application/json"), ("Allow", "GET, HEAD"), ("Content-Length", str(len(body)))],
            )
            return [body]
        return app(environ, start_response)

    return observe


class Observer:
    """The listener: THREADS threads that each accept a connection, read one GET, answer it from `app` (read-only)
    and close it. Few blocking calls per request (accept, recv, send), each a point where a thread must win the
    GIL back from the busy request threads: a general-purpose server (werkzeug's: a new thread per connection,
    line-by-line reads and writes) answered 2-4x slower than Granian's main port under overload."""

    def __init__(self, app: WSGIApp, host: str, port: int, main: tuple[str, int] | None = None) -> None:
        """`main`: the server's main address; until it accepts a connection, /v2/health/ready here says not
        ready (this port opens first, while Granian is still to bind the main one: a probe that trusted it
        sent its first request to a closed port)."""
        self._app = read_only(app)
        self._main, self._main_seen = main, main is None
        self._socket = _listening(host, port)
        self.host, self.port = host.strip("[]"), self._socket.getsockname()[1]
        self._threads = [
            threading.Thread(target=self._serve, name=f"latlab-observer-{i}", daemon=True) for i in range(THREADS)
        ]
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        self._socket.shutdown(socket.SHUT_RDWR)  # wakes the threads blocked in accept()
        self._socket.close()
        for thread in self._threads:
            thread.join(CLIENT_TIMEOUT_S + 1)

    def _serve(self) -> None:
        while True:
            try:
                connection, address = self._socket.accept()
            except OSError:  # closed
                return
            with connection:
                try:
                    connection.settimeout(CLIENT_TIMEOUT_S)
                    connection.sendall(self._answer(_read_head(connection), address))
                except Exception:  # noqa: BLE001 - one client's failure must not end the thread serving all
                    log.debug("observer request failed", exc_info=True)

    def _answer(self, head: bytes, address: tuple) -> bytes:
        """The whole HTTP response to one request head."""
        try:
            environ = _environ(head, self.host, self.port, address)
        except ValueError as exc:
            return _response("400 BAD REQUEST", [("Content-Type", "application/json")], encode_error(str(exc)))
        if environ["PATH_INFO"] == "/v2/health/ready" and not self._main_listening():
            return _response("400 BAD REQUEST", [("Content-Type", "application/json")],
                             encode_error("not ready: the main port does not accept connections yet"))  # fmt: skip
        found: list = []
        chunks = self._app(environ, lambda status, headers, exc_info=None: found.extend((status, headers)))
        try:
            body = b"".join(chunks)
        finally:
            if hasattr(chunks, "close"):
                chunks.close()
        return _response(found[0], found[1], b"" if environ["REQUEST_METHOD"] == "HEAD" else body)

    def _main_listening(self) -> bool:
        """Whether the main port has accepted a connection (checked until it has once)."""
        if not self._main_seen:
            host, port = self._main  # type: ignore[misc]
            host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host.strip("[]"), host.strip("[]"))
            try:
                socket.create_connection((host, port), timeout=0.5).close()
                self._main_seen = True
            except OSError:
                return False
        return True


def _read_head(connection: socket.socket) -> bytes:
    """The request line and headers (observers' requests have no body); ValueError past MAX_HEAD_BYTES."""
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = connection.recv(MAX_HEAD_BYTES)
        if not chunk:
            raise ConnectionError("the client closed the connection before its request ended")
        head += chunk
        if len(head) > MAX_HEAD_BYTES:
            raise ValueError("request head too long")
    return head.split(b"\r\n\r\n", 1)[0]


def _environ(head: bytes, host: str, port: int, address: tuple) -> dict:
    """A WSGI environ (PEP 3333) for a request without a body."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise ValueError(f"malformed request line {lines[0][:100]!r}")
    method, target, version = parts
    path, _, query = target.partition("?")
    environ = {
        "REQUEST_METHOD": method,
        "SCRIPT_NAME": "",
        "PATH_INFO": unquote_to_bytes(path).decode("latin-1"),
        "QUERY_STRING": query,
        "SERVER_NAME": host,
        "SERVER_PORT": str(port),
        "SERVER_PROTOCOL": version,
        "REMOTE_ADDR": address[0] if address else "",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon:
            raise ValueError(f"malformed header line {line[:100]!r}")
        key = name.strip().upper().replace("-", "_")
        environ[key if key in ("CONTENT_TYPE", "CONTENT_LENGTH") else f"HTTP_{key}"] = value.strip()
    return environ


def _response(status: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    kept = [(k, v) for k, v in headers if k.lower() not in ("content-length", "connection")]
    lines = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in kept), f"Content-Length: {len(body)}", "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _listening(host: str, port: int) -> socket.socket:
    """A socket bound and listening, so a taken port is an OSError here (werkzeug would exit the process)."""
    host = host.strip("[]")
    sock = socket.socket(_family(host))
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def bindable(host: str, port: int) -> bool:
    """Whether a listener could bind host:port now (port 0: any free one)."""
    host = host.strip("[]")
    with socket.socket(_family(host)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the listener will
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _free_port(host: str) -> int:
    host = host.strip("[]")
    with socket.socket(_family(host)) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def observer_port(host: str, main_port: int, wanted: int) -> int:
    """The observer's port: `wanted` when set (ConfigError when it cannot be bound), else main_port + 1, or a
    free port when that one is taken (a warning names it: Prometheus configs expect main_port + 1)."""
    if wanted:
        if wanted == main_port:
            raise ConfigError(f"metrics port {wanted} is the main port: the observer needs a port of its own")
        if not bindable(host, wanted):
            raise ConfigError(f"metrics port {wanted} on {host} is in use")
        return wanted
    adjacent = main_port + 1
    if adjacent <= 65535 and bindable(host, adjacent):
        return adjacent
    port = _free_port(host)
    log.warning(
        "metrics port %d (port + 1) is in use: /metrics and health answer on port %d instead "
        "(GET /v2 says so as metrics_port)",
        adjacent,
        port,
    )
    return port
