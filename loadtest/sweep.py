"""Drives Locust step by step (or through an SLO search) and writes the run's results file; each step is measured
by step.py.

Import this module before anything that uses sockets or threads: Locust monkey-patches them for gevent.
"""

from __future__ import annotations

import locust  # noqa: F401 - imported first for its side effect: gevent's monkey-patching must precede other imports

import dataclasses
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

import gevent
import requests
from prometheus_client import CollectorRegistry

from latlab.common import machine
from latlab.loadtest import native_loop
from latlab.loadtest.driver import LoadDriver
from latlab.loadtest.calibrate import calibrate
from latlab.loadtest.overload import run_overload
from latlab.loadtest.plan import OverloadPlan, SweepPlan
from latlab.loadtest.loadgen_metrics import LoadGenMetrics, start_exporter
from latlab.loadtest.recorder import MIN_SAMPLES_P99
from latlab.loadtest.results import Curve, Run, Step, write_results
from latlab.loadtest.describe import describe, extras_notice
from latlab.loadtest.fleet import FleetTargets, fleet_step, read_fleet, read_targets
from latlab.loadtest.proxy_hop import proxy_added, proxy_line
from latlab.loadtest.scrape import fetch, metrics_source
from latlab.loadtest.search import bracket_slos, open_slos, slo_search
from latlab.loadtest.single import one_at_a_time
from latlab.loadtest.sizes import max_length, truncation_line
from latlab.loadtest.arrivals import load_trace
from latlab.loadtest.step import LONGEST_WINDOW_S, measure_step, progress_line
from latlab.loadtest.stepping import ServerGone, sweep_rates

SERVER_BACK_S = 10.0  # after an interrupted step, how long to wait for the server to answer again
QUEUE_SAMPLE_S = 1.0  # overload: the queue is full for most of a burst, a sample a second shows it


def _print(line: str) -> None:
    print(line, flush=True)  # progress must show live, also when stdout is a pipe


class _Progress:
    """A run's progress lines, with `once(key, line)` for what is said once per run (a server's missing extras)."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say, self.said = say, set()

    def __call__(self, line: str) -> None:
        self.say(line)

    def once(self, key: str, line: str) -> None:
        if key not in self.said:
            self.said.add(key)
            self.say(line)


def run_sweep(
    plan: SweepPlan,
    out_path: Path,
    run_id: str,
    progress: Callable[[str], None] = _print,
    run_one: Callable[..., Curve] | None = None,
) -> Run:
    """Sweep (or search) every deployment in turn; write and return the run. The Locust workers' logs go beside
    the results file. `run_one(plan, driver, metrics, deployment, progress)` replaces the sweep of one deployment
    (default: the overload test where the plan asks for one)."""
    progress = _Progress(progress)
    registry = CollectorRegistry()
    metrics = LoadGenMetrics(registry, run_id)
    schedule, payload, metrics_port = plan.schedule, plan.workload.payload, plan.workers.metrics_port
    if metrics_port:
        start_exporter(metrics, metrics_port)
        progress(f"load generator metrics on http://127.0.0.1:{metrics_port}/metrics")
    run = Run(
        run_id=run_id,
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        host=plan.workload.host,
        machine=machine.describe(plan.provenance.machine_name),
        mode=schedule.mode,
        arrivals=schedule.arrivals.spec if schedule.mode == "open" else "closed loop",
        payload={
            "encoding": "binary" if payload.binary else "json",
            "seq_len": payload.seq_len,
            "client": payload.client,
            "text": payload.text,
            "seq_len_max": payload.seq_len_max,
            **({"inputs": payload.inputs} if payload.inputs else {}),
            **({"sizes": payload.sizes} if payload.sizes else {}),
            **({"closed_sender": _closed_sender(plan)} if schedule.mode == "closed" else {}),
        },
        slo_p99_s=plan.slo.p99_s,
        fleet=read_targets(plan.provenance.fleet).as_dict() if plan.provenance.fleet else None,
        cold_start_s=plan.provenance.cold_start_s,
    )
    if run_one is None:
        run_one = overload_runner(plan.overload) if plan.overload is not None else _run_deployment
    driver = LoadDriver(plan, metrics, progress, log_dir=out_path.parent)
    run.events = driver.events  # the fleet's events (a worker lost), as they happen
    try:
        run.workers = driver.processes if driver.distributed else 0
        if schedule.mode == "open" and schedule.calibrate_seconds > 0:
            driver.floor = calibrate(
                driver, list(schedule.loads), schedule.max_rate, schedule.calibrate_seconds, progress
            )
            run.generator_floor = driver.floor
            write_results(out_path, run)  # a run of no deployment (--calibrate-only) is its floor
        for deployment in plan.workload.deployments:
            run.deployments.append(run_one(plan, driver, metrics, deployment, progress))
            run.context()  # each deployment told its run (and that it ran on the run's machine), as a reader is
            write_results(out_path, run)  # a partial run still leaves its finished deployments behind
    finally:
        driver.close()
    if driver.events:
        write_results(out_path, run)  # a worker may also have been lost after the last step
    if metrics_port:
        gevent.sleep(2.5)  # let Prometheus scrape the last step before the exporter goes away
    return run


def _closed_sender(plan) -> str:
    """Which sender the closed loop's users run here (native_loop.closed_sender), for the results."""
    lean = plan.workload.payload.client == "lean" and urlsplit(plan.workload.host).scheme == "http"
    return native_loop.closed_sender(lean, plan.workload.payload.size_spec.varies)


