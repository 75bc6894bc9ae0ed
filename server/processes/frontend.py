"""A front-end process of a multi-front-end server: it answers HTTP, reads and decodes infer requests, tokenizes
text and encodes responses, while the one engine process (server/processes/engine.py) batches and runs the model.

The infer route is the one-process server's (fastpath.InferRoute) over deployments that forward to the engine:
the same checks, statuses, headers and metrics. Admission counts across every front end (server/processes/shared.py).
Every other route is forwarded to the engine, which answers it with the one-process server's Flask app, except
liveness (this process answers) and readiness while the engine is down (not ready, at once)."""

from __future__ import annotations

import glob
import logging
import os
import re
from pathlib import Path
from typing import Callable, Iterable
from urllib.parse import quote

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import mark_process_dead

from latlab.server.batching.admission import bound_detail
from latlab.common.settings import admitted_bound
from latlab.server.config import DeploymentConfig, ServerConfig, engine_groups
from latlab.server.errors import ServingError
from latlab.server.http.app import ServerState
from latlab.server.http.fastpath import InferRoute, error_answer, status_line
from latlab.server.metrics import ServerMetrics, use_multiprocess_values
from latlab.server.processes.client import HOLD_S, Announcing, EngineClient
from latlab.server.processes.hop import raise_error, tensors_from
from latlab.server.processes.shared import EngineStatus, SharedAdmission, metrics_folder
from latlab.server.protocol import InferRequest
from latlab.server.runtime.deployment import tokenized
from latlab.server.runtime.text import text_front_end

log = logging.getLogger("latlab.server.processes.frontend")
DESCRIBE_WAIT_S = 60.0
TIMEOUT_MARGIN_S = 5.0
"""Past the request's own timeout (which the engine's batcher enforces), how long a front end still waits."""


class RemoteDeployment:
    """A deployment as a front end sees it: what fastpath.InferRoute calls, with the model behind the engine."""

    version = "1"

    def __init__(
        self,
        config: DeploymentConfig,
        index: int,
        client: EngineClient,
        metrics: ServerMetrics,
        admission: SharedAdmission,
        inputs: dict[str, str],
        bounded: bool,
        announce: bool = True,
    ) -> None:
        self.config = config
        self.client = client
        labels = {"deployment": config.name, "model": config.model, "provider": config.provider}
        self.metrics = metrics.for_deployment(labels)
        counted = admission.for_deployment(
            index,
            admitted_bound(config.batcher) if bounded else None,
            lambda: self.metrics.rejected("queue_full"),
            bound_detail(config.batcher),
        )
        # a front end of request threads tells its client what is coming (a group waits for it); the native
        # dispatcher sends each take's requests together and needs no telling
        self.admission = Announcing(counted, client) if announce else counted
        self.text = text_front_end(config, {name: np.dtype(dtype) for name, dtype in inputs.items()})
        self.wait_s = config.batcher.timeout_ms / 1000 + TIMEOUT_MARGIN_S
        """How long a front end waits for the engine's answer."""
        # a request waits for companions at most a share of what its batch may wait for them anyway
        self._hold_s = min(HOLD_S, config.batcher.max_queue_delay_ms / 1000 / 2)

    @property
    def ready(self) -> bool:
        return self.client.status.up() is not None

    def refuse_if_full(self) -> None:
        """Nothing to look at here: the engine's queue is across the hop. Admission (across front ends) bounds the
        queue; the engine's own check, at submit, refuses (503) what passes the door of a fuller queue."""

    def infer(self, request: InferRequest) -> dict[str, np.ndarray]:
        header, inputs = self.call(request)
        return outputs_of(*self.client.call(header, inputs, self.wait_s, self._hold_s))

    def call(self, request: InferRequest) -> tuple[dict, dict[str, np.ndarray]]:
        """The engine call that computes `request`: its header and its (tokenized) inputs."""
        inputs = tokenized(self.text, self.metrics, request)
        header = {
            "kind": "infer",
            "model": self.config.name,
            "outputs": request.outputs,
            "parameters": request.parameters,
            "finite": finite(inputs, request.finite),
        }
        return header, inputs

    def close(self) -> None:
        pass


def outputs_of(answer: dict, frames: list) -> dict[str, np.ndarray]:
    """An infer call's outputs from the engine's answer; raises the error it carries."""
    if "error" in answer:
        raise_error(answer)
    return tensors_from(answer["outputs"], frames)


def finite(inputs: dict[str, np.ndarray], known: set[str]) -> list[str]:
    """The floating-point inputs that hold no NaN or infinity: known so from decoding JSON, or looked at here, in
    one of the front ends, so that the engine (one interpreter for every front end) need not. An input that does
    hold one is left for the engine to refuse, with the one-process server's message."""
    return [
        name
        for name, array in inputs.items()
        if name in known or (array.dtype.kind == "f" and bool(np.isfinite(array).all()))
    ]


