"""The engine process of a multi-front-end server ([server] frontends >= 2): it owns the deployments (ONNX Runtime
sessions and batchers) and answers the front-end processes' requests over ZeroMQ, so that batches still form
from every request the server receives.

One thread does all the socket work (ZeroMQ sockets are not thread-safe): it reads the front ends' groups of
requests from the ROUTER socket they connect to, hands the requests of everything read to their deployments'
batchers together (`submit_many`: never waits, wakes a worker once per deployment) and sends the answers the
batcher's workers leave in a queue, one message per front end for all that finished together, woken through an
eventfd. GET requests a front end cannot answer alone (metadata, config, readiness, /metrics) are answered by the
same Flask app a one-process server runs, and the observer port (/metrics of every process, health) is served
from here.

Started by its supervisor (supervisor.py) as `python -m latlab.server.processes.engine CONFIG RUN_DIR HOST:PORT`."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections import deque
from pathlib import Path

import zmq
from flask import Flask
from prometheus_client import CollectorRegistry
from werkzeug.test import Client

from latlab.server.batching.batcher import DynamicBatcher
from latlab.server.config import engine_groups, served_config
from latlab.server.errors import ConfigError, ModelNotReady, QueueFull, ServingError
from latlab.server.http.app import ServerState, create_app
from latlab.server.http.observer import Observer
from latlab.server.metrics import multiprocess_registry, use_multiprocess_values
from latlab.server.processes.frontend import Engines, Forward
from latlab.server.processes.hop import error_header, group_message, recv_frames, send_frames, tensors_from, unpack
from latlab.server.processes.shared import LOG_FORMAT, EngineStatus, SharedAdmission, endpoint, metrics_folder
from latlab.server.runtime.deployment import picked

log = logging.getLogger("latlab.server.processes.engine")
DRAIN_LIMIT_S = 30.0
"""Longest a stopping engine waits for the requests it holds to be answered."""
POLL_MS = 100
READ_AT_ONCE = 256
NOBLOCK, POLLIN, EVENTS = int(zmq.NOBLOCK), int(zmq.POLLIN), int(zmq.EVENTS)
"""As plain ints: combining pyzmq's enum flags costs more than the call they qualify."""


