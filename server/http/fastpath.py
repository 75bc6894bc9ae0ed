"""The infer route as a thin WSGI layer in front of Flask, and the one mapping of serving errors to HTTP.

Profiling showed Flask's routing and request context costing about twice ONNX Runtime's own time on a
batch-1 request, so POST .../infer is answered here, from the WSGI environ, with the same checks, errors,
headers and metrics as a Flask route; every other path goes on to Flask."""

from __future__ import annotations

import logging
import re
import time
from typing import Any, Callable, Iterable, Iterator, Protocol

from flask import Response, request
from werkzeug.exceptions import HTTPException
from werkzeug.http import HTTP_STATUS_CODES, parse_options_header
from werkzeug.sansio.utils import get_content_length
from werkzeug.wsgi import get_input_stream

from latlab.server.config import ServerConfig
from latlab.server.errors import (
    BadRequest,
    ComputeError,
    ModelNotFound,
    ModelNotReady,
    PayloadTooLarge,
    QueueFull,
    RequestTimeout,
    ServingError,
    Unauthorized,
    UnsupportedMediaType,
)
from latlab.server.http.guards import (
    binary_header_length,
    check_bearer,
    check_content_type,
    check_length,
    read_body,
    read_declared,
)
from latlab.server.protocol import HEADER_LENGTH, InferRequest, decode_request, encode_error, encode_response

log = logging.getLogger("latlab.server")
WSGIApp = Callable[[dict, Callable], Iterable[bytes]]
Answer = tuple[int, list[tuple[str, str]], bytes]
"""Status, headers (without Content-Length) and body of one response."""

INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")
"""The Flask rules' shape: werkzeug's default converter takes one or more characters other than '/'."""
STATUS = {
    BadRequest: 400,
    Unauthorized: 401,
    ModelNotFound: 404,
    PayloadTooLarge: 413,
    UnsupportedMediaType: 415,
    ModelNotReady: 503,
    QueueFull: 503,
    RequestTimeout: 504,
    ComputeError: 500,
}
OUTCOME = {
    BadRequest: "bad_request",
    PayloadTooLarge: "bad_request",
    UnsupportedMediaType: "bad_request",
    ModelNotReady: "not_ready",
    QueueFull: "rejected",
    RequestTimeout: "timeout",
    ComputeError: "error",
}
_JSON = ("Content-Type", "application/json")
_ENV_HEADER_LENGTH = "HTTP_" + HEADER_LENGTH.upper().replace("-", "_")


class Served(Protocol):
    """What the infer route reads of a server: its settings and its deployments by name (app.ServerState in one
    process; a front end's FrontState, whose deployments forward to the engine)."""

    config: ServerConfig

    def get(self, name: str, version: str | None = None) -> Any:
        """The deployment serving `name` (at `version`), or ModelNotFound / ModelNotReady."""


def error_answer(exc: BaseException) -> Answer:
    """The response to an error: its status, `{"error": ...}` and the headers its kind calls for.
    Unexpected exceptions get a bare 500; their trace belongs in the log, not in the response."""
    if isinstance(exc, ServingError):
        headers = [_JSON]
        if isinstance(exc, QueueFull):
            headers.append(("Retry-After", "1"))
        if isinstance(exc, Unauthorized):
            headers.append(("WWW-Authenticate", 'Bearer realm="latlab"'))
        return STATUS.get(type(exc), 500), headers, encode_error(str(exc))
    if isinstance(exc, HTTPException):
        return exc.code or 500, [_JSON], encode_error(exc.description or exc.name)
    return 500, [_JSON], encode_error("internal server error")


def status_line(status: int) -> str:
    """As werkzeug writes it, so both layers answer alike."""
    return f"{status} {HTTP_STATUS_CODES.get(status, 'UNKNOWN').upper()}"


_BODY_READ = "latlab.body_read"
DRAIN_LIMIT_BYTES = 8 * 1024 * 1024


