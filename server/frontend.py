"""A front-end process of a multi-front-end server: it answers HTTP, reads and decodes infer requests, tokenizes
text and encodes responses, while the one engine process (server/engine.py) batches and runs the model.

The infer route is the one-process server's (fastpath.InferRoute) over deployments that forward to the engine:
the same checks, statuses, headers and metrics. Admission counts across every front end (server/shared.py).
Every other route is forwarded to the engine, which answers it with the one-process server's Flask app, except
liveness (this process answers) and readiness while the engine is down (not ready, at once)."""

from __future__ import annotations

import glob
import itertools
import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable, Iterable
from urllib.parse import quote

import numpy as np
import zmq
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import mark_process_dead

from latlab.server.admission import admitted_bound, bound_detail
from latlab.server.app import ServerState
from latlab.server.config import DeploymentConfig, ServerConfig
from latlab.server.deployment import tokenized
from latlab.server.engine import endpoint, metrics_folder
from latlab.server.errors import ModelNotReady, RequestTimeout, ServingError
from latlab.server.fastpath import InferRoute, error_answer, status_line
from latlab.server.hop import pack, raise_error, tensor_frames, tensors_from, unpack
from latlab.server.metrics import ServerMetrics, use_multiprocess_values
from latlab.server.protocol import InferRequest
from latlab.server.shared import EngineStatus, SharedAdmission
from latlab.server.text import text_front_end

log = logging.getLogger("latlab.server.frontend")
POLL_MS = 50
"""How often a request waiting on the engine looks whether the engine is still the one it asked."""
CONNECT_WAIT_MS = 2000
"""How long a thread's first request waits for its socket to connect to a running engine."""
DESCRIBE_WAIT_S = 60.0
FORWARD_WAIT_S = 30.0
TIMEOUT_MARGIN_S = 5.0
"""Past the request's own timeout (which the engine's batcher enforces), how long a front end still waits."""


class EngineClient:
    """Requests to the engine, from any thread: each thread has its own DEALER socket (ZeroMQ sockets are not
    thread-safe) and waits on it for its own answer, so no thread hands answers out to the others."""

    def __init__(self, run_dir: Path, status: EngineStatus) -> None:
        self.address = endpoint(run_dir)
        self.status = status
        self.context = zmq.Context()
        self._ids = itertools.count(1)
        self._local = threading.local()

    def _socket(self) -> zmq.Socket:
        sock = getattr(self._local, "socket", None)
        if sock is None:
            sock = self._local.socket = self.context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IMMEDIATE, 1)  # queue nothing for an engine not connected: refuse instead
            sock.connect(self.address)
        return sock

    def call(self, header: dict, frames: list | tuple = (), wait_s: float = FORWARD_WAIT_S) -> tuple[dict, list]:
        """Send one request and wait for its answer: (header, frames). ModelNotReady (503) when no engine runs,
        or when the one asked stopped before answering (the request is not answered, never silently lost);
        RequestTimeout when no answer came within `wait_s`."""
        generation = self.status.up()
        if generation is None:
            raise ModelNotReady("the server's engine is not running (starting or restarting); retry shortly")
        request_id = header["id"] = next(self._ids)
        sock = self._socket()
        message = [pack(header), *frames]
        connect_until = time.monotonic() + CONNECT_WAIT_MS / 1000
        while True:
            try:
                sock.send_multipart(message, zmq.NOBLOCK, copy=False)
                break
            except zmq.Again:  # a new socket still connecting, or the engine just died
                sock.poll(POLL_MS, zmq.POLLOUT)
                if self.status.up() != generation or time.monotonic() > connect_until:
                    raise ModelNotReady("the server's engine is not reachable (restarting); retry shortly") from None
        deadline = time.monotonic() + wait_s
        while True:
            if sock.poll(POLL_MS):
                reply = sock.recv_multipart(copy=False)
                answer = unpack(reply[0])
                if answer.get("id") == request_id:
                    return answer, reply[1:]
                continue  # the late answer of a request this thread gave up on
            if self.status.up() != generation:
                raise ModelNotReady("the server's engine stopped while it held this request, which was not "
                                    "computed or not answered; retry")
            if time.monotonic() > deadline:
                raise RequestTimeout(f"no answer from the engine within {wait_s:.3f} s")

    def close(self) -> None:
        self.context.destroy(0)


