"""The server under the native interface ([server] interface = "native", one process): one native thread
(native_http.c) owns every connection and frames every request; one Python thread takes everything that arrived
in one call, hands the infer requests of each pass to their batchers together, and the batcher's worker writes
each answer to its connection itself. The other routes go to the Flask app, as under RSGI.

Under WSGI a request costs its request thread's wake-ups and the interpreter's lock handed over on each; under
RSGI, Granian's runtime thread hands every request, body and answer to the event loop (docs/performance.md).
Here a burst of arrivals is one wake-up of one thread, and an answer leaves from the thread that computed it."""

from __future__ import annotations

import ctypes
import io
import logging
import socket
import struct
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from email.utils import formatdate
from pathlib import Path
from typing import Any, Callable
from urllib.parse import unquote_to_bytes

from werkzeug.exceptions import HTTPException

from latlab.common.native_build import build
from latlab.server.batching.batch_queue import Slot
from latlab.server.config import SPARE_THREADS
from latlab.server.errors import BadRequest, ConfigError, PayloadTooLarge, ServingError
from latlab.server.http.app import ServerState
from latlab.server.http.bridge import call_wsgi
from latlab.server.http.fastpath import (
    INFER_PATH,
    Accounted,
    Ledger,
    check_infer_headers,
    error_answer,
    ok_answer,
    status_line,
)
from latlab.server.http.guards import check_bearer
from latlab.server.protocol import InferRequest, decode_request, encode_response
from latlab.server.runtime.deployment import Deployment, picked, tokenized

log = logging.getLogger("latlab.server")
SOURCE = Path(__file__).with_name("native_http.c")
MAX_CONNECTIONS = 4096
"""Connections held open at once; past it, new ones wait unaccepted (as Granian's backpressure)."""
POLL_MS = 100
DRAIN_LIMIT_S = 30.0
"""Longest a stopping server waits for the requests it holds to be answered."""
FIRST_TAKE_BYTES = 1 << 20
RECORD = struct.Struct("<QIIQIId16I")
"""native_http.c's nh_record: token, flags, head, body and peer lengths, the record's length, when the request was
read whole (time.perf_counter's clock), then the offset and length in the head of the method, path, query,
Content-Type, Authorization, Inference-Header-Content-Length, Content-Length and Transfer-Encoding."""
TOO_LARGE, CHUNKED, CLOSE, BAD = 1, 2, 4, 8
_FIELDS = 8
_lock = threading.Lock()
_built: tuple[ctypes.CDLL | None, str] | None = None


def library() -> tuple[ctypes.CDLL | None, str]:
    """The built native HTTP side, and ""; or None and why it could not be built (once per process)."""
    global _built
    with _lock:
        if _built is None:
            try:
                lib, why = build(SOURCE)
            except OSError as exc:
                lib, why = None, f"{type(exc).__name__}: {exc}"
            if lib is not None:
                lib.nh_new.restype = ctypes.c_void_p
                lib.nh_new.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int]
                lib.nh_take.restype = ctypes.c_int64
                lib.nh_take.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
                lib.nh_reply.restype = ctypes.c_int
                lib.nh_reply.argtypes = [
                    ctypes.c_void_p,
                    ctypes.c_uint64,
                    ctypes.c_char_p,
                    ctypes.c_int64,
                    ctypes.c_int,
                ]
                lib.nh_notify.restype = ctypes.c_int
                lib.nh_notify.argtypes = [ctypes.c_void_p]
                for name in ("nh_wake", "nh_stop_accepting", "nh_free"):
                    getattr(lib, name).argtypes = [ctypes.c_void_p]
            _built = lib, why
        return _built


class Waiting:
    """An infer request handed to its batcher: what its answer needs."""

    __slots__ = ("token", "name", "deployment", "request", "account", "close", "slot", "serial", "header")

    def __init__(
        self, token: int, name: str, deployment: Deployment, request: InferRequest, account: Accounted, close: bool
    ) -> None:
        self.token = token
        self.name = name
        self.deployment = deployment
        self.request = request
        self.account = account
        self.close = close
        self.slot: Slot | None = None
        self.serial = 0
        self.header: dict | None = None
        """Its call's header, where an engine process computes it (server/processes/native_frontend.py)."""


