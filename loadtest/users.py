"""Locust users for an Open Inference Protocol deployment (open-loop arrivals or closed-loop users),
their command-line options and the event hooks that ship samples from workers to the master.

The locustfiles (`locustfile.py`, `locustfile_closed.py`) each expose one of these users.
"""

from __future__ import annotations

import gc
import itertools
import os
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator
from urllib.parse import urlsplit

import gevent
import locust.runners
import numpy as np
from gevent.pool import Group
from locust import FastHttpUser, events, task
from locust.runners import MasterRunner, WorkerRunner

from latlab.loadtest.arrivals import SPEC_HELP, Arrivals, FleetSchedule
from latlab.loadtest.fleet_cpu import FleetCpu, cpu_reading
from latlab.loadtest.lean_http import LeanClient
from latlab.loadtest.locust_stats import LocustTally, RequestFailed, failure_of
from latlab.loadtest.loop_sender import LoopSender
from latlab.loadtest import native_loop
from latlab.loadtest.open_sender import OpenSender
from latlab.loadtest.raw_http import Finished
from latlab.loadtest.payloads import BODY_BUDGET_BYTES, Body, request_bodies, sizeable, sized_body
from latlab.loadtest.plan import PayloadOptions
from latlab.loadtest.recorder import Recorder
from latlab.loadtest.sizes import SPEC_HELP as SIZES_HELP
from latlab.loadtest.sizes import Sizes, max_length
from latlab.loadtest.timer import Timer

MAX_OUTSTANDING_PER_USER = 256
HANDOFF_S = 0.002
"""An open-loop arrival's last stretch of waiting is on the sender's timerfd (timer.py), which wakes it within
tens of microseconds; before that, on the event loop's own timer, which wakes up to a millisecond late."""
SPIN_S = 0.0012
"""Without a timerfd (not Linux): the last stretch is spent yielding to the event loop instead, which keeps
reading answers meanwhile."""
SPIN_SHARE = 0.25
"""At most this share of a core spent so (the process's rate times SPIN_S): on a machine the generator shares
with the server, a punctual send must not cost the server its CPU."""
SIZED_BUDGET_BYTES = 4 * BODY_BUDGET_BYTES
"""Bodies of sizes drawn per request kept per user: a text deployment's sizes end at its max_length, so all are
kept; past this (long tensors of many sizes) the kept ones are dropped and built again as they come."""
OPEN_LOOP_ENV = "LATLAB_OPEN_LOOP"
"""'greenlet': open-loop users send each request from a greenlet of its own, not from the sender's wake-up."""
BODY_ORDER_LENGTH = 4096
"""A closed-loop user without sizes drawn per request sends its bodies in a random order this long, drawn once and
repeated: a body chosen per request with no Python call (the loop sender asks from the event loop's callback)."""
LOAD_MESSAGE = "latlab_load"
# Workers ship their samples with each report; once a second keeps the master's windows current.
locust.runners.WORKER_REPORT_INTERVAL = 1.0


@dataclass
class LoadState:
    """Shared by the users of one process: what to hit, at what rate, and where samples go.
    `rate` is this process's share of the arrivals per second (open loop only)."""

    deployment: str
    rate: float
    arrivals: Arrivals = field(default_factory=Arrivals)
    schedule: FleetSchedule | None = None
    """The fleet's schedule this process takes its share of (the driver's); None: this process's own, from its
    first sender's start (a plain `locust -f` run)."""
    payload: PayloadOptions = field(default_factory=PayloadOptions)
    recorder: Recorder = field(default_factory=Recorder)
    worker_pids: dict[str, int] = field(default_factory=dict)
    """Master: each worker's process id, as it reports it (to name a worker that dies)."""
    worker_cpu: FleetCpu = field(default_factory=FleetCpu)
    """Master: each worker's CPU, as it reports it with its samples."""

    route: str = ""
    """When set, users GET this path of the server instead of inferring (the generator's calibration: floor.py)."""

    version: int = 0  # bumped on every change, so a user waiting out a long gap re-plans at once

    senders: list = field(default_factory=list)
    """This process's open-loop users, in the order they started: each takes its own share of the schedule."""

    def update(self, message: dict) -> None:
        self.deployment = message["deployment"]
        self.rate = message["rate"]
        self.arrivals = Arrivals(**message["arrivals"])
        self.schedule = FleetSchedule.from_message(dict(message["schedule"]), self.arrivals)
        self.route = message.get("route", "")
        if "payload" in message:
            self.payload = PayloadOptions(**message["payload"])
        self.version += 1

    def times_for(self, sender: object, users: int) -> Iterator[float]:
        """The intended send times of one of this process's senders (`users` of them, when no driver said)."""
        if sender not in self.senders:
            self.senders.append(sender)
        if self.schedule is None:
            self.schedule = FleetSchedule(self.rate, random.randrange(2**32), time.time(), users=max(users, 1))
        return self.schedule.times(self.arrivals, self.senders.index(sender))

    def sizes_for(self, sender: object) -> Iterator[int]:
        """The sizes of one of this process's senders' requests, in the order of its times_for() (after it)."""
        return self.schedule.sizes(self.payload.size_spec, self.arrivals, self.senders.index(sender))