class Engines:
    """The engines of a server as a front end (or engine 0's observer port) reaches them: a client per engine, and
    which engine serves each deployment (engine_groups)."""

    def __init__(self, config: ServerConfig, run_dir: Path) -> None:
        keys = engine_groups(config.deployments)
        self.statuses = [EngineStatus(run_dir, index) for index in range(len(keys))]
        self.clients = [EngineClient(run_dir, status, index) for index, status in enumerate(self.statuses)]
        self.of = {d.name: keys.index(d.engine_key) for d in config.deployments}
        """Deployment name -> engine index; any other name goes to engine 0, which says it is unknown."""

    def client_for(self, name: str) -> EngineClient:
        return self.clients[self.of.get(name, 0)]

    def up(self) -> bool:
        return all(status.up() is not None for status in self.statuses)

    def close(self) -> None:
        for client in self.clients:
            client.close()
        for status in self.statuses:
            status.close()


class FrontState(ServerState):
    """ServerState's part the infer route reads (config, get), over RemoteDeployments."""

    def __init__(self, config: ServerConfig, run_dir: Path, announce: bool = True) -> None:  # noqa: D107 - no models here
        self.config = config
        self.engines = Engines(config, run_dir)
        self.admission = SharedAdmission(run_dir, len(config.deployments))
        self.admission.claim()
        forget_dead_processes(metrics_folder(run_dir))
        self.metrics = ServerMetrics(CollectorRegistry(), process=False)
        inputs: dict[str, dict] = {}
        self.failed: dict[str, str] = {}
        for client in self.engines.clients:
            described, _ = client.call({"kind": "describe"}, wait_s=DESCRIBE_WAIT_S)
            inputs.update({name: d["inputs"] for name, d in described["deployments"].items()})
            self.failed.update(described["failed"])
        self.deployments = {
            d.name: RemoteDeployment(
                d,
                index,
                self.engines.client_for(d.name),
                self.metrics,
                self.admission,
                inputs[d.name],
                config.admission,
                announce,
            )
            for index, d in enumerate(config.deployments)
            if d.name in inputs
        }

    def close(self) -> None:
        self.admission.close()
        self.engines.close()


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


MODEL_PATH = re.compile(r"/v2/models/([^/]+)")


class Forward:
    """Every route but infer, answered from the engines: liveness here; readiness when every engine is up and
    says ready (at once "not ready" while one is down); a model's routes by that model's engine; the rest by
    engine 0. `local`: the WSGI app of the engine this runs in (engine 0's observer port), called directly."""

    def __init__(
        self,
        engines: Engines,
        local: WSGIApp | None = None,
        local_index: int | None = None,
        local_ready: Callable[[], bool] | None = None,
    ) -> None:
        self.engines = engines
        self.local, self.local_index, self.local_ready = local, local_index, local_ready

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path == "/v2/health/live":
            return _answer(start_response, 200, [], b"")
        if path == "/v2/health/ready":
            return _answer(start_response, 200 if self._ready(environ) else 400, [], b"")
        match = MODEL_PATH.match(path)
        index = self.engines.of.get(match.group(1).encode("latin1").decode(errors="replace"), 0) if match else 0
        if index == self.local_index:
            return self.local(environ, start_response)
        return _answer(start_response, *self._forward(index, environ))

    def _ready(self, environ: dict) -> bool:
        if not self.engines.up():
            return False
        for index in range(len(self.engines.clients)):
            if index == self.local_index:
                ready = self.local_ready()
            else:
                ready = self._forward(index, environ)[0] == 200
            if not ready:
                return False
        return True

    def _forward(self, index: int, environ: dict) -> tuple[int, list, bytes]:
        path = environ.get("PATH_INFO") or "/"
        headers = {
            key[5:].replace("_", "-").title(): value for key, value in environ.items() if key.startswith("HTTP_")
        }
        if environ.get("CONTENT_TYPE"):
            headers["Content-Type"] = environ["CONTENT_TYPE"]
        # PATH_INFO is the path's bytes decoded as latin-1 (PEP 3333): quoted back to those bytes, the engine's
        # WSGI environ gets exactly this one, whatever the client sent ('?', '%', bytes that are not UTF-8).
        request = {
            "kind": "http",
            "method": environ.get("REQUEST_METHOD", "GET"),
            "path": quote(path.encode("latin-1", errors="replace"), safe="/"),
            "query": environ.get("QUERY_STRING", ""),
            "headers": headers,
        }
        try:
            answer, _ = self.engines.clients[index].call(request)
            if "error" in answer:
                raise_error(answer)
        except Exception as exc:  # noqa: BLE001 - every failure is an answer, as on the infer route
            if not isinstance(exc, ServingError):
                log.exception("unexpected error forwarding %s", path)
            return error_answer(exc)
        return answer["status"], [tuple(h) for h in answer["headers"]], answer["body"]


def _answer(start_response: Callable, status: int, headers: list, body: bytes) -> list[bytes]:
    start_response(status_line(status), [*headers, ("Content-Length", str(len(body)))])
    return [body]


def create_frontend_app(config: ServerConfig, run_dir: Path) -> WSGIApp:
    """A front end's WSGI app (Granian's factory target in each front-end process: server/processes/wsgi.py)."""
    use_multiprocess_values(metrics_folder(run_dir))
    state = FrontState(config, run_dir)
    return InferRoute(Forward(state.engines), state)