class DrainAfter:
    """An error answer sent before the request body was read (too large, wrong type, queue full): once the
    answer is out (the server calls close()), the unread body is read and dropped, up to DRAIN_LIMIT_BYTES.
    Closing a connection with unread bytes makes the kernel send a reset, which can reach the client
    before the answer does; a client then sees "connection reset" instead of the 413 or 503."""

    def __init__(self, chunks: list[bytes], environ: dict) -> None:
        self._chunks = chunks
        self._environ = environ

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._chunks)

    def close(self) -> None:
        try:
            remaining = int(self._environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return
        if not 0 < remaining <= DRAIN_LIMIT_BYTES:
            return
        stream = self._environ.get("wsgi.input")
        try:
            while remaining > 0 and (chunk := stream.read(min(remaining, 65536))):
                remaining -= len(chunk)
        except Exception:  # noqa: BLE001 - the client went away: nothing left to protect
            log.debug("request body not drained", exc_info=True)


class InferRoute:
    """WSGI middleware: answers POST /v2/models/{m}[/versions/{v}]/infer itself, passes the rest to `app`."""

    def __init__(self, app: WSGIApp, state: Served) -> None:
        self.app = app
        self.state = state

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        match = INFER_PATH.fullmatch(environ.get("PATH_INFO") or "")
        if match is None or environ.get("REQUEST_METHOD", "GET").upper() != "POST":
            return self.app(environ, start_response)
        # Path segments arrive latin-1 decoded (PEP 3333); werkzeug re-decodes them as UTF-8 the same way.
        name, version = (None if s is None else s.encode("latin1").decode(errors="replace") for s in match.groups())
        status, headers, body = self.answer(environ, name, version)
        headers.append(("Content-Length", str(len(body))))
        start_response(status_line(status), headers)
        if environ.get(_BODY_READ):  # every answer but an early refusal read the body
            return [body]
        return DrainAfter([body], environ)

    def answer(self, environ: dict, name: str, version: str | None) -> Answer:
        """The infer response for a request; never raises."""
        try:
            return self._infer(environ, name, version)
        except Exception as exc:  # noqa: BLE001 - every error becomes a response here, as in Flask's handlers
            if not isinstance(exc, (ServingError, HTTPException)):
                log.exception("unexpected error while serving %s", environ.get("PATH_INFO"))
            return error_answer(exc)

    def _infer(self, environ: dict, name: str, version: str | None) -> Answer:
        started = time.perf_counter()
        check_bearer(self.state.config.auth_token, environ.get("HTTP_AUTHORIZATION"))
        deployment = self.state.get(name, version)
        with Accounted(deployment, started) as account:
            length, binary_length = check_infer_headers(
                self.state.config.max_body_bytes,
                environ.get("CONTENT_LENGTH"),
                environ.get("HTTP_TRANSFER_ENCODING"),
                environ.get(_ENV_HEADER_LENGTH),
                environ.get("CONTENT_TYPE", ""),
            )
            account.admit()
            infer_request = self._read(environ, length, binary_length)
            outputs = deployment.infer(infer_request)
            return ok_answer(*encode_response(name, deployment.version, infer_request, outputs))

    def _read(self, environ: dict, length: int | None, binary_length: int | None) -> InferRequest:
        """The body, read and decoded, once the request was admitted."""
        limit = self.state.config.max_body_bytes
        if length is None:  # chunked: read up to one byte past the limit, to tell exactly the limit from more
            raw = read_body(get_input_stream(environ, max_content_length=limit + 1), limit)
        else:  # declared and within the limit: exactly that many bytes, with no stream wrapper around them
            raw = read_declared(environ["wsgi.input"], length)
        environ[_BODY_READ] = True
        return decode_request(raw, binary_length)


def check_infer_headers(
    limit: int, content_length: str | None, transfer_encoding: str | None, binary_header: str | None, content_type: str
) -> tuple[int | None, int | None]:
    """Size and content type of an infer request, checked before a byte of its body is read, from its header
    values; (declared length, binary header length), each None when absent."""
    length = get_content_length(content_length, transfer_encoding)
    check_length(length, limit)
    binary_length = binary_header_length(binary_header)
    if content_type != "application/json":  # the common case needs no parsing
        mimetype, params = parse_options_header(content_type)
        check_content_type(mimetype.lower(), params, binary_length is not None)
    return length, binary_length


def ok_answer(body: bytes, header_length: int | None) -> Answer:
    """A 200 with the body encode_response wrote: JSON, or binary tensors after a JSON header of `header_length`."""
    if header_length is None:
        return 200, [_JSON], body
    return 200, [("Content-Type", "application/octet-stream"), (HEADER_LENGTH, str(header_length))], body


class Ledger:
    """The metric writes of the requests one thread takes and answers in a pass, written once a pass (`flush`):
    each deployment's change of requests in flight as one write, its answers' outcomes and durations as one write
    per outcome's counter, per histogram bucket touched and to the sum, instead of five writes a request (each a
    lock and, in multiprocess mode, a file-backed value). The series and their meaning are Accounted's. Its
    server flushes it before it writes the pass's answers, so a client that has its answer finds its request
    counted in /metrics; admission is not deferred (the door's count is exact at every request)."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending: dict[int, list] = {}

    def _entry(self, deployment: Any) -> list:
        entry = self._pending.get(id(deployment))
        if entry is None:
            entry = self._pending[id(deployment)] = [deployment, 0, []]
        return entry

    def entered(self, deployment: Any) -> None:
        self._entry(deployment)[1] += 1

    def left(self, deployment: Any, outcome: str, seconds: float) -> None:
        entry = self._entry(deployment)
        entry[1] -= 1
        entry[2].append((outcome, seconds))

    def flush(self) -> None:
        for deployment, inflight, answers in self._pending.values():
            if inflight:
                deployment.metrics.inflight.inc(inflight)
            if answers:
                deployment.metrics.answered_many(answers)
        self._pending.clear()


class Accounted:
    """One infer request's bookkeeping, whatever the interface: in flight from entry, admitted at the door
    (`admit`), and on exit out of admission, out of flight, and counted with its outcome and duration; with a
    `ledger`, the metric writes are its (written once a pass), admission's are not."""

    __slots__ = ("_deployment", "_started", "_admitted", "_ledger")

    def __init__(self, deployment: Any, started: float, ledger: Ledger | None = None) -> None:
        self._deployment = deployment
        self._started = started
        self._admitted = False
        self._ledger = ledger

    def __enter__(self) -> "Accounted":
        if self._ledger is None:
            self._deployment.metrics.inflight.inc()
        else:
            self._ledger.entered(self._deployment)
        return self

    def admit(self) -> None:
        """The door: past its bound, 503 before the body is read; then a batch smaller than max_batch_size
        leaves the queue the bound."""
        self._deployment.admission.enter()
        self._admitted = True
        self._deployment.refuse_if_full()

    def __exit__(self, kind: type | None, error: BaseException | None, trace: object) -> None:
        if error is None:
            outcome = "ok"
        else:
            outcome = OUTCOME.get(type(error), "error") if isinstance(error, ServingError) else "error"
        deployment = self._deployment
        if self._admitted:
            deployment.admission.leave()
        if self._ledger is not None:
            self._ledger.left(deployment, outcome, time.perf_counter() - self._started)
            return
        deployment.metrics.inflight.dec()
        deployment.metrics.answered(outcome, time.perf_counter() - self._started)


def flask_infer_view(route: InferRoute) -> Callable[..., Response]:
    """The same route as a Flask view, so that Flask's URL map still knows it (a GET answers 405, not 404);
    requests reach it only when the app is called without the middleware."""

    def infer(name: str, version: str | None = None) -> Response:
        status, headers, body = route.answer(request.environ, name, version)
        return Response(body, status=status, headers=headers)

    return infer