class Dates:
    """The Date header, formatted once a second."""

    def __init__(self) -> None:
        self._second = 0
        self._line = b""

    def line(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second, self._line = now, f"Date: {formatdate(now, usegmt=True)}\r\n".encode()
        return self._line


class NativeServer:
    """`state`'s deployments served on `sock` (listening): infer by the dispatcher thread and the batchers'
    workers, the rest by the WSGI app `routes` (the Flask app: bodiless GETs on the dispatcher, /metrics and
    bodies on SPARE_THREADS threads)."""

    def __init__(self, state: ServerState, routes: Callable, sock: socket.socket) -> None:
        lib, why = library()
        if lib is None:
            raise ConfigError(f'[server] interface = "native" needs its native part built: {why}')
        self.lib = lib
        self.routes = routes
        self.state = state
        self.config = self.state.config
        self.sock = sock
        self.server_address = sock.getsockname()[:2]
        self.handle = lib.nh_new(sock.fileno(), self.config.max_body_bytes, MAX_CONNECTIONS)
        if not self.handle:
            raise ConfigError("the native HTTP thread could not start")
        self._buffer = bytearray(FIRST_TAKE_BYTES)
        self._address = ctypes.addressof(ctypes.c_char.from_buffer(self._buffer))
        self.waiting: dict[int, Waiting] = {}
        """Infer requests with a batcher, by token: whoever pops one (its answer, or its time limit) answers it."""
        self._limits: dict[int, deque[tuple[float, int, int]]] = {}
        """Per batcher, (time past which its caller gives up, token, serial) in arrival order: one wait limit per
        batcher. Numbers, not the calls: an answered call (its request, its outputs) is freed at once, not kept
        until its limit passes."""
        self._serial = 0
        self._routes = ThreadPoolExecutor(SPARE_THREADS, thread_name_prefix="latlab-routes")
        self._dates = Dates()
        self._ledger: Ledger | None = None
        """The infer requests' metric writes, gathered and written once a pass (a native front end's); None: each
        request's written as it enters and leaves (one process: its answers leave on the batchers' threads)."""
        self.stopping = threading.Event()
        self._drain_until: float | None = None

    # the dispatcher

    def serve_forever(self) -> None:
        """Take and dispatch requests until stop(); then answer what is held (up to DRAIN_LIMIT_S) and return."""
        while True:
            self._take(POLL_MS)
            if self._pass_over():
                return

    def _take(self, timeout_ms: int) -> int:
        """Take what arrived (waiting up to `timeout_ms` for a request) and dispatch it; the bytes taken."""
        taken = self.lib.nh_take(self.handle, self._address, len(self._buffer), timeout_ms)
        while taken < 0:  # one request larger than the buffer
            self._buffer = bytearray(-taken * 2)
            self._address = ctypes.addressof(ctypes.c_char.from_buffer(self._buffer))
            taken = self.lib.nh_take(self.handle, self._address, len(self._buffer), 0)
        if taken:
            self._dispatch(memoryview(self._buffer)[:taken])
        return taken

    def _pass_over(self) -> bool:
        """The end of a pass: expired calls answered; True once stopping and what is held is answered (or the
        drain's limit passed)."""
        if self._limits:
            self._expire()
        if not self.stopping.is_set():
            return False
        if self._drain_until is None:
            self.lib.nh_stop_accepting(self.handle)
            self._drain_until = time.monotonic() + DRAIN_LIMIT_S
        return not self.waiting or time.monotonic() > self._drain_until

    def stop(self) -> None:
        self.stopping.set()
        self.lib.nh_wake(self.handle)

    def close(self) -> None:
        """Stop the native thread (every connection closes) and the route threads."""
        self._routes.shutdown(wait=True, cancel_futures=True)
        self.lib.nh_free(self.handle)
        self.handle = None

    def _dispatch(self, taken: memoryview) -> None:
        """Every request of one take: infer requests checked and decoded here, then handed to their batchers
        together (`submit_many`: one lock, one gauge write, one wake-up per deployment); a lone one is submitted to
        run on this thread when it can (saving the hand-over to the worker and back), the rest answered here or on
        the route threads."""
        offset, end = 0, len(taken)
        unpack = RECORD.unpack_from
        groups: dict[int, tuple] = {}
        count = 0
        while offset < end:
            token, flags, head_length, body_length, peer_length, length, arrived, *fields = unpack(taken, offset)
            start = offset + RECORD.size
            head = taken[start : start + head_length]
            body = bytes(taken[start + head_length + peer_length : start + head_length + peer_length + body_length])
            offset += length
            count += 1
            try:
                if flags & BAD:
                    raise BadRequest("malformed HTTP request")
                method = _field(head, fields, 0)
                raw_path = bytes(head[fields[2] : fields[2] + fields[3]])
                path = (unquote_to_bytes(raw_path) if b"%" in raw_path else raw_path).decode("latin-1")
                match = INFER_PATH.fullmatch(path) if method == "POST" else None
                if match is not None:
                    self._infer(token, flags, head, fields, body, match.groups(), groups, arrived)
                else:
                    peer = bytes(taken[start + head_length : start + head_length + peer_length]).decode("latin-1")
                    self._route(token, flags, bytes(head), body, peer, method, path, _field(head, fields, 2))
            except Exception as exc:  # noqa: BLE001 - every error becomes a response
                if not isinstance(exc, (ServingError, HTTPException)):
                    log.exception("unexpected error while reading a request")
                self._reply(token, *error_answer(exc), close=bool(flags & (CLOSE | BAD)))
        if groups:
            self._send(groups, count)

    def _send(self, groups: dict, count: int) -> None:
        """The infer requests of one take (`count` requests in all), to their batchers."""
        for batcher, calls, arguments in groups.values():
            if count == 1 and len(calls) == 1 and calls[0].deployment.config.batcher.instances == 1:
                self._submitted(batcher, calls, [_outcome(batcher.submit, *arguments[0], run_here=True)])
            else:
                self._submitted(batcher, calls, batcher.submit_many(arguments))

    def _infer(
        self,
        token: int,
        flags: int,
        head: memoryview,
        fields: list[int],
        body: bytes,
        names: tuple,
        groups: dict,
        arrived: float,
    ) -> None:
        """Check and decode one infer request; add it to its deployment's share of `groups`, or answer its error.
        Its time in the server counts from when the native thread had read it whole (`arrived`): a request that
        waited for this thread (busy with a lone request's model run, or with the requests before it) waited in
        the server."""
        started = arrived
        config = self.config
        close = bool(flags & CLOSE)
        name, version = (None if s is None else s.encode("latin1").decode(errors="replace") for s in names)
        check_bearer(config.auth_token, _field(head, fields, 4, None))
        deployment = self.state.get(name, version)
        account = Accounted(deployment, started, self._ledger).__enter__()
        try:
            if flags & TOO_LARGE and flags & CHUNKED:
                raise PayloadTooLarge(
                    f"body is over this server's limit of {config.max_body_bytes} bytes (max_body_bytes)"
                )
            _length, binary_length = check_infer_headers(
                config.max_body_bytes,
                _field(head, fields, 6, None),
                _field(head, fields, 7, None),
                _field(head, fields, 5, None),
                _field(head, fields, 3, ""),
            )
            account.admit()
            request = decode_request(body, binary_length)
            self._queue(Waiting(token, name, deployment, request, account, close), groups)
        except BaseException as exc:
            account.__exit__(type(exc), exc, None)
            raise

    def _queue(self, call: Waiting, groups: dict) -> None:
        """Add a decoded request to its batcher's share of `groups` (raises its error)."""
        deployment, request = call.deployment, call.request
        deployment.check_outputs(request.outputs)
        inputs = tokenized(deployment.text, deployment.metrics, request)
        arguments = deployment.queued(inputs, request.outputs, request.parameters, request.finite)
        batcher = deployment.batcher
        share = groups.get(id(batcher))
        if share is None:
            share = groups[id(batcher)] = (batcher, [], [])
        share[1].append(call)
        share[2].append(arguments)

    def _submitted(self, batcher: Any, calls: list[Waiting], outcomes: list) -> None:
        """Hold each submitted call until its slot is answered (or its caller's time limit passes); answer a
        refused one with its error."""
        for call, outcome in zip(calls, outcomes):
            if isinstance(outcome, BaseException):
                self._finish(call, None, outcome)
                continue
            call.slot = outcome
            self._hold(id(batcher), batcher.wait_limit_s, (call,))
            outcome.when_done(lambda slot, c=call: self._answered(c, slot))

    def _hold(self, key: int, wait_s: float, calls: Any) -> None:
        """Hold `calls` until answered or until `wait_s` passed (one wait limit per `key`)."""
        limits = self._limits.get(key)
        if limits is None:
            limits = self._limits[key] = deque()
        limit = time.monotonic() + wait_s
        waiting = self.waiting
        for call in calls:
            self._serial += 1
            call.serial = self._serial
            waiting[call.token] = call
            limits.append((limit, call.token, call.serial))

    def _answered(self, call: Waiting, slot: Slot) -> None:
        """On the thread that answered the slot (a batcher worker, or this one): the answer goes out from here."""
        if self.waiting.pop(call.token, None) is None:
            return  # its caller's time limit passed first: answered already
        try:
            outputs = picked(slot.result(0), call.request.outputs)
        except Exception as exc:  # noqa: BLE001 - the request's error is its answer
            self._finish(call, None, exc)
            return
        self._finish(call, outputs, None)

    def _finish(self, call: Waiting, outputs: dict | None, error: BaseException | None) -> None:
        if error is None:
            try:
                body, header_length = encode_response(call.name, call.deployment.version, call.request, outputs)
            except Exception as exc:  # noqa: BLE001
                error = exc
        call.account.__exit__(None if error is None else type(error), error, None)
        if error is None:
            if header_length is None:
                self._reply_ok(call.token, body, call.close)
            else:
                self._reply(call.token, *ok_answer(body, header_length), close=call.close)
            return
        if not isinstance(error, (ServingError, HTTPException)):
            log.error("unexpected error answering a request", exc_info=error)
        self._reply(call.token, *error_answer(error), close=call.close)

    def _expire(self) -> None:
        """Answer 504 to the requests whose callers would have given up by now (a stuck model run: the batcher
        itself expires a request that waits in its queue past its deadline)."""
        now = time.monotonic()
        for key, limits in list(self._limits.items()):
            while limits and limits[0][0] <= now:
                _limit, token, serial = limits.popleft()
                # a connection's next request has the same token: only this call, if still waiting, is given up
                call = self.waiting.get(token)
                if call is not None and call.serial == serial and self.waiting.pop(token, None) is call:
                    self._give_up(call)
            if not limits:
                del self._limits[key]

    def _give_up(self, call: Waiting) -> None:
        """Answer a call whose caller's time limit passed (504)."""
        call.slot.cancel()
        self._finish(call, None, call.deployment.batcher.gave_up())

    # the other routes

    def _route(
        self, token: int, flags: int, head: bytes, body: bytes, peer: str, method: str, path: str, query: str
    ) -> None:
        close = bool(flags & CLOSE)
        if flags & TOO_LARGE:
            raise PayloadTooLarge(
                f"body is over this server's limit of {self.config.max_body_bytes} bytes (max_body_bytes)"
            )
        environ = self._environ(head, body, peer, method, path, query)
        if self._inline(method, path, body):
            self._answer_route(token, environ, close)  # microseconds: less than a hand-over to a thread
        else:
            self._routes.submit(self._answer_route, token, environ, close)

    def _inline(self, method: str, path: str, body: bytes) -> bool:
        """Whether a route is answered on the dispatcher: the bodiless GETs but /metrics, all from memory here."""
        return not body and method in ("GET", "HEAD") and path != "/metrics"

    def _answer_route(self, token: int, environ: dict, close: bool) -> None:
        try:
            status, headers, body = call_wsgi(self.routes, environ)
        except Exception as exc:  # noqa: BLE001 - a route's failure is its answer
            log.exception("unexpected error in %s", environ.get("PATH_INFO"))
            status, headers, body = error_answer(exc)
        self._reply(token, status, headers, body, close, head=environ["REQUEST_METHOD"] == "HEAD")

    def _environ(self, head: bytes, body: bytes, peer: str, method: str, path: str, query: str) -> dict:
        """The WSGI environ of a request whose body was read whole (PEP 3333: the path as latin-1 text)."""
        lines = head.decode("latin-1").split("\r\n")
        version = lines[0].rsplit(" ", 1)[-1]
        environ = {
            "REQUEST_METHOD": method,
            "SCRIPT_NAME": "",
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "SERVER_NAME": str(self.server_address[0]),
            "SERVER_PORT": str(self.server_address[1]),
            "SERVER_PROTOCOL": version,
            "REMOTE_ADDR": peer,
            "REMOTE_PORT": "0",
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(body),
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
        }
        for line in lines[1:]:
            if not line:
                continue
            name, _, value = line.partition(":")
            key = name.strip().upper().replace("-", "_")
            if key in ("CONTENT_LENGTH", "TRANSFER_ENCODING"):
                continue  # the body was read whole: its length is said below
            key = key if key == "CONTENT_TYPE" else "HTTP_" + key
            value = value.strip()
            environ[key] = f"{environ[key]},{value}" if key in environ else value
        environ["CONTENT_LENGTH"] = str(len(body))
        return environ

    # answers

    def _reply_ok(self, token: int, body: bytes, close: bool) -> None:
        """A 200 with a JSON body: the infer route's common answer, written in one format call."""
        data = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s%s\r\n%s" % (
            len(body),
            self._dates.line(),
            b"Connection: close\r\n" if close else b"",
            body,
        )
        if self.handle is not None:
            self.lib.nh_reply(self.handle, token, data, len(data), close)

    def _reply(
        self, token: int, status: int, headers: list, body: bytes, close: bool = False, head: bool = False
    ) -> None:
        lines = [f"HTTP/1.1 {status_line(status)}\r\n"]
        has_length = False
        for key, value in headers:
            if key.lower() == "content-length":
                has_length = True
            lines.append(f"{key}: {value}\r\n")
        if not has_length:
            lines.append(f"Content-Length: {len(body)}\r\n")
        if close:
            lines.append("Connection: close\r\n")
        data = "".join(lines).encode("latin-1") + self._dates.line() + b"\r\n" + (b"" if head else body)
        if self.handle is not None:
            self.lib.nh_reply(self.handle, token, data, len(data), close)


def _field(head: memoryview, fields: list[int], index: int, default: str | None = "") -> str | None:
    """A field native_http.c located in the head, as text; `default` when the head has none."""
    offset, length = fields[2 * index], fields[2 * index + 1]
    if not length and not offset:
        return default
    return bytes(head[offset : offset + length]).decode("latin-1")


def _outcome(submit: Any, *arguments: Any, **options: Any) -> Slot | BaseException:
    try:
        return submit(*arguments, **options)
    except ServingError as exc:
        return exc


def listening_socket(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A listening TCP socket on host:port (IPv6 where the host is), address reuse on; `reuse_port`: one of
    several on the port, each given its share of new connections by the kernel."""
    infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _name, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    sock.listen(1024)
    sock.setblocking(False)
    return sock