class Engine:
    """The request loop over `state`'s deployments; `app` answers forwarded GET requests."""

    def __init__(self, app: Flask, run_dir: str | Path, engine: int = 0, context: zmq.Context | None = None) -> None:
        self.app = app
        self.state: ServerState = app.extensions["latlab"]
        self.client = Client(app)
        self.context = context or zmq.Context.instance()
        self.router = self.context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(endpoint(run_dir, engine))
        self.wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        """Written by a batcher worker whose answer finds the queue empty: the socket thread has answers to send."""
        self.answers: deque[tuple] = deque()
        """(front end, request id, its finished slot or its answer, the outputs it asked for), in answer order."""
        self.held = 0
        """Requests submitted and not yet answered."""
        self._lock = threading.Lock()
        self.stopping = threading.Event()
        self._loop_thread = 0

    def run(self) -> None:
        """Serve until stop(); then answer what is held (up to DRAIN_LIMIT_S) and return."""
        self._loop_thread = threading.get_ident()
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.wake, POLLIN)
        drain_until = None
        while True:
            events = dict(poller.poll(POLL_MS))
            if self.router in events:
                self._read_requests()
            if self.wake in events:
                try:
                    os.eventfd_read(self.wake)
                except BlockingIOError:
                    pass
            self._send_answers()
            if self.stopping.is_set():
                drain_until = drain_until or time.monotonic() + DRAIN_LIMIT_S
                if self.held == 0 or time.monotonic() > drain_until:
                    return

    def stop(self) -> None:
        self.stopping.set()

    def close(self) -> None:
        self.router.close(0)
        os.close(self.wake)

    def _read_requests(self) -> None:
        """Every message waiting on the socket (up to READ_AT_ONCE, then answers get their turn), each a front end's
        group of calls; an error fails its own call alone. The infer calls of everything read are handed to their
        batchers together (`_submit`): one lock, one queue-depth gauge write and one worker wake-up per deployment,
        not per request. A request read alone may run on this thread (`run_here`), saving two thread hand-overs,
        when its deployment has one instance: then nothing could start beside it anyway, and what arrives meanwhile
        waits on the socket instead of in the queue, to be read and batched together next."""
        router = self.router
        try:
            messages = [recv_frames(router, NOBLOCK)]  # the poll said one waits: asking again costs a system call
        except zmq.Again:
            return
        while len(messages) < READ_AT_ONCE and router.get(EVENTS) & POLLIN:
            messages.append(recv_frames(router, NOBLOCK))
        answers = self.answers
        to_submit: dict[int, tuple] = {}
        for message in messages:
            frames, header = message[2:], unpack(message[1])
            group = header["group"]
            identity = header.get("reply") or message[0].bytes  # where the front end reads its answers
            alone = len(messages) == 1 and len(group) == 1
            for header in group:
                try:
                    kind = header.get("kind")
                    if kind == "infer":
                        self._infer(identity, header, tensors_from(header["inputs"], frames), alone, to_submit)
                    elif kind == "http":
                        answers.append((identity, header["id"], self._http(header), None))
                    elif kind == "describe":
                        answers.append((identity, header["id"], {"id": header["id"], **self.describe()}, None))
                    elif kind == "hello":  # the front end's answer socket is connected: answers reach it
                        answers.append((identity, header["id"], header, None))
                except Exception as exc:  # noqa: BLE001 - a request's failure is its own answer, not its group's
                    answers.append(failed_call(identity, address_of(header), exc))
        for batcher, calls, arguments in to_submit.values():
            self._submit(batcher, calls, arguments)

    def _infer(self, identity: bytes, header: dict, inputs: dict, alone: bool, to_submit: dict[int, tuple]) -> None:
        """Validate an infer call and add it to its deployment's share of `to_submit` (a lone one is submitted at
        once, to run here when it can). A stack (hop.stacked: several requests' inputs concatenated, their rows in
        "rows") is validated and queued as one request; one the model refuses is taken apart and each of its
        requests validated alone, so that each gets its own verdict and message."""
        if self.stopping.is_set():
            raise ModelNotReady("the server is shutting down")
        deployment = self.state.get(header["model"], header.get("version"))
        outputs = header.get("outputs")
        deployment.check_outputs(outputs)
        rows = header.get("rows")
        try:
            arguments = deployment.queued(
                inputs, outputs, header.get("parameters") or {}, set(header.get("finite", ()))
            )
        except ServingError:
            if rows is None:
                raise
            alone_header = {k: v for k, v in header.items() if k not in ("ids", "rows", "inputs")}
            for request_id, own in zip(header["ids"], split_rows(inputs, rows)):
                self._member(identity, {**alone_header, "id": request_id}, own, to_submit)
            return
        call = (identity, address_of(header), outputs)
        if alone and rows is None:
            run_here = deployment.config.batcher.instances == 1
            self._hold([(call, deployment.batcher.submit(*arguments, run_here=run_here))])
            return
        batcher = deployment.batcher
        share = to_submit.get(id(batcher))
        if share is None:
            share = to_submit[id(batcher)] = (batcher, [], [])
        share[1].append(call)
        share[2].append(arguments if rows is None else (*arguments, len(rows)))

    def _member(self, identity: bytes, header: dict, inputs: dict, to_submit: dict[int, tuple]) -> None:
        """One request of a stack taken apart, as a request sent alone: its error is its own answer."""
        try:
            self._infer(identity, header, inputs, False, to_submit)
        except Exception as exc:  # noqa: BLE001 - a request's failure is its own answer
            self.answers.append(failed_call(identity, header["id"], exc))

    def _submit(self, batcher: DynamicBatcher, calls: list[tuple], arguments: list[tuple]) -> None:
        """Queue one deployment's share of what was read, at once; a call its batcher refused is answered with
        its error. A stack the queue has no room for whole is queued request by request (those that fit get in)."""
        submitted = []
        for call, given, outcome in zip(calls, arguments, batcher.submit_many(arguments)):
            if isinstance(outcome, QueueFull) and isinstance(call[1], tuple):
                identity, (ids, rows), outputs = call
                own = [(inputs, count, *given[2:5]) for inputs, count in zip(split_rows(given[0], rows), rows)]
                self._submit(batcher, [(identity, request_id, outputs) for request_id in ids], own)
            elif isinstance(outcome, Exception):
                self.answers.append(failed_call(call[0], call[1], outcome))
            else:
                submitted.append((call, outcome))
        self._hold(submitted)

    def _hold(self, submitted: list[tuple]) -> None:
        """Count the submitted calls as held until answered, and have each slot's answer queued when it comes."""
        with self._lock:
            self.held += len(submitted)
        answered = self._answered
        for (identity, request_id, outputs), slot in submitted:
            slot.when_done(lambda done, i=identity, r=request_id, o=outputs: answered(i, r, done, o))

    def _answered(self, identity: bytes, request_id: int, slot, outputs: list[str] | None) -> None:
        """A batcher worker's callback: queue the slot (the socket thread reads its answer) and wake the socket
        thread when the queue was empty, so that a batch's answers go out together."""
        with self._lock:
            self.held -= 1
            first = not self.answers
            self.answers.append((identity, request_id, slot, outputs))
        if not first or threading.get_ident() == self._loop_thread:
            return  # a wake-up is already on its way (the socket thread sends until the queue is empty), or
            # this is the socket thread (run_here): it sends next
        os.eventfd_write(self.wake, 1)

    def _send_answers(self) -> None:
        """Send every queued answer, one message per front end (as many as a group's bounds ask). The queue goes
        empty only under the lock, so a worker that finds it empty when it appends knows the socket thread must
        be woken (one wake-up per burst of answers, not each)."""
        while True:
            with self._lock:
                if not self.answers:
                    return
                queued = list(self.answers)
                self.answers.clear()
            by_front_end: dict[bytes, list] = {}
            for identity, request_id, answer, outputs in queued:
                by_front_end.setdefault(identity, []).append(answered_call(request_id, answer, outputs))
            for identity, calls in by_front_end.items():
                while calls:
                    frames, taken = group_message(calls)
                    send_frames(self.router, [identity, *frames])
                    calls = calls[taken:]

    def _http(self, header: dict) -> dict:
        """A GET (or HEAD) a front end forwarded, answered by the server's Flask app."""
        response = self.client.open(
            header["path"],
            method=header["method"],
            query_string=header.get("query", ""),
            headers=header.get("headers") or {},
        )
        return {
            "id": header["id"],
            "status": response.status_code,
            "headers": [[k, v] for k, v in response.headers.items() if k.lower() != "content-length"],
            "body": response.get_data(),
        }

    def describe(self) -> dict:
        """What a front end needs to take requests for each deployment: its inputs' dtypes (to tokenize text),
        and the deployments that failed to load."""
        return {
            "deployments": {
                name: {"inputs": {spec.name: spec.dtype.str for spec in d.model.inputs}}
                for name, d in self.state.deployments.items()
            },
            "failed": self.state.failed,
        }