@events.init_command_line_parser.add_listener
def _add_arguments(parser) -> None:
    parser.add_argument("--latlab-deployment", default="", help="deployment (model name) to load")
    parser.add_argument("--latlab-rate", type=float, default=10.0, help="open loop: arrivals/s of this process")
    parser.add_argument("--latlab-constant", action="store_true", help="constant gaps instead of Poisson")
    parser.add_argument("--latlab-arrivals", default="", help=f"open loop: {SPEC_HELP}")
    parser.add_argument("--latlab-binary", action="store_true", help="send tensors with the binary extension")
    parser.add_argument(
        "--latlab-seq-len",
        type=int,
        default=8,
        help="length of dynamic non-batch dimensions; a text input's sentence length in tokens",
    )
    parser.add_argument(
        "--latlab-seq-len-max",
        type=int,
        default=0,
        help="above --latlab-seq-len: sentence lengths drawn uniformly up to this many tokens",
    )
    parser.add_argument(
        "--latlab-sizes",
        default="",
        help=f"each request's size along the dynamic axes, drawn per request: {SIZES_HELP}",
    )
    parser.add_argument(
        "--latlab-text",
        action="store_true",
        help="the deployment must take text (a BYTES input of sentences): refuse it otherwise",
    )
    parser.add_argument(
        "--latlab-inputs",
        default="",
        help="an .npz of sample inputs to send instead of random ones, one request per row",
    )
    parser.add_argument(
        "--latlab-client",
        choices=("lean", "locust"),
        default="lean",
        help="infer requests via latlab's lean HTTP client (http:// only) or Locust's FastHttpSession",
    )
    parser.add_argument(
        "--latlab-metrics-port",
        type=int,
        default=0,
        help="master/standalone: serve client-side Prometheus metrics (whole fleet) on this port",
    )
    parser.add_argument("--latlab-run", default="locust", help="run label of those metrics")


def _arrivals_of(options) -> Arrivals:
    """A plain `locust -f` run's arrival process, from --latlab-arrivals (or --latlab-constant)."""
    if options is None:
        return Arrivals()
    if options.latlab_arrivals:
        return Arrivals.parse(options.latlab_arrivals).check()
    return Arrivals("constant" if options.latlab_constant else "poisson")


@events.init.add_listener
def _init_state(environment, **_kwargs) -> None:
    options = environment.parsed_options
    if getattr(environment, "latlab", None) is None:
        environment.latlab = LoadState(
            options.latlab_deployment if options else "",
            options.latlab_rate if options else 10.0,
            arrivals=_arrivals_of(options),
        )
        if options is not None:
            environment.latlab.payload = PayloadOptions(
                options.latlab_binary,
                options.latlab_seq_len,
                options.latlab_client,
                options.latlab_text,
                options.latlab_seq_len_max,
                options.latlab_inputs,
                Sizes.parse(options.latlab_sizes).spec if options.latlab_sizes else "",
            )
    state: LoadState = environment.latlab
    if isinstance(environment.runner, WorkerRunner):
        environment.runner.register_message(LOAD_MESSAGE, lambda environment, msg, **_: state.update(msg.data))

        def ship(client_id, data) -> None:
            data["latlab"] = {**state.recorder.drain(), "pid": os.getpid(), "cpu": cpu_reading()}

        environment.events.report_to_master.add_listener(ship)
    elif isinstance(environment.runner, MasterRunner):

        def absorb(client_id, data, **_kwargs) -> None:
            if "latlab" in data:
                state.worker_pids[client_id] = data["latlab"]["pid"]
                state.recorder.absorb(client_id, data["latlab"])
                if "cpu" in data["latlab"]:  # absent from workers of an older latlab
                    state.worker_cpu.reported(client_id, data["latlab"]["cpu"])

        environment.events.worker_report.add_listener(absorb)
    if (
        options is not None
        and getattr(options, "latlab_metrics_port", 0)
        and not isinstance(environment.runner, WorkerRunner)
    ):
        _export_metrics(state, options.latlab_metrics_port, options.latlab_run)
    _freeze_startup_objects()


