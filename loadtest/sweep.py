"""Drives Locust step by step (or through an SLO search) and writes the run's results file.

Import this module before anything that uses sockets or threads: Locust monkey-patches them for gevent.
"""

from __future__ import annotations

import locust  # first: gevent's monkey-patching must precede other imports

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import gevent
import psutil
import requests
from locust.env import Environment
from prometheus_client import CollectorRegistry

from latlab import machine, procs
from latlab.loadtest import users
from latlab.loadtest.prom import LoadGenMetrics, start_exporter
from latlab.loadtest.results import write_results
from latlab.loadtest.scrape import average_batch, scrape_batches
from latlab.loadtest.search import SATURATED_BELOW, is_stable, slo_search

GENERATOR_BOUND_CPU = 90.0  # % of one core used by a generator process during a step
WORKER_LAG_S = 1.5          # workers ship samples every second: wait this long before closing a window


@dataclass
class SweepPlan:
    """What to load and how. `loads` are offered rates (open loop) or user counts (closed loop);
    with `slo_p99_s` and `search`, loads[0] is where the SLO search starts."""

    host: str
    deployments: list[str]
    loads: list[float]
    mode: str = "open"
    warmup_seconds: float = 2.0
    window_seconds: float = 2.0
    min_windows: int = 3
    max_windows: int = 6
    poisson: bool = True
    stop_at_saturation: bool = True
    max_error_ratio: float = 0.01
    slo_p99_s: float | None = None
    slo_margin: float = 2.0
    search: bool = False
    search_resolution: float = 0.05
    users_per_process: int = 1
    workers: int = 0
    expect_workers: int = 0
    master_bind_host: str = "127.0.0.1"
    master_port: int = 5557
    metrics_port: int | None = None
    log_dir: Path | None = None


class LoadDriver:
    """Locust's environment and runner: local, or a master with worker processes (spawned or remote)."""

    def __init__(self, plan: SweepPlan, metrics: LoadGenMetrics) -> None:
        self.plan = plan
        self.metrics = metrics
        user_class = users.OpenLoopUser if plan.mode == "open" else users.ClosedLoopUser
        self.state = users.LoadState("", 0.0, poisson=plan.poisson)
        self.env = Environment(user_classes=[user_class], host=plan.host, events=locust.events)
        self.env.latlab = self.state
        self.workers: list = []
        self.distributed = bool(plan.workers or plan.expect_workers)
        if self.distributed:
            self.runner = self.env.create_master_runner(plan.master_bind_host, plan.master_port)
        else:
            self.runner = self.env.create_local_runner()
        self.env.events.init.fire(environment=self.env, runner=self.runner, web_ui=None)
        self.state.recorder.on_completed = lambda latencies, oks: metrics.observe(self.deployment, latencies, oks)
        self.deployment = ""
        self.process = psutil.Process()
        if self.distributed:
            self._start_workers(user_class)

    @property
    def processes(self) -> int:
        return len(self.runner.clients.ready) + len(self.runner.clients.running) if self.distributed else 1

    def _start_workers(self, user_class: type) -> None:
        locustfile = Path(users.__file__).parent / ("locustfile.py" if user_class is users.OpenLoopUser
                                                    else "locustfile_closed.py")
        for i in range(self.plan.workers):
            log = self.plan.log_dir / f"worker-{i}.log" if self.plan.log_dir else None
            self.workers.append(procs.start(
                [sys.executable, "-m", "locust", "-f", str(locustfile), "--worker", "--master-host", "127.0.0.1",
                 "--master-port", str(self.plan.master_port)], log_path=log))
        expected = self.plan.workers or self.plan.expect_workers
        deadline = time.monotonic() + 60
        while len(self.runner.clients.ready) < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self.runner.clients.ready)} of {expected} Locust workers connected")
            gevent.sleep(0.2)

    def set_load(self, deployment: str, load: float) -> None:
        """Point the users at `deployment` with `load` (total arrivals/s, or total users)."""
        if deployment != self.deployment and self.deployment:
            self.runner.stop()
            gevent.sleep(0.5)
        if self.plan.mode == "open":
            processes = max(self.processes, 1)
            user_count = self.plan.users_per_process * processes
            message = {"deployment": deployment, "rate": load / processes, "poisson": self.plan.poisson}
        else:
            user_count = int(load)
            message = {"deployment": deployment, "rate": 0.0, "poisson": self.plan.poisson}
        self.state.update(message)
        if self.distributed:
            self.runner.send_message(users.LOAD_MESSAGE, message)
        if deployment != self.deployment or self.plan.mode == "closed":
            self.runner.start(user_count, spawn_rate=max(user_count, 1))
        self.deployment = deployment

    def drain(self, timeout_s: float = 30.0) -> None:
        """Pause arrivals until every outstanding request has been answered (bounded)."""
        if not self.deployment or self.plan.mode != "open":
            return
        paused = {"deployment": self.deployment, "rate": 1e-3, "poisson": self.plan.poisson}
        self.state.update(paused)
        if self.distributed:
            self.runner.send_message(users.LOAD_MESSAGE, paused)
        deadline = time.monotonic() + timeout_s
        gevent.sleep(WORKER_LAG_S if self.distributed else 0.05)
        while self.state.recorder.outstanding and time.monotonic() < deadline:
            gevent.sleep(0.1)

    def generator_cpu(self) -> float:
        """CPU % of the busiest generator process since the last call (workers report theirs)."""
        if self.distributed:
            return max((worker.cpu_usage for worker in self.runner.clients.values()), default=0.0)
        return self.process.cpu_percent()

    def close(self) -> None:
        self.runner.quit()
        gevent.sleep(0.5)
        for worker in self.workers:
            procs.stop(worker)