class RemoteDeployment:
    """A deployment as a front end sees it: what fastpath.InferRoute calls, with the model behind the engine."""

    version = "1"

    def __init__(self, config: DeploymentConfig, index: int, client: EngineClient, metrics: ServerMetrics,
                 admission: SharedAdmission, inputs: dict[str, str], bounded: bool) -> None:
        self.config = config
        self.client = client
        labels = {"deployment": config.name, "model": config.model, "provider": config.provider}
        self.observer = metrics.for_deployment(labels)
        self.admission = admission.for_deployment(index, admitted_bound(config.batcher) if bounded else None,
                                                  lambda: self.observer.rejected("queue_full"),
                                                  bound_detail(config.batcher))
        self.text = text_front_end(config, {name: np.dtype(dtype) for name, dtype in inputs.items()})
        self._wait_s = config.batcher.timeout_ms / 1000 + TIMEOUT_MARGIN_S

    @property
    def ready(self) -> bool:
        return self.client.status.up() is not None

    def refuse_if_full(self) -> None:
        """Nothing to look at here: the engine's queue is across the hop. Admission (across front ends) bounds the
        queue; the engine's own check, at submit, refuses (503) what passes the door of a fuller queue."""

    def infer(self, request: InferRequest) -> dict[str, np.ndarray]:
        inputs = tokenized(self.text, self.observer, request)
        described, frames = tensor_frames(inputs)
        header = {"kind": "infer", "model": self.config.name, "inputs": described, "outputs": request.outputs,
                  "parameters": request.parameters, "finite": finite(inputs, request.finite)}
        answer, frames = self.client.call(header, frames, self._wait_s)
        if "error" in answer:
            raise_error(answer)
        return tensors_from(answer["outputs"], frames)

    def close(self) -> None:
        pass


def finite(inputs: dict[str, np.ndarray], known: set[str]) -> list[str]:
    """The floating-point inputs that hold no NaN or infinity: known so from decoding JSON, or looked at here, in
    one of the front ends, so that the engine (one interpreter for every front end) need not. An input that does
    hold one is left for the engine to refuse, with the one-process server's message."""
    return [name for name, array in inputs.items()
            if name in known or (array.dtype.kind == "f" and bool(np.isfinite(array).all()))]


class FrontState(ServerState):
    """ServerState's part the infer route reads (config, get), over RemoteDeployments."""

    def __init__(self, config: ServerConfig, run_dir: Path) -> None:  # noqa: D107 - no ServerState.__init__: no models here
        self.config = config
        self.status = EngineStatus(run_dir)
        self.client = EngineClient(run_dir, status=self.status)
        self.admission = SharedAdmission(run_dir, len(config.deployments))
        self.admission.claim()
        forget_dead_processes(metrics_folder(run_dir))
        self.metrics = ServerMetrics(CollectorRegistry(), process=False)
        described, _ = self.client.call({"kind": "describe"}, wait_s=DESCRIBE_WAIT_S)
        self.failed: dict[str, str] = described["failed"]
        self.deployments = {d.name: RemoteDeployment(d, index, self.client, self.metrics, self.admission,
                                                     described["deployments"][d.name]["inputs"], config.admission)
                            for index, d in enumerate(config.deployments) if d.name in described["deployments"]}

    def close(self) -> None:
        self.admission.close()
        self.client.close()
        self.status.close()


def forget_dead_processes(folder: str) -> None:
    """Drop the live gauges (in-flight requests) of server processes that died, as prometheus_client's
    multiprocess mode asks; a front end that replaces a dead one does it when it starts."""
    pids = {int(path.rsplit("_", 1)[1].split(".")[0]) for path in glob.glob(os.path.join(folder, "gauge_live*.db"))}
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            mark_process_dead(pid, folder)
        except PermissionError:
            pass


WSGIApp = Callable[[dict, Callable], Iterable[bytes]]


class Forward:
    """Every route but infer: liveness here, readiness here while the engine is down, the rest by the engine."""

    def __init__(self, state: FrontState) -> None:
        self.state = state

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path == "/v2/health/live":
            return _answer(start_response, 200, [], b"")
        if path == "/v2/health/ready" and self.state.status.up() is None:
            return _answer(start_response, 400, [], b"")
        headers = {key[5:].replace("_", "-").title(): value for key, value in environ.items()
                   if key.startswith("HTTP_")}
        if environ.get("CONTENT_TYPE"):
            headers["Content-Type"] = environ["CONTENT_TYPE"]
        # PATH_INFO is the path's bytes decoded as latin-1 (PEP 3333): quoted back to those bytes, the engine's
        # WSGI environ gets exactly this one, whatever the client sent ('?', '%', bytes that are not UTF-8).
        request = {"kind": "http", "method": environ.get("REQUEST_METHOD", "GET"),
                   "path": quote(path.encode("latin-1", errors="replace"), safe="/"),
                   "query": environ.get("QUERY_STRING", ""), "headers": headers}
        try:
            answer, _ = self.state.client.call(request)
            if "error" in answer:
                raise_error(answer)
        except Exception as exc:  # noqa: BLE001 - every failure is an answer, as on the infer route
            if not isinstance(exc, ServingError):
                log.exception("unexpected error forwarding %s", path)
            return _answer(start_response, *error_answer(exc))
        return _answer(start_response, answer["status"], [tuple(h) for h in answer["headers"]], answer["body"])


def _answer(start_response: Callable, status: int, headers: list, body: bytes) -> list[bytes]:
    start_response(status_line(status), [*headers, ("Content-Length", str(len(body)))])
    return [body]


def create_frontend_app(config: ServerConfig, run_dir: Path) -> WSGIApp:
    """A front end's WSGI app (Granian's factory target in each front-end process: server/wsgi.py)."""
    use_multiprocess_values(metrics_folder(run_dir))
    state = FrontState(config, run_dir)
    return InferRoute(Forward(state), state)