def _run_deployment(
    plan: SweepPlan, driver: LoadDriver, metrics: LoadGenMetrics, deployment: str, progress: Callable[[str], None]
) -> Curve:
    info = _describe(plan, deployment, progress)
    steps: list[Step] = []
    fleet = read_targets(plan.provenance.fleet) if plan.provenance.fleet else None
    if fleet is not None:
        info["proxy_added"] = proxy_added(plan.workload.host, fleet, deployment, plan.workload.payload)
        progress(proxy_line(deployment, info["proxy_added"]) or f"{deployment}: the targets name no replica address")

    def measure(load: float) -> Step:
        decide_for = open_slos(plan.slo.slos.seconds, steps, load)
        watch = fleet_watch(fleet, deployment, plan.schedule.warmup_seconds)
        step = measure_step(plan, driver, metrics, deployment, load, index=len(steps), decide_for=decide_for)
        step.fleet = watch()
        steps.append(step)
        progress(progress_line(deployment, step, plan.schedule.mode, driver.floor) + fleet_text(step))
        if step.server_interrupted:
            _wait_for_server(plan.workload.host, deployment, step, progress)
        return step

    if plan.slo.search and plan.slo.p99_s:
        search, stop_reason = _search(plan, driver, measure)
        progress(f"{deployment}: {stop_reason}")
        saturated = bool(search) and not any("no upper bound" in r for r in search["reasons"])
        return _record(
            info,
            steps=sorted(steps, key=lambda s: s.target),
            search=search,
            stop_reason=stop_reason,
            saturated=saturated,
            rate_cap_rps=max((p["target"] for p in search["probes"]), default=None) if search else None,
        )
    stop_reason, saturated = sweep_rates(plan, measure)
    progress(f"{deployment}: {stop_reason}")
    schedule = plan.schedule
    cap = max(schedule.max_rate, max(schedule.loads)) if schedule.mode == "open" else None
    interrupted = stop_reason.startswith("stopped at") and not saturated  # the server or the fleet went away
    brackets = {}
    if plan.slo.slos and schedule.mode == "open" and not interrupted:
        brackets = _bracket_slos(plan, driver, deployment, measure, steps, progress)
    return _record(
        info,
        steps=sorted(steps, key=lambda s: s.target),
        stop_reason=stop_reason,
        saturated=saturated,
        rate_cap_rps=cap,
        **brackets,
    )


_DEPLOYMENT_FIELDS = frozenset(f.name for f in dataclasses.fields(Curve) if not f.metadata.get("context"))


