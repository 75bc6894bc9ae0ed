"""The observer listener: /metrics, health, metadata and config on a port and threads of their own.

On the main port these routes share Granian's request threads with infer requests; when those threads are all
waiting on batches, a scrape or a readiness probe waits behind them (seconds under overload, docs/overload.md).
Here they have their own socket and a few threads of werkzeug's threaded HTTP server, in the same process
(the app and its metrics registry are the ones the infer route uses), as Triton gives its metrics a port.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Callable, Iterable

from werkzeug.serving import ThreadedWSGIServer, WSGIRequestHandler

from latlab.server.errors import ConfigError
from latlab.server.protocol import encode_error

log = logging.getLogger("latlab.server.observer")
MAX_THREADS = 16
"""Observer connections served at once; more wait in the listen backlog. Scrapers and probes are few."""
CLIENT_TIMEOUT_S = 5.0
"""A client that sends nothing for this long is dropped, so idle or slow clients cannot hold every thread."""
METHODS = ("GET", "HEAD")
WSGIApp = Callable[[dict, Callable], Iterable[bytes]]


def read_only(app: WSGIApp) -> WSGIApp:
    """`app` for GET and HEAD only (health, metadata, config, metrics): infer stays on the main port, behind
    its admission bound. Other methods get 405 naming where to go."""
    def observe(environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD", "GET").upper() not in METHODS:
            body = encode_error("the observer port answers GET and HEAD only; infer on the main port")
            start_response("405 METHOD NOT ALLOWED", [("Content-Type", "application/json"), ("Allow", "GET, HEAD"),
                                                      ("Content-Length", str(len(body)))])
            return [body]
        return app(environ, start_response)
    return observe


class _QuietHandler(WSGIRequestHandler):
    timeout = CLIENT_TIMEOUT_S

    def log(self, type: str, message: str, *args: object) -> None:  # noqa: A002 - the base class's names
        """Silent: a line per scrape would flood the server's log."""


class _BoundedServer(ThreadedWSGIServer):
    """A thread per connection (werkzeug answers one request per connection), at most MAX_THREADS at once."""

    def __init__(self, sock: socket.socket, app: WSGIApp) -> None:
        self._slots = threading.BoundedSemaphore(MAX_THREADS)
        host, port = sock.getsockname()[:2]
        super().__init__(host, port, app, _QuietHandler, fd=sock.fileno())
        sock.close()  # the server works on its own duplicate of the descriptor

    def process_request(self, request, client_address) -> None:
        self._slots.acquire()  # past MAX_THREADS, connections wait in the listen backlog
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class Observer:
    """The listener, serving `app` read-only from a daemon thread until close(). OSError when it cannot bind."""

    def __init__(self, app: WSGIApp, host: str, port: int) -> None:
        self._server = _BoundedServer(_listening(host, port), read_only(app))
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="latlab-observer", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


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
    log.warning("metrics port %d (port + 1) is in use: /metrics and health answer on port %d instead "
                "(GET /v2 says so as metrics_port)", adjacent, port)
    return port
