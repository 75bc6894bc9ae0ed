"""RSGI requests answered by a WSGI app on a few threads: the routes other than infer, under the RSGI interface."""

from __future__ import annotations

import asyncio
import io
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable

from granian.rsgi import ProtocolClosed, ProtocolError

from latlab.server.errors import BadRequest, PayloadTooLarge
from latlab.server.http.fastpath import Answer

WSGIApp = Callable[[dict, Callable], Iterable[bytes]]
_CLIENT_LEFT = "the client closed the connection before the body ended"


async def read_bounded(proto: Any, declared: int | None, limit: int) -> bytes:
    """An RSGI request's body, never more than `limit` bytes held: a body that passes it is refused (413) without
    reading the rest; `declared` (Content-Length, already checked against the limit) must be met exactly."""
    if declared is not None:
        # Granian holds the connection to the declared length: the whole body in one await (iterating costs an
        # await per chunk and one more for the end, each a hand-over between the event loop and Granian's threads)
        try:
            body = await proto() if declared > 0 else b""
        except (ProtocolClosed, ProtocolError):
            raise BadRequest(_CLIENT_LEFT) from None
        if len(body) != declared:
            raise BadRequest(_CLIENT_LEFT)
        return body
    parts: list[bytes] = []
    total = 0
    try:
        async for chunk in proto:
            total += len(chunk)
            if total > limit:
                raise PayloadTooLarge(f"body is over this server's limit of {limit} bytes (max_body_bytes)")
            parts.append(chunk)
    except (ProtocolClosed, ProtocolError):
        raise BadRequest(_CLIENT_LEFT) from None
    return b"".join(parts)


def environ_of(scope: Any, body: bytes) -> dict:
    """The WSGI environ of an RSGI request whose body was read whole (PEP 3333: the path as latin-1 text)."""
    server_host, _, server_port = scope.server.rpartition(":")
    client_host, _, client_port = scope.client.rpartition(":")
    environ = {
        "REQUEST_METHOD": scope.method,
        "SCRIPT_NAME": "",
        "PATH_INFO": scope.path.encode("utf-8", "surrogateescape").decode("latin-1"),
        "QUERY_STRING": scope.query_string,
        "SERVER_NAME": server_host,
        "SERVER_PORT": server_port,
        "SERVER_PROTOCOL": f"HTTP/{scope.http_version}",
        "REMOTE_ADDR": client_host,
        "REMOTE_PORT": client_port,
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.scheme,
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    for name, value in scope.headers.items():
        key = name.upper().replace("-", "_")
        if key in ("CONTENT_LENGTH", "TRANSFER_ENCODING"):
            continue  # the body was read whole: its length is said below
        key = key if key == "CONTENT_TYPE" else "HTTP_" + key
        environ[key] = f"{environ[key]},{value}" if key in environ else value
    environ["CONTENT_LENGTH"] = str(len(body))
    return environ


def call_wsgi(app: WSGIApp, environ: dict) -> Answer:
    """Run a WSGI app to the end: its status code, headers and whole body."""
    started: list = []

    def start_response(status: str, headers: list, exc_info: object = None) -> Callable[[bytes], None]:
        started[:] = [int(status.split(" ", 1)[0]), list(headers)]
        return lambda data: None  # the legacy write() callable: Flask never uses it

    chunks = app(environ, start_response)
    try:
        body = b"".join(chunks)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    return started[0], started[1], body


class WsgiOnThreads:
    """A WSGI app answering RSGI requests on `threads` threads of its own, so that the event loop never waits on a
    slow route."""

    def __init__(self, app: WSGIApp, threads: int, limit: int, on_threads: tuple[str, ...] = ()) -> None:
        """`on_threads`: paths always answered on the threads (slow to answer: /metrics)."""
        self._app = app
        self._limit = limit
        self._on_threads = on_threads
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="latlab-routes")

    async def answer(self, scope: Any, proto: Any) -> Answer:
        """The WSGI app's answer to an RSGI request (a body over the limit: 413, as MAX_CONTENT_LENGTH answers).
        A bodiless GET or HEAD other than `on_threads` paths is answered on the loop itself: health, metadata and
        config take microseconds, less than the hand-over to a thread and back (load generators probe them)."""
        headers = scope.headers
        length = headers.get("content-length")
        declared = int(length) if length is not None and length.isdigit() else None
        if declared is not None and declared > self._limit:
            raise PayloadTooLarge(
                f"body of {declared} bytes is over this server's limit of {self._limit} bytes (max_body_bytes)"
            )
        if declared is None and "transfer-encoding" not in headers:
            declared = 0  # no body: nothing to wait for
        body = await read_bounded(proto, declared, self._limit)
        environ = environ_of(scope, body)
        if not body and scope.method in ("GET", "HEAD") and scope.path not in self._on_threads:
            return call_wsgi(self._app, environ)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call_wsgi, self._app, environ)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