def fleet_watch(fleet: FleetTargets | None, deployment: str, warmup_s: float) -> Callable[[], dict | None]:
    """Read the fleet once the step's warm-up is over (when step.py first reads the server) and return what reads
    it again at the step's end and gives the step's fleet figures; None for a run against one server."""
    if fleet is None:
        return lambda: None
    before = gevent.spawn_later(warmup_s, read_fleet, fleet, deployment)
    return lambda: fleet_step(before.get(), read_fleet(fleet, deployment))


def fleet_text(step: Step) -> str:
    """The progress line's fleet figures: the replicas' imbalance, the proxy's retries and 5xx."""
    if not step.fleet:
        return ""
    imbalance, proxy = step.fleet["imbalance"], step.fleet["proxy"] or {}
    text = f"  imbalance {imbalance:.2f}" if imbalance is not None else "  imbalance -"
    return text + "".join(f"  proxy {key} {proxy[key]:.0f}" for key in ("retries", "5xx") if proxy.get(key))


def _record(info: dict, **fields: object) -> Curve:
    """A deployment's record: its description (`_describe`) with `fields` over it. A key of the description that
    is no Curve field (a newer server's /config) is left out: results files hold only known fields."""
    return Curve(**{**{k: v for k, v in info.items() if k in _DEPLOYMENT_FIELDS}, **fields})


def _bracket_slos(
    plan: SweepPlan,
    driver: LoadDriver,
    deployment: str,
    measure: Callable[[float], Step],
    steps: list[Step],
    progress: Callable[[str], None],
) -> dict:
    """Every SLO's bracket narrowed to the plan's resolution with extra steps (search.bracket_slos); each extra step,
    and the one-at-a-time probe, after the previous step's backlog has drained."""

    def step(rate: float) -> Step:
        driver.drain()
        return measure(rate)

    def single() -> dict:
        driver.drain()
        found = one_at_a_time(plan.workload.host, deployment, plan.workload.payload)
        progress(single_line(deployment, found))
        return found

    slo = plan.slo
    deadline = time.monotonic() + slo.max_seconds

    def time_left() -> bool:
        return not slo.max_seconds or time.monotonic() < deadline

    try:
        floor = lowest_rate(plan)
        return bracket_slos(slo.slos.seconds, steps, step, single, slo.resolution, floor, slo.max_steps, time_left)
    except ServerGone as exc:
        progress(f"{deployment}: SLO brackets stopped: {exc}")
        return {}


def lowest_rate(plan: SweepPlan) -> float:
    """The lowest rate an SLO bracket measures: its three longest windows still expect 1.5x MIN_SAMPLES_P99."""
    return 1.5 * MIN_SAMPLES_P99 / (plan.schedule.min_windows * LONGEST_WINDOW_S)


def single_line(deployment: str, single: dict) -> str:
    if not single["requests"]:
        return f"{deployment:>14}  one at a time: no request answered"
    return (
        f"{deployment:>14}  one at a time: {single['requests']} requests  p50 {single['p50_s'] * 1e3:7.2f} ms  "
        f"p99 {single['p99_s'] * 1e3:7.2f} ms  errors {single['errors']}"
    )


def _search(plan: SweepPlan, driver: LoadDriver, measure: Callable[[float], Step]) -> tuple[dict | None, str]:
    """The SLO search's result and its one-line summary (or why it stopped)."""

    def probe(rate: float) -> Step:
        driver.drain()  # a failed probe's backlog must not spill into the next one
        step = measure(rate)
        if step.server_interrupted:  # the server's restart says nothing about this rate: once more
            driver.drain()
            step = measure(rate)
        return step

    try:
        result = slo_search(
            probe,
            plan.slo.p99_s,
            start=plan.schedule.loads[0],
            resolution=plan.slo.resolution,
            min_rate=plan.slo.floor,
            growth=plan.slo.growth,
        )
    except ServerGone as exc:
        return None, f"search stopped: {exc}"
    return result.as_dict(), result.summary()