def _freeze_startup_objects() -> None:
    """Leave what start-up made (Locust, gevent, numpy and their modules: tens of thousands of objects) out of the
    garbage collector's later passes: a pass over them runs on the senders' event loop, every send waiting on it."""
    gc.collect()
    gc.freeze()


def _export_metrics(state: LoadState, port: int, run_id: str) -> None:
    """For plain `locust -f` runs: live client-side histograms of every sample this process sees
    (a master sees its workers'), keeping only the last minute of raw samples in memory."""
    from prometheus_client import CollectorRegistry

    from latlab.loadtest.loadgen_metrics import LoadGenMetrics, start_exporter

    registry = CollectorRegistry()
    metrics = LoadGenMetrics(registry, run_id)
    state.recorder.on_completed = lambda latencies, oks: metrics.observe(state.deployment, latencies, oks)
    start_exporter(metrics, port)

    def trim() -> None:
        while True:
            gevent.sleep(10)
            state.recorder.forget_before(time.time() - 60)

    gevent.spawn(trim)


class _InferenceUser(FastHttpUser):
    """Fetches the deployment's signature once, then posts random valid inputs."""

    abstract = True
    network_timeout = 30.0
    connection_timeout = 5.0

    def on_start(self) -> None:
        self.state: LoadState = self.environment.latlab
        self.deployment = self.state.deployment
        if self.state.route:  # the calibration's trivial route: nothing to encode, nothing to compute
            self.method, self.path, self.bodies = "GET", self.state.route, [Body(b"", {})]
        else:
            self.method, self.path = "POST", f"/v2/models/{self.deployment}/infer"
            self.metadata = self.client.get(f"/v2/models/{self.deployment}", name="metadata").json()
            self.bodies = request_bodies(self.metadata, seed=random.randrange(2**32), options=self.state.payload)
        self.tally = LocustTally(self.environment, self.method, self.deployment, self.path)
        self.rng = random.Random()
        self.sized = not self.state.route and self.state.payload.size_spec.varies and sizeable(self.metadata)
        """Requests of sizes drawn per request (--dim seq=SPEC): bodies by size, built as each size first comes."""
        self.by_size: dict[int, tuple[Body, object]] = {}
        self.size_bytes = 0
        self.cap = max_length(self.metadata) if self.sized else 0
        # Infer requests go through the lean client, encoded once (lean_http.py), where it can reach the host;
        # Locust's FastHttpSession otherwise (https) or when asked for.
        self.lean = None
        if self.state.payload.client == "lean" and urlsplit(self.host).scheme == "http":
            self.lean = LeanClient(self.host, self.network_timeout, self.connection_timeout)
            self.requests = [self.lean.prepare(self.method, self.path, b.data, b.headers) for b in self.bodies]

    def _sized(self, size: int) -> tuple[Body, object]:
        """The body of `size` (capped at the deployment's maximum) and its prepared lean request, built once; the
        bodies kept stay within a few times BODY_BUDGET_BYTES."""
        size = min(size, self.cap) if self.cap else size
        found = self.by_size.get(size)
        if found is None:
            if self.size_bytes > SIZED_BUDGET_BYTES:
                self.by_size.clear()
                self.size_bytes = 0
            body = sized_body(self.metadata, np.random.default_rng(self.rng.randrange(2**32)), self.state.payload, size)
            lean = self.lean.prepare(self.method, self.path, body.data, body.headers) if self.lean is not None else None
            found = self.by_size[size] = (body, lean)
            self.size_bytes += len(body.data)
        return found

    def on_stop(self) -> None:
        if self.lean is not None:
            self.lean.close()

    def _send(self, intended: float, size: int = 0) -> None:
        """One request, of `size` along its dynamic axes where sizes vary (else one of the user's bodies)."""
        recorder = self.state.recorder
        sent = time.time()
        key = recorder.begin(intended, sent)
        if size:
            body, prepared = self._sized(size)
        else:
            which = self.rng.randrange(len(self.bodies))
            body, prepared = self.bodies[which], self.requests[which] if self.lean is not None else None
        status, retry_after, received, error, failure = 0, False, 0, "", None
        try:
            if self.lean is not None:
                status, retry_after, received, failure = self._post_lean(prepared)
            else:
                status, retry_after, received, error = self._post_locust(body)
        except Exception as exc:  # no HTTP answer (refused, reset, timed out): status 0
            error = type(exc).__name__
            failure = RequestFailed(f"no answer: {exc!r}")
        finally:
            done = time.time()
            recorder.end(key, done, status == 200, status, retry_after, error)
        if self.lean is not None:  # Locust's own statistics (its web UI and CSV) see every request too
            self.tally.tell(done - sent, received, failure)

    def _raw(self, size: int) -> bytes:
        """The encoded lean request of `size` (sizes drawn per request), else one of the user's bodies."""
        if size:
            return self._sized(size)[1].raw
        return self.requests[self.rng.randrange(len(self.requests))].raw

    def _report(self, key: int, done: Finished) -> None:
        """A request a loop sender finished (loop_sender.py, open_sender.py), into the recorder and Locust's
        statistics, as `_send` records one."""
        self.state.recorder.end(key, done.done, done.status == 200, done.status, done.retry_after, done.error)
        self.tally.tell(done.done - done.sent, done.received, failure_of(done))

    def _post_lean(self, prepared: object) -> tuple[int, bool, int, Exception | None]:
        answer = self.lean.send(prepared)
        failure = None
        if answer.status != 200:
            failure = RequestFailed(f"HTTP {answer.status}: {answer.body[:200].decode('utf-8', 'replace')}")
        return answer.status, bool(answer.headers.get("retry-after")), len(answer.body), failure

    def _post_locust(self, body: Body) -> tuple[int, bool, int, str]:
        """Through Locust's client, which reports to Locust's statistics itself."""
        error = ""
        with self.client.request(
            self.method, self.path, data=body.data, headers=body.headers, name=self.deployment, catch_response=True
        ) as response:
            status = response.status_code or 0  # 0: no HTTP answer (refused, reset, timed out)
            if status == 0:
                error = type(response.error).__name__
                response.failure(f"no answer: {response.error!r}")
            elif status != 200:
                response.failure(f"HTTP {status}: {(response.text or '')[:200]}")
            return (
                status,
                bool(response.headers and response.headers.get("Retry-After")),
                len(response.content or b""),
                error,
            )


