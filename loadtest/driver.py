"""Locust's environment and runner for the sweep: local, or a master with worker processes whose
loss it notices, reports and compensates (the lost worker's open-loop rate goes to the others).

Import this module before anything that uses sockets or threads: Locust monkey-patches them for gevent.
"""

from __future__ import annotations

import locust  # first: gevent's monkey-patching must precede other imports

import random
import signal
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

import gevent
import locust.runners
import psutil
from locust.env import Environment
from locust.runners import STATE_MISSING

from latlab.common import procs
from latlab.loadtest import users
from latlab.loadtest.arrivals import Arrivals, FleetSchedule, load_trace
from latlab.loadtest.loadgen_metrics import LoadGenMetrics
from latlab.loadtest.machine_load import MachineLoad
from latlab.loadtest.plan import DEFAULT_MASTER_PORT, SweepPlan

# A worker silent for HEARTBEAT_LIVENESS + 1 heartbeats (1 s each) is missing: 3 s instead of Locust's 4 s.
locust.runners.HEARTBEAT_LIVENESS = 2
WATCH_INTERVAL_S = 0.5  # how often the master checks its workers (processes and heartbeats)
WORKER_LAG_S = 1.5  # workers ship samples every second: wait this long before closing a window
LOCAL_LAG_S = 0.05  # one process records samples as requests complete: a short pause lets the last ones land
ANSWER_GRACE_S = 1.0  # a step's figures wait this long at most for answers to its last requests
WORKER_LEAD_S = 0.1
"""A new schedule starts this long after the master sends it, so that workers receive it before its first
arrival (a worker that got it late would send its first arrivals late, in a bunch)."""


