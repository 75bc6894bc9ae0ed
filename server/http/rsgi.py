"""The server under Granian's RSGI interface: every waiting infer request is a coroutine on one event loop, and a
batch's answers reach the loop with one wake-up; the other routes go to the Flask app on a few threads."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from typing import Any

from flask import Flask
from werkzeug.exceptions import HTTPException

from latlab.server.config import SPARE_THREADS
from latlab.server.errors import ServingError
from latlab.server.http.answers import LoopAnswers
from latlab.server.http.app import ServerState
from latlab.server.http.bridge import WsgiOnThreads, read_bounded
from latlab.server.http.fastpath import (
    DRAIN_LIMIT_BYTES,
    INFER_PATH,
    Accounted,
    Answer,
    check_infer_headers,
    error_answer,
    ok_answer,
)
from latlab.server.http.guards import check_bearer
from latlab.server.protocol import HEADER_LENGTH, InferRequest, decode_request, encode_response
from latlab.server.runtime.deployment import Deployment, picked, tokenized

log = logging.getLogger("latlab.server")
_BINARY_HEADER = HEADER_LENGTH.lower()
SWITCH_INTERVAL_S = 0.0005
"""The interpreter's switch interval in an RSGI process. The event loop holds the interpreter's lock while it works,
and the threads that need it briefly (Granian's, handing over each new request or body; the batcher's worker,
starting or answering a batch) wait until the holder lets go: at most the switch interval each time, 5 ms by
default, which under load queued requests behind one another until their tail latency was that of many such
waits (docs/performance.md)."""


class RsgiApp:
    """The RSGI application: POST .../infer answered here, on the event loop Granian runs it on; every other
    request answered by `app` (the Flask app, which holds the state and the metrics): bodiless GETs on the loop,
    /metrics and the rest on SPARE_THREADS threads (bridge.WsgiOnThreads)."""

    def __init__(self, app: Flask) -> None:
        self.flask = app
        self.state: ServerState = app.extensions["latlab"]
        self._routes = WsgiOnThreads(app.wsgi_app, SPARE_THREADS, self.state.config.max_body_bytes, ("/metrics",))
        self._answers: LoopAnswers | None = None

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._answers = LoopAnswers(loop)

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._routes.close()

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        if scope.proto != "http":  # websockets: no route takes them
            proto.close(404)
            return
        match = INFER_PATH.fullmatch(scope.path)
        if match is not None and scope.method == "POST":
            await self._infer_route(scope, proto, *match.groups())
            return
        try:
            status, headers, body = await self._routes.answer(scope, proto)
        except (ServingError, HTTPException) as exc:
            status, headers, body = error_answer(exc)
        proto.response_bytes(status, headers, body)

    async def _infer_route(self, scope: Any, proto: Any, name: str, version: str | None) -> None:
        read = [False]
        try:
            status, headers, body = await self._infer(scope, proto, name, version, read)
        except Exception as exc:  # noqa: BLE001 - every error becomes a response, as in the WSGI path
            if not isinstance(exc, (ServingError, HTTPException)):
                log.exception("unexpected error while serving %s", scope.path)
            status, headers, body = error_answer(exc)
        proto.response_bytes(status, headers, body)
        if not read[0]:
            await _drain(scope, proto)

    async def _infer(self, scope: Any, proto: Any, name: str, version: str | None, read: list[bool]) -> Answer:
        """The infer answer; `read[0]` set once the body was read (an early refusal leaves it to be drained)."""
        started = time.perf_counter()
        headers = scope.headers
        config = self.state.config
        check_bearer(config.auth_token, headers.get("authorization"))
        deployment = self.state.get(name, version)
        with Accounted(deployment, started) as account:
            length, binary_length = check_infer_headers(
                config.max_body_bytes,
                headers.get("content-length"),
                headers.get("transfer-encoding"),
                headers.get(_BINARY_HEADER),
                headers.get("content-type", ""),
            )
            account.admit()
            read[0] = True
            request = decode_request(await read_bounded(proto, length, config.max_body_bytes), binary_length)
            outputs = await self._outputs(deployment, request)
            return ok_answer(*encode_response(name, deployment.version, request, outputs))

    async def _outputs(self, deployment: Deployment, request: InferRequest) -> dict:
        """Deployment.infer without a thread waiting: the request is queued, and its coroutine waits on the loop."""
        if self._answers is None:  # called without __rsgi_init__ (a server that skips it)
            self._answers = LoopAnswers(asyncio.get_running_loop())
        deployment.check_outputs(request.outputs)
        inputs = tokenized(deployment.text, deployment.metrics, request)
        batcher = deployment.batcher
        queued = deployment.queued(inputs, request.outputs, request.parameters, request.finite)
        slot = batcher.submit(*queued, wake=False)
        self._answers.wake_soon(batcher)
        if not await self._answers.wait(slot, batcher.wait_limit_s):
            slot.cancel()
            raise batcher.gave_up()
        return picked(slot.result(), request.outputs)


async def _drain(scope: Any, proto: Any) -> None:
    """After an early refusal, read and drop the unread body (up to DRAIN_LIMIT_BYTES), as fastpath.DrainAfter does
    for WSGI: a connection closed with unread bytes can reset before the client reads the refusal."""
    length = scope.headers.get("content-length")
    if length is None or not length.isdigit() or not 0 < int(length) <= DRAIN_LIMIT_BYTES:
        return
    try:
        async for _chunk in proto:
            pass
    except Exception:  # noqa: BLE001 - the client went away: nothing left to protect
        log.debug("request body not drained", exc_info=True)