def overload_runner(overload: OverloadPlan) -> Callable[..., Curve]:
    """What `run_sweep(run_one=...)` calls per deployment for the overload test instead of a sweep."""

    def run_one(
        plan: SweepPlan, driver: LoadDriver, metrics: LoadGenMetrics, deployment: str, progress: Callable[[str], None]
    ) -> Curve:
        info = _describe(plan, deployment, progress)
        steps: list[Step] = []
        fleet = read_targets(plan.provenance.fleet) if plan.provenance.fleet else None

        def phase(
            name: str,
            load: float,
            seconds: float,
            windows: int = 3,
            warmup: float = 0.0,
            drain: bool = True,
            spans: bool = False,
        ) -> Step:
            if drain:
                driver.drain()
            schedule = replace(
                plan.schedule,
                warmup_seconds=warmup,
                window_seconds=seconds / windows,
                min_windows=windows,
                max_windows=windows,
                stop_at_saturation=False,
                queue_sample_seconds=QUEUE_SAMPLE_S,
            )
            timing = replace(plan, schedule=schedule)
            watch = fleet_watch(fleet, deployment, warmup)
            step = measure_step(timing, driver, metrics, deployment, load, index=len(steps), spans=spans, phase=name)
            step.fleet = watch()
            steps.append(step)
            progress(f"{name:>9}: {progress_line(deployment, step, 'open').strip()}")
            return step

        def outstanding() -> int:
            driver.drain(timeout_s=10.0)
            return driver.state.recorder.outstanding

        start, probe_s = plan.schedule.loads[0], plan.schedule.window_seconds * 3
        figures = run_overload(phase, overload, start, probe_s, info, outstanding)
        progress(f"{deployment}: {figures['summary']}")
        # not a sweep: it does not say whether its loads stopped short of saturation (reports then count it saturated)
        return _record(info, steps=steps, overload=figures, stop_reason=figures["summary"], saturated=None)

    return run_one


def _describe(plan: SweepPlan, deployment: str, progress: Callable[[str], None]) -> dict:
    """The deployment's record before its first step: its settings (describe.describe) and where its server figures
    come from (`server_metrics`); what the server lacks of latlab's extras is said once per run."""
    host, server_metrics, provider = plan.workload.host, plan.provenance.server_metrics, plan.provenance.provider
    info = describe(host, deployment)
    source = metrics_source(host, server_metrics)
    notice = extras_notice(host, info, source, given=bool(server_metrics))
    if notice and hasattr(progress, "once"):
        progress.once(*notice)
    elif notice:
        progress(notice[1])
    if provider and not info.get("provider"):
        info = {**info, "provider": provider, "provider_from": "--provider"}
    elif provider and str(info["provider"]).lower() != provider.lower():
        progress(f"{deployment}: --provider {provider} ignored: the server says {info['provider']}")
    _say_truncation(plan, deployment, progress)
    return {**info, "server_metrics": source.as_dict()}


def _say_truncation(plan: SweepPlan, deployment: str, progress: Callable[[str], None]) -> None:
    """Where sizes vary and the deployment says its maximum (a text deployment's max_length): how many requests
    would be longer, which the users send at the maximum."""
    sizes, arrivals = plan.workload.payload.size_spec, plan.schedule.arrivals
    if not sizes.varies:
        return
    metadata = fetch(plan.workload.host, f"/v2/models/{deployment}", timeout=10)
    cap = max_length(metadata.json()) if metadata.status_code == 200 else 0
    column = sizes.column_values(load_trace(arrivals.trace).columns, arrivals.trace) if sizes.kind == "trace" else ()
    line = truncation_line(sizes, deployment, cap, column) if cap else None
    if line:
        progress(line)


def _wait_for_server(host: str, deployment: str, step: Step, progress: Callable[[str], None]) -> None:
    """After an interrupted step: go on once the server answers again (its model's standard metadata route, which
    every OIP server has), or raise ServerGone."""
    try:
        fetch(host, f"/v2/models/{deployment}", attempts=int(SERVER_BACK_S), pause_s=1.0)
    except requests.ConnectionError as exc:
        raise ServerGone(
            f"the server stopped answering ({step.interruption}) and was not back within {SERVER_BACK_S:g} s: {exc}"
        ) from None
    progress(
        f"{deployment}: step at {step.target:g} was interrupted ({step.interruption}); "
        "the server answers again, going on"
    )