class LoadDriver:
    """Locust's environment and runner: local, or a master with worker processes (spawned or remote).

    `events` lists what happened to the fleet (a worker lost or back), each with its time and reason; local
    workers write their logs into `log_dir` (none: their output is this process's)."""

    def __init__(
        self,
        plan: SweepPlan,
        metrics: LoadGenMetrics,
        progress: Callable[[str], None] = print,
        log_dir: Path | None = None,
    ) -> None:
        self.plan = plan
        self.mode = plan.schedule.mode
        self.metrics = metrics
        self.progress = progress
        self.log_dir = log_dir
        user_class = users.OpenLoopUser if self.mode == "open" else users.ClosedLoopUser
        self.state = users.LoadState("", 0.0, arrivals=plan.schedule.arrivals)
        self.trace = load_trace(plan.schedule.arrivals.trace) if plan.schedule.arrivals.kind == "trace" else None
        self.env = Environment(user_classes=[user_class], host=plan.workload.host, events=locust.events)
        self.env.latlab = self.state
        self.workers: list = []
        self.events: list[dict] = []
        self.lost: set[str] = set()
        self.step_index = 0
        self.load = 0.0
        self.deployment = ""
        self.route = ""
        self.floor: dict | None = None
        """What this generator adds to every latency, once calibrated (floor.py)."""
        workers = plan.workers
        self.distributed = workers.distributed
        # the default port stands for a free one when the workers are local: two sweeps at once must not collide
        local_default = workers.local and workers.master_port == DEFAULT_MASTER_PORT
        self.master_port = procs.free_port() if local_default else workers.master_port
        if self.distributed:
            self.runner = self.env.create_master_runner(workers.master_bind_host, self.master_port)
        else:
            self.runner = self.env.create_local_runner()
        self.env.events.init.fire(environment=self.env, runner=self.runner, web_ui=None)
        self.state.recorder.on_completed = lambda latencies, oks: (
            None if self.route else metrics.observe(self.deployment, latencies, oks)
        )  # the calibration's requests (a trivial route) are no deployment's
        self.process = psutil.Process()
        self.generator_cores: float | None = None
        self.machine = MachineLoad()
        if self.distributed:
            self._start_workers(user_class)
            self._known = set(self.runner.clients.keys())
            self._watcher = gevent.spawn(self._watch_workers)

    @property
    def live_workers(self) -> list[str]:
        return [client_id for client_id in self._connected() if client_id not in self.lost]

    def _connected(self) -> list[str]:
        clients = self.runner.clients
        return [c.id for c in clients.ready + clients.spawning + clients.running]

    @property
    def processes(self) -> int:
        return len(self.live_workers) if self.distributed else 1

    def _start_workers(self, user_class: type) -> None:
        locustfile = Path(users.__file__).parent / (
            "locustfile.py" if user_class is users.OpenLoopUser else "locustfile_closed.py"
        )
        for i in range(self.plan.workers.local):
            log = self.log_dir / f"worker-{i}.log" if self.log_dir else None
            self.workers.append(
                procs.start(
                    [
                        sys.executable,
                        "-m",
                        "locust",
                        "-f",
                        str(locustfile),
                        "--worker",
                        "--master-host",
                        "127.0.0.1",
                        "--master-port",
                        str(self.master_port),
                    ],
                    log_path=log,
                )
            )
        expected = self.plan.workers.local or self.plan.workers.remote
        deadline = time.monotonic() + 60
        while len(self.runner.clients.ready) < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self.runner.clients.ready)} of {expected} Locust workers connected")
            gevent.sleep(0.2)

    def set_load(self, deployment: str, load: float, route: str = "") -> None:
        """Point the users at `deployment` with `load` (total arrivals/s, or total users); with `route`, at that
        path of the server instead (GET: the generator's calibration, floor.py)."""
        self.state.recorder.flush_completed()  # samples so far are labelled with the deployment they hit
        if deployment != self.deployment and self.deployment:
            self.runner.stop()
            gevent.sleep(0.5)
        if self.mode == "open":
            user_count = self.plan.workers.users_per_process * max(self.processes, 1)
        else:
            user_count = int(load)
        self.load = load
        self.route = route
        self._send_rate(deployment)
        if deployment != self.deployment or self.mode == "closed":
            self.runner.start(user_count, spawn_rate=max(user_count, 1))
        self.deployment = deployment

    def _send_rate(self, deployment: str, load: float | None = None) -> None:
        """Tell every process its share of one schedule of arrivals (open loop; closed loop sends rate 0): the
        same seed and origin everywhere, each process its place among them (arrivals.FleetSchedule)."""
        load = self.load if load is None else load
        total = load if self.mode == "open" else 0.0
        live = self.live_workers if self.distributed else [None]
        schedule = FleetSchedule(
            rate=total,
            seed=self.plan.schedule.seed or random.randrange(1, 2**32),
            origin=time.time() + (WORKER_LEAD_S if self.distributed else 0.0),
            processes=max(len(live), 1),
            users=self.plan.workers.users_per_process,
            trace=self.trace,
        )
        message = {
            "deployment": deployment,
            "rate": total / max(len(live), 1),
            "arrivals": asdict(self.plan.schedule.arrivals),
            "payload": asdict(self.plan.workload.payload),
            "route": self.route,
        }
        sizes = self.plan.workload.payload.size_spec
        columns = (sizes.column,) if sizes.kind == "trace" else ()
        self.state.update({**message, "schedule": schedule.as_message(self.plan.schedule.arrivals, columns)})
        for index, client_id in enumerate(live if self.distributed else []):
            own = replace(schedule, process=index).as_message(self.plan.schedule.arrivals, columns)
            self.runner.send_message(users.LOAD_MESSAGE, {**message, "schedule": own}, client_id=client_id)

    @property
    def lag_s(self) -> float:
        """How long after a window's end its samples take to reach the recorder (WORKER_LAG_S with workers)."""
        return WORKER_LAG_S if self.distributed else LOCAL_LAG_S

    def await_answers(self, before: float) -> None:
        """Let requests sent before `before` (a step's end) be answered, ANSWER_GRACE_S at most: achieved counts by
        intended send time, so a healthy step must not lose the requests that were simply still in flight; a
        saturated server's backlog outlasts the grace and still shows as not achieved."""
        recorder = self.state.recorder
        deadline = time.time() + ANSWER_GRACE_S
        while recorder.outstanding_before(before) and time.time() < deadline:
            gevent.sleep(0.02)

    def drain(self, timeout_s: float = 30.0) -> None:
        """Pause arrivals until every outstanding request has been answered (bounded)."""
        if not self.deployment or self.mode != "open":
            return
        self._send_rate(self.deployment, load=1e-3 * max(self.processes, 1))
        deadline = time.monotonic() + timeout_s
        gevent.sleep(self.lag_s)
        while self.state.recorder.outstanding and time.monotonic() < deadline:
            gevent.sleep(0.1)

    def generator_cpu(self) -> float:
        """CPU % of the busiest generator process since the last call: in distributed mode the busiest worker
        (each ships its CPU seconds with its samples) or the master, which merges every sample. The cores of all
        of them together since the same call are left in `generator_cores`."""
        own = self.process.cpu_percent()
        if not self.distributed:
            self.generator_cores = own / 100.0
            return own
        live = set(self.live_workers)
        workers = self.state.worker_cpu.since_last_read(live)
        if not workers:  # no worker has reported twice yet: Locust's own figure (a 10 s average, 0 at first)
            workers = {w.id: w.cpu_usage for w in self.runner.clients.values() if w.id in live}
        self.generator_cores = (own + sum(workers.values())) / 100.0
        return max([own, *workers.values()])

    def lost_since(self, t: float) -> list[str]:
        """Workers lost at or after wall-clock time t."""
        return [e["worker"] for e in self.events if e["event"] == "worker_lost" and e["time"] >= t]

    def _watch_workers(self) -> None:
        while True:
            gevent.sleep(WATCH_INTERVAL_S)
            for client_id, reason in self._newly_lost():
                self._lose(client_id, reason)
            for client_id in [c for c in self._connected() if c in self.lost and self._exit_code(c) is None]:
                self._rejoin(client_id)

    def _newly_lost(self) -> list[tuple[str, str]]:
        found = []
        for client_id in sorted(self._known - self.lost):
            client = self.runner.clients.get(client_id)
            exit_code = self._exit_code(client_id)
            if exit_code is not None:
                found.append((client_id, f"its process exited ({_describe_exit(exit_code)})"))
            elif client is None:
                found.append((client_id, "it quit"))
            elif client.state == STATE_MISSING:
                found.append((client_id, f"no heartbeat for {locust.runners.HEARTBEAT_LIVENESS + 1} s"))
        self._known |= set(self.runner.clients.keys())
        return found

    def _exit_code(self, client_id: str) -> int | None:
        pid = self.state.worker_pids.get(client_id)
        for worker in self.workers:
            if worker.pid == pid:
                return worker.poll()
        return None

    def _lose(self, client_id: str, reason: str) -> None:
        self.lost.add(client_id)
        # A silent (not dead) worker reads this when it wakes: it must not add its old share to the others'.
        pause = FleetSchedule(rate=1e-3, origin=time.time(), users=self.plan.workers.users_per_process)
        message = {"deployment": self.deployment, "rate": 1e-3, "arrivals": asdict(Arrivals()), "route": self.route}
        message["schedule"] = pause.as_message(Arrivals())
        self.runner.send_message(users.LOAD_MESSAGE, message, client_id=client_id)
        in_flight = self.state.recorder.forget_source(client_id)
        left = self.processes
        event = {
            "event": "worker_lost",
            "time": time.time(),
            "worker": client_id,
            "pid": self.state.worker_pids.get(client_id),
            "reason": reason,
            "deployment": self.deployment,
            "step": self.step_index,
            "requests_in_flight_lost": in_flight,
            "workers_left": left,
        }
        if self.mode == "open" and self.deployment and left:
            self._send_rate(self.deployment)
            event["load"] = f"its share of {self.load:g} req/s now goes to {left} worker(s): {self.load / left:g} each"
        elif self.mode == "closed":
            event["load"] = "its users are not replaced: the remaining workers keep theirs"
        else:
            event["load"] = "no worker left"
        self.events.append(event)
        pid = f" (pid {event['pid']})" if event["pid"] else ""
        self.progress(
            f"worker {client_id}{pid} LOST during step {self.step_index} of '{self.deployment}': "
            f"{reason}; {in_flight} requests in flight unaccounted; {event['load']}"
        )

    def _rejoin(self, client_id: str) -> None:
        self.lost.discard(client_id)
        self._send_rate(self.deployment)
        self.events.append(
            {
                "event": "worker_back",
                "time": time.time(),
                "worker": client_id,
                "deployment": self.deployment,
                "step": self.step_index,
                "workers_left": self.processes,
            }
        )
        self.progress(f"worker {client_id} is back (heartbeat resumed); {self.processes} workers share the load")

    def close(self) -> None:
        if self.distributed:
            self._watcher.kill(block=False)
        self.runner.quit()
        gevent.sleep(0.5)
        for worker in self.workers:
            procs.stop(worker)


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"status {code}"