def _print(line: str) -> None:
    print(line, flush=True)  # progress must show live, also when stdout is a pipe


def run_sweep(plan: SweepPlan, out_path: Path, run_id: str, progress: Callable[[str], None] = _print) -> dict:
    """Sweep (or search) every deployment in turn; write and return the results document."""
    registry = CollectorRegistry()
    metrics = LoadGenMetrics(registry, run_id)
    if plan.metrics_port:
        start_exporter(metrics, plan.metrics_port)
        progress(f"load generator metrics on http://127.0.0.1:{plan.metrics_port}/metrics")
    doc = {"run_id": run_id, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": plan.host,
           "machine": machine.describe(), "mode": plan.mode,
           "arrivals": ("poisson" if plan.poisson else "constant") if plan.mode == "open" else "closed loop",
           "slo_p99_s": plan.slo_p99_s, "deployments": []}
    driver = LoadDriver(plan, metrics)
    try:
        doc["workers"] = driver.processes if driver.distributed else 0
        for deployment in plan.deployments:
            doc["deployments"].append(_run_deployment(plan, driver, metrics, deployment, progress))
            write_results(out_path, doc)  # a partial run still leaves its finished deployments behind
    finally:
        driver.close()
    if plan.metrics_port:
        gevent.sleep(2.5)  # let Prometheus scrape the last step before the exporter goes away
    return doc


def _run_deployment(plan: SweepPlan, driver: LoadDriver, metrics: LoadGenMetrics, deployment: str,
                    progress: Callable[[str], None]) -> dict:
    info = _describe(plan.host, deployment)
    steps: list[dict] = []

    def measure(load: float) -> dict:
        step = _measure_step(plan, driver, metrics, deployment, load, index=len(steps))
        steps.append(step)
        progress(_progress_line(deployment, step, plan.mode))
        return step

    if plan.search and plan.slo_p99_s:
        def probe(rate: float) -> dict:
            driver.drain()  # a failed probe's backlog must not spill into the next one
            return measure(rate)
        result = slo_search(probe, plan.slo_p99_s, start=plan.loads[0], resolution=plan.search_resolution)
        progress(f"{deployment}: {result.summary()}")
        return {**info, "steps": sorted(steps, key=lambda s: s["target"]), "search": result.as_dict(),
                "stop_reason": result.summary()}
    stop_reason = "all loads done"
    for load in plan.loads:
        reason = _stop_reason(measure(load), plan)
        if reason:
            stop_reason = f"stopped at {load:g}: {reason}"
            break
    progress(f"{deployment}: {stop_reason}")
    return {**info, "steps": steps, "stop_reason": stop_reason}