def address_of(header: dict) -> int | tuple[list, list]:
    """Whom a call's answer is for: its request id, or a stack's request ids and rows (hop.stacked)."""
    if "ids" in header:
        return header["ids"], header["rows"]
    return header.get("id", 0)


def addressed(address: int | tuple[list, list], header: dict) -> dict:
    """An answer's header addressed: to one request ("id"), or to a stack's ("ids" and "rows": hop.unstacked)."""
    if isinstance(address, tuple):
        header.pop("id", None)
        header["ids"], header["rows"] = address
    else:
        header["id"] = address
    return header


def split_rows(inputs: dict, rows: list[int]) -> list[dict]:
    """A stack's inputs cut back into its requests' (views, in order)."""
    parts, start = [], 0
    for count in rows:
        parts.append({name: array[start : start + count] for name, array in inputs.items()})
        start += count
    return parts


def failed_call(identity: bytes, address: int | tuple, error: Exception) -> tuple:
    """An answers-queue entry for a call that failed before it reached a batch: its error is its answer."""
    if not isinstance(error, ServingError):
        log.error("unexpected error in the engine", exc_info=error)
    return identity, address, addressed(address, error_header(0, error)), None


def answered_call(address: int | tuple, answer, outputs: list[str] | None) -> tuple[dict, str, dict | None]:
    """A call's answer as group_message takes it: a ready header, or a finished slot's outputs (or its error)."""
    if isinstance(answer, dict):
        return answer, "outputs", None
    try:
        return addressed(address, {}), "outputs", picked(answer.result(0), outputs)
    except Exception as exc:  # noqa: BLE001 - the request's error is its answer
        if not isinstance(exc, ServingError):
            log.exception("unexpected error answering a request")
        return addressed(address, error_header(0, exc)), "outputs", None