class OpenLoopUser(_InferenceUser):
    """Sends requests at its share of the target rate, whether or not earlier ones have returned.

    Latency is measured from each request's intended send time (no coordinated omission); arrivals
    beyond MAX_OUTSTANDING_PER_USER are dropped and counted."""

    concurrency = MAX_OUTSTANDING_PER_USER  # connections in Locust's pool (with --client locust)

    def on_start(self) -> None:
        super().on_start()
        self.inflight = Group()
        self.timer = Timer.make()
        self.sender = None
        """Through the lean client: requests written from the sender's own wake-up, answers read in the event
        loop's callbacks (open_sender.py); LATLAB_OPEN_LOOP=greenlet sends each from a greenlet of its own."""
        if self.lean is not None and os.environ.get(OPEN_LOOP_ENV) != "greenlet":
            self.sender = OpenSender(self.lean.address, self._report, self.network_timeout, self.connection_timeout)

    def on_stop(self) -> None:
        if self in self.state.senders:
            self.state.senders.remove(self)
        self.inflight.join(timeout=self.network_timeout)
        if self.sender is not None:
            deadline = time.monotonic() + self.network_timeout
            while self.sender.in_flight and time.monotonic() < deadline:
                gevent.sleep(0.005)
            self.sender.close()
        if self.timer is not None:
            self.timer.close()
            self.timer = None
        super().on_stop()

    @task
    def arrivals(self) -> None:
        state = self.state
        while True:
            version = state.version
            users = self.environment.runner.target_user_count if self.environment.runner else 1
            times = state.times_for(self, users or 1)
            sizes = state.sizes_for(self) if self.sized else itertools.repeat(0)
            for intended, size in zip(times, sizes):
                if not self._wait_until(intended, version):
                    break  # the load changed: the new schedule from its own origin
                flying = self.sender.in_flight if self.sender is not None else len(self.inflight)
                if flying >= MAX_OUTSTANDING_PER_USER:
                    state.recorder.drop(intended)
                elif self.sender is not None:
                    raw = self._raw(size)
                    sent = time.time()
                    self.sender.send(raw, state.recorder.begin(intended, sent), sent)
                else:
                    self.inflight.spawn(self._send, intended, size)

    def _wait_until(self, when: float, version: int) -> bool:
        """Sleep until `when` in short slices; False if the load changed from `version`, the one `when` was
        planned at. The event loop's timers wake up to a millisecond late (epoll waits in whole milliseconds),
        and every latency counts from `when`: so the last HANDOFF_S are waited on the sender's timerfd. Without
        one, the last SPIN_S are spent yielding to the loop (answers keep being read) until `when`, where the
        process's rate keeps that spinning below SPIN_SHARE of a core; above it the timer's lateness stays."""
        if self.state.version != version:
            return False
        if self.timer is not None:
            while (delay := when - time.time()) > HANDOFF_S:
                gevent.sleep(min(delay - HANDOFF_S, 0.25))
                if self.state.version != version:
                    return False
            self.timer.wait_until(when)
            return self.state.version == version
        spin = SPIN_S if self.state.rate * SPIN_S <= SPIN_SHARE else 0.0
        while (delay := when - time.time()) > spin:
            gevent.sleep(min(delay - spin, 0.25))
            if self.state.version != version:
                return False
        while time.time() < when:
            gevent.sleep(0)
        return self.state.version == version