def _measure_step(plan: SweepPlan, driver: LoadDriver, metrics: LoadGenMetrics, deployment: str,
                  load: float, index: int) -> dict:
    """Warm up, then measure windows until the last three agree (or max_windows); the step's figures
    come from the last three windows together."""
    driver.set_load(deployment, load)
    metrics.set_load(deployment, index, load if plan.mode == "open" else 0.0,
                     int(load) if plan.mode == "closed" else driver.runner.user_count)
    gevent.sleep(plan.warmup_seconds)
    recorder = driver.state.recorder
    lag = WORKER_LAG_S if driver.distributed else 0.05
    batches_before = scrape_batches(plan.host, deployment)
    driver.generator_cpu()
    start = time.time()
    windows: list[dict] = []
    stable = False
    while True:
        edge = start + (len(windows) + 1) * plan.window_seconds
        gevent.sleep(max(0.0, edge + lag - time.time()))
        window_start = edge - plan.window_seconds
        windows.append(recorder.window(window_start, edge, time.time()).as_dict())
        if len(windows) >= plan.min_windows:
            stable = is_stable(windows[-3:])
            if stable or len(windows) >= plan.max_windows:
                break
    end = start + len(windows) * plan.window_seconds
    first = end - min(3, len(windows)) * plan.window_seconds
    cpu = driver.generator_cpu()
    stats, latencies, per_source = recorder.window_detail(first, end, time.time())
    step = {
        "target": load,
        "target_rps": load if plan.mode == "open" else None,
        "users": int(load) if plan.mode == "closed" else driver.runner.user_count,
        **stats.as_dict(),
        "duration_s": end - first,
        "windows": len(windows),
        "stable": stable,
        "avg_batch_size": average_batch(batches_before, scrape_batches(plan.host, deployment)),
        "generator_cpu_percent": cpu,
        "generator_bound": cpu > GENERATOR_BOUND_CPU,
        "sent_by_worker": per_source if driver.distributed else None,
        "end_time": end,
    }
    metrics.record_step(deployment, index, latencies, step, ended_at=end)
    metrics.count_dropped(deployment, stats.dropped)
    metrics.count_late(deployment, stats.late)
    recorder.forget_before(first)
    return step


def _stop_reason(step: dict, plan: SweepPlan) -> str | None:
    if plan.mode == "open" and plan.stop_at_saturation and step["achieved_rps"] < SATURATED_BELOW * step["offered_rps"]:
        return f"saturated: achieved {step['achieved_rps']:.0f} < 90% of offered {step['offered_rps']:.0f} req/s"
    if step["sent"] and step["errors"] / step["sent"] > plan.max_error_ratio:
        return f"{step['errors']} errors of {step['sent']} requests"
    if plan.slo_p99_s and step["p99_s"] is not None and step["p99_s"] > plan.slo_margin * plan.slo_p99_s:
        return f"p99 {step['p99_s'] * 1e3:.1f} ms broke the SLO by more than {plan.slo_margin:g}x"
    return None


def _progress_line(deployment: str, step: dict, mode: str) -> str:
    flags = ("" if step["stable"] else "  [unstable]") + ("  [generator-bound]" if step["generator_bound"] else "")
    batch = f"{step['avg_batch_size']:.1f}" if step["avg_batch_size"] else "-"
    load = f"offered {step['offered_rps']:7.0f}/s" if mode == "open" else f"users {step['users']:4d}"
    return (f"{deployment:>14}  {load}  achieved {step['achieved_rps']:7.0f}/s  "
            f"p50 {step['p50_s'] * 1e3:7.2f} ms  p99 {step['p99_s'] * 1e3:7.2f} ms  "
            f"errors {step['errors']}  batch {batch}{flags}")


def _describe(host: str, deployment: str) -> dict:
    """The deployment's settings as the server reports them, to label the curve."""
    response = requests.get(f"{host.rstrip('/')}/v2/models/{deployment}/config", timeout=10)
    if response.status_code != 200:
        raise LookupError(f"server at {host} has no deployment '{deployment}': {response.text.strip()}")
    return response.json()