def main(argv: list[str]) -> int:
    """Engine `index` of a server: load its deployments (engine_groups), listen, say ready, serve until
    SIGTERM/SIGINT or until the supervisor is gone. Engine 0 also serves the observer port, for every engine."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    config_path, run_dir, observer, index = argv[0], argv[1], argv[2], int(argv[3]) if len(argv) > 3 else 0
    host, _, port = observer.rpartition(":")
    supervisor = os.getppid()
    use_multiprocess_values(metrics_folder(run_dir))
    status = EngineStatus(Path(run_dir), index)
    watcher = None
    try:
        config = served_config(config_path)
        keys = engine_groups(config.deployments)
        key = keys[index]
        mine = dataclasses.replace(
            config, metrics_port=int(port), deployments=tuple(d for d in config.deployments if d.engine_key == key)
        )
        shown = multiprocess_registry(metrics_folder(run_dir), supervisor)
        # with on_load_failure = "skip", one engine of several may hold only deployments that failed: it answers
        # for them (503, readiness false) as one process would
        app = create_app(mine, CollectorRegistry(), shown, require_one=len(keys) == 1)
        if index == 0:
            engines = Engines(config, Path(run_dir))
            # ready once a front end serves too: the observer port opens before the main port does
            front_ends = SharedAdmission(Path(run_dir), len(config.deployments))
            front = Forward(
                engines,
                local=app.wsgi_app,
                local_index=0,
                local_ready=lambda: app.extensions["latlab"].ready and front_ends.front_ends() > 0,
            )
            try:
                watcher = Observer(front, host, int(port))
            except OSError as exc:
                app.extensions["latlab"].close()
                raise ConfigError(f"cannot listen for /metrics and health on {host}:{port}: {exc.strerror}") from None
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    engine = Engine(app, run_dir, index)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: engine.stop())
    threading.Thread(
        target=_watch_supervisor, args=(supervisor, engine), daemon=True, name="latlab-engine-watch"
    ).start()
    status.set_ready(True)
    log.info(
        "engine %d (%s) serving %s on %s", os.getpid(), key, sorted(engine.state.deployments), endpoint(run_dir, index)
    )
    try:
        engine.run()
    finally:
        status.set_ready(False)
        if watcher is not None:
            watcher.close()
        engine.state.close()  # every batcher finishes what it holds
        engine._send_answers()
        engine.close()
    return 0


def _watch_supervisor(supervisor: int, engine: Engine) -> None:
    """Stop when the supervisor is gone (killed without stopping us): an engine never outlives its server."""
    while not engine.stopping.is_set():
        if os.getppid() != supervisor:
            log.warning("the server's supervisor %d is gone; stopping", supervisor)
            engine.stop()
            return
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