class ClosedLoopUser(_InferenceUser):
    """Locust's native model: the next request leaves when the last one returned (no think time).
    Under a stall it simply stops sending, so its percentiles understate the stall.

    Through the lean client the user's connection is driven by the process's native thread (native_loop.py), or
    where that cannot be built (or LATLAB_CLOSED_LOOP=python) from the event loop's I/O callbacks (loop_sender.py):
    either sends the next request the moment an answer is read and leaves the recording to this user's greenlet.
    LATLAB_CLOSED_LOOP=greenlet sends each request from the greenlet instead, as Locust's task would."""

    def on_start(self) -> None:
        super().on_start()
        self.sizes = self.state.payload.size_spec.draws(self.rng.randrange(2**32)) if self.sized else None
        self.in_flight: tuple[int, float] | None = None
        """The recorder's key and send time of the request the loop sender has in flight."""

    @task
    def request(self) -> None:
        how = native_loop.closed_sender(self.lean is not None, self.sizes is not None)
        if how == "greenlet":
            self._send(time.time(), next(self.sizes) if self.sizes is not None else 0)
            return
        if how == "native":
            sender = native_loop.NativeSender(
                native_loop.library()[0],
                self.lean.address,
                self._drawn_bodies(),
                self.network_timeout,
                self.connection_timeout,
            )
        else:
            next_raw = self._next_raw if self.sizes is not None else self._body_order()
            sender = LoopSender(self.lean.address, next_raw, self.network_timeout, self.connection_timeout)
        self.state.recorder.add_collector(sender.collect)  # a window counts what the sender has not yet handed on
        try:
            sender.run(self._record)
        finally:
            self.state.recorder.remove_collector(sender.collect)

    def _next_raw(self) -> bytes:
        return self._raw(next(self.sizes) if self.sizes is not None else 0)

    def _body_order(self) -> Callable[[], bytes]:
        """The next of the user's encoded requests, each drawn at random (BODY_ORDER_LENGTH)."""
        return itertools.cycle(self._drawn_bodies()).__next__

    def _drawn_bodies(self) -> list[bytes]:
        """BODY_ORDER_LENGTH of the user's encoded requests, each drawn at random: the order they are sent in."""
        raws = [prepared.raw for prepared in self.requests]
        return [raws[self.rng.randrange(len(raws))] for _ in range(BODY_ORDER_LENGTH)]

    def _record(self, finished: list[Finished], in_flight: float | None) -> None:
        """What the loop sender finished, into the recorder and then Locust's statistics, in one go each; the
        request it has in flight begun in the recorder, so that a stall counts while it lasts. That request, begun
        at an earlier call, is the first to finish after it."""
        recorder = self.state.recorder
        rest = finished
        if finished and self.in_flight is not None and finished[0].sent == self.in_flight[1]:
            first, rest = finished[0], finished[1:]
            recorder.end(
                self.in_flight[0], first.done, first.status == 200, first.status, first.retry_after, first.error
            )
            self.in_flight = None
        if rest:
            sent, done, status, retry_after, _, error = zip(*rest)
            recorder.add_answered(sent, done, status, retry_after, error)
        if in_flight is not None and self.in_flight is None:
            self.in_flight = (recorder.begin(in_flight, in_flight), in_flight)
        self.tally.tell_batch(finished)  # last: a locustfile's own listener may yield to other greenlets
