"""Drives Locust step by step (or through an SLO search) and writes the run's results file.

Import this module before anything that uses sockets or threads: Locust monkey-patches them for gevent.
"""

from __future__ import annotations

import locust  # noqa: F401 - imported first for its side effect: gevent's monkey-patching must precede other imports

import dataclasses
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import gevent
import requests
from prometheus_client import CollectorRegistry

from latlab.common import machine
from latlab.loadtest.confidence import decide, percentile_interval, step_confidence
from latlab.loadtest.driver import LoadDriver
from latlab.loadtest.calibrate import calibrate
from latlab.loadtest.floor import near_floor
from latlab.loadtest.overload import OverloadPlan, run_overload
from latlab.loadtest.plan import SweepPlan
from latlab.loadtest.loadgen_metrics import LoadGenMetrics, start_exporter
from latlab.loadtest.recorder import MIN_SAMPLES_P99, Recorder, recovery_spans
from latlab.loadtest.results import Deployment, Run, Step, write_results
from latlab.loadtest.scrape import QueueWatch, average_batch, describe, fetch, scrape_batches
from latlab.loadtest.scrape import extras_notice, metrics_source, server_step, snapshot
from latlab.loadtest.payloads import options_of
from latlab.loadtest.search import SATURATED_BELOW, bracket_slos, is_stable, open_slos, slo_search
from latlab.loadtest.single import one_at_a_time

GENERATOR_BOUND_CPU = 90.0  # % of one core used by a generator process during a step
SERVER_BACK_S = 10.0  # after an interrupted step, how long to wait for the server to answer again
LONGEST_WINDOW_S = 10.0  # a low rate's windows grow to hold MIN_SAMPLES_P99 requests in three, up to this
RAISE_BY = 1.5  # past the listed rates, each step offers this much more until saturation or the cap
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
    run_one: Callable[..., Deployment] | None = None,
) -> Run:
    """Sweep (or search) every deployment in turn; write and return the run.
    `run_one(plan, driver, metrics, deployment, progress)` replaces the sweep of one deployment
    (the overload test uses it)."""
    progress = _Progress(progress)
    registry = CollectorRegistry()
    metrics = LoadGenMetrics(registry, run_id)
    if plan.metrics_port:
        start_exporter(metrics, plan.metrics_port)
        progress(f"load generator metrics on http://127.0.0.1:{plan.metrics_port}/metrics")
    run = Run(
        run_id=run_id,
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        host=plan.host,
        machine=machine.describe(plan.machine_name),
        mode=plan.mode,
        arrivals=("poisson" if plan.poisson else "constant") if plan.mode == "open" else "closed loop",
        payload={
            "encoding": "binary" if plan.binary else "json",
            "seq_len": plan.seq_len,
            "client": plan.client,
            "text": plan.text,
            "seq_len_max": plan.seq_len_max,
            **({"inputs": plan.inputs} if plan.inputs else {}),
        },
        slo_p99_s=plan.slo_p99_s,
    )
    driver = LoadDriver(plan, metrics, progress)
    run.events = driver.events  # the fleet's events (a worker lost), as they happen
    try:
        run.workers = driver.processes if driver.distributed else 0
        if plan.mode == "open" and plan.calibrate_seconds > 0:
            driver.floor = calibrate(driver, plan.loads, plan.max_rate, plan.calibrate_seconds, progress)
            run.generator_floor = driver.floor
            write_results(out_path, run)  # a run of no deployment (--calibrate-only) is its floor
        for deployment in plan.deployments:
            run.deployments.append((run_one or _run_deployment)(plan, driver, metrics, deployment, progress))
            run.context()  # each deployment told its run (and that it ran on the run's machine), as a reader is
            write_results(out_path, run)  # a partial run still leaves its finished deployments behind
    finally:
        driver.close()
    if driver.events:
        write_results(out_path, run)  # a worker may also have been lost after the last step
    if plan.metrics_port:
        gevent.sleep(2.5)  # let Prometheus scrape the last step before the exporter goes away
    return run


class ServerGone(requests.ConnectionError):
    """The server stopped answering during a step and did not come back."""


def _run_deployment(
    plan: SweepPlan, driver: LoadDriver, metrics: LoadGenMetrics, deployment: str, progress: Callable[[str], None]
) -> Deployment:
    info = _describe(plan, deployment, progress)
    steps: list[Step] = []

    def measure(load: float) -> Step:
        step = measure_step(
            plan, driver, metrics, deployment, load, index=len(steps), decide_for=open_slos(plan.slos_s, steps, load)
        )
        steps.append(step)
        progress(progress_line(deployment, step, plan.mode, driver.floor))
        if step.server_interrupted:
            _wait_for_server(plan.host, deployment, step, progress)
        return step

    if plan.search and plan.slo_p99_s:
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
    stop_reason, saturated = _sweep_rates(plan, measure)
    progress(f"{deployment}: {stop_reason}")
    cap = max(plan.max_rate, max(plan.loads)) if plan.mode == "open" else None
    interrupted = stop_reason.startswith("stopped at") and not saturated  # the server or the fleet went away
    brackets = {}
    if plan.slos_s and plan.mode == "open" and not interrupted:
        brackets = _bracket_slos(plan, driver, deployment, measure, steps, progress)
    return _record(
        info,
        steps=sorted(steps, key=lambda s: s.target),
        stop_reason=stop_reason,
        saturated=saturated,
        rate_cap_rps=cap,
        **brackets,
    )


_DEPLOYMENT_FIELDS = frozenset(f.name for f in dataclasses.fields(Deployment) if not f.metadata.get("context"))


def _record(info: dict, **fields: object) -> Deployment:
    """A deployment's record: its description (`_describe`) with `fields` over it. A key of the description that
    is no Deployment field (a newer server's /config) is left out: results files hold only known fields."""
    return Deployment(**{**{k: v for k, v in info.items() if k in _DEPLOYMENT_FIELDS}, **fields})


def _sweep_rates(plan: SweepPlan, measure: Callable[[float], Step]) -> tuple[str, bool]:
    """Step through the listed loads; with a cap, raise the rate until the deployment saturates, breaks the SLO
    or errs, then narrow the bracket to plan.refine_within. (why it stopped, whether the deployment's limit did)."""
    listed, passed, failed, why = list(plan.loads[1:]), None, None, ""
    load: float | None = plan.loads[0]
    while load is not None:
        try:
            reason = _stop_reason(measure(load), plan)
        except ServerGone as exc:
            return f"stopped at {load:g}: {exc}", False
        if reason and reason.startswith("no Locust worker"):
            return f"stopped at {load:g}: {reason}", False
        if reason:
            failed, why = load, reason
        else:
            passed = load
        load = _next_load(plan, listed, passed, failed)
    if failed is not None:
        return f"stopped at {failed:g}: {why}", True
    capped = plan.max_rate > max(plan.loads)
    return (f"rate cap {plan.max_rate:g} reached" if capped else "all loads done") + ": not saturated", False


def _bracket_slos(
    plan: SweepPlan,
    driver: LoadDriver,
    deployment: str,
    measure: Callable[[float], Step],
    steps: list[Step],
    progress: Callable[[str], None],
) -> dict:
    """Every SLO's bracket narrowed to plan.resolution with extra steps (search.bracket_slos); each extra step,
    and the one-at-a-time probe, after the previous step's backlog has drained."""

    def step(rate: float) -> Step:
        driver.drain()
        return measure(rate)

    def single() -> dict:
        driver.drain()
        found = one_at_a_time(plan.host, deployment, options_of(plan))
        progress(single_line(deployment, found))
        return found

    deadline = time.monotonic() + plan.max_slo_seconds

    def time_left() -> bool:
        return not plan.max_slo_seconds or time.monotonic() < deadline

    try:
        return bracket_slos(
            plan.slos_s, steps, step, single, plan.resolution, lowest_rate(plan), plan.max_slo_steps, time_left
        )
    except ServerGone as exc:
        progress(f"{deployment}: SLO brackets stopped: {exc}")
        return {}


def lowest_rate(plan: SweepPlan) -> float:
    """The lowest rate an SLO bracket measures: its three longest windows still expect 1.5x MIN_SAMPLES_P99."""
    return 1.5 * MIN_SAMPLES_P99 / (plan.min_windows * LONGEST_WINDOW_S)


def single_line(deployment: str, single: dict) -> str:
    if not single["requests"]:
        return f"{deployment:>14}  one at a time: no request answered"
    return (
        f"{deployment:>14}  one at a time: {single['requests']} requests  p50 {single['p50_s'] * 1e3:7.2f} ms  "
        f"p99 {single['p99_s'] * 1e3:7.2f} ms  errors {single['errors']}"
    )


def _next_load(plan: SweepPlan, listed: list[float], passed: float | None, failed: float | None) -> float | None:
    """The next listed rate; past them, x RAISE_BY up to the cap; after a failure, the bracket's middle while it
    is wider than refine_within (only when raising was asked for: a plain sweep stops at its first failure)."""
    if failed is None:
        if listed:
            return listed.pop(0)
        if plan.mode != "open" or passed is None or passed >= plan.max_rate:
            return None
        return min(passed * RAISE_BY, plan.max_rate)
    if plan.mode != "open" or not plan.max_rate or passed is None or failed - passed <= plan.refine_within * passed:
        return None
    return (passed + failed) / 2


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
            plan.slo_p99_s,
            start=plan.loads[0],
            resolution=plan.search_resolution,
            min_rate=plan.search_floor,
            growth=plan.search_growth,
        )
    except ServerGone as exc:
        return None, f"search stopped: {exc}"
    return result.as_dict(), result.summary()


def overload_runner(overload: OverloadPlan) -> Callable[..., Deployment]:
    """What `run_sweep(run_one=...)` calls per deployment for the overload test instead of a sweep."""

    def run_one(
        plan: SweepPlan, driver: LoadDriver, metrics: LoadGenMetrics, deployment: str, progress: Callable[[str], None]
    ) -> Deployment:
        info = _describe(plan, deployment, progress)
        steps: list[Step] = []

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
            timing = replace(
                plan,
                warmup_seconds=warmup,
                window_seconds=seconds / windows,
                min_windows=windows,
                max_windows=windows,
                stop_at_saturation=False,
                queue_sample_seconds=QUEUE_SAMPLE_S,
            )
            step = measure_step(timing, driver, metrics, deployment, load, index=len(steps), spans=spans, phase=name)
            steps.append(step)
            progress(f"{name:>9}: {progress_line(deployment, step, 'open').strip()}")
            return step

        def outstanding() -> int:
            driver.drain(timeout_s=10.0)
            return driver.state.recorder.outstanding

        figures = run_overload(phase, overload, plan.loads[0], plan.window_seconds * 3, info, outstanding)
        progress(f"{deployment}: {figures['summary']}")
        # not a sweep: it does not say whether its loads stopped short of saturation (reports then count it saturated)
        return _record(info, steps=steps, overload=figures, stop_reason=figures["summary"], saturated=None)

    return run_one


def _describe(plan: SweepPlan, deployment: str, progress: Callable[[str], None]) -> dict:
    """The deployment's record before its first step: its settings (scrape.describe) and where its server figures
    come from (`server_metrics`); what the server lacks of latlab's extras is said once per run."""
    info = describe(plan.host, deployment)
    source = metrics_source(plan.host, plan.server_metrics)
    notice = extras_notice(plan.host, info, source, given=bool(plan.server_metrics))
    if notice and hasattr(progress, "once"):
        progress.once(*notice)
    elif notice:
        progress(notice[1])
    if plan.provider and not info.get("provider"):
        info = {**info, "provider": plan.provider, "provider_from": "--provider"}
    elif plan.provider and str(info["provider"]).lower() != plan.provider.lower():
        progress(f"{deployment}: --provider {plan.provider} ignored: the server says {info['provider']}")
    return {**info, "server_metrics": source.as_dict()}


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


def measure_step(
    plan: SweepPlan,
    driver: LoadDriver,
    metrics: LoadGenMetrics,
    deployment: str,
    load: float,
    index: int,
    spans: bool = False,
    phase: str | None = None,
    decide_for: tuple[float, ...] | None = None,
) -> Step:
    """Warm up, then measure windows until the last three agree (or max_windows); the step's figures
    come from the last three windows together, its `timeline` has every window. With `spans` (the overload
    test's recovery): the plan's windows as they are, short for time resolution, and `recovery_spans`, the
    requests pooled from each window on (see recorder.recovery_spans). `phase`: the overload test's phase.
    `decide_for`: the SLOs the step is lengthened to decide (search.open_slos; default every one of plan.slos_s);
    it records its decision for every SLO all the same."""
    began = time.time()
    if not spans:
        plan = replace(plan, window_seconds=window_for(plan, load))
    driver.step_index = index
    driver.set_load(deployment, load)
    metrics.set_load(
        deployment,
        index,
        load if plan.mode == "open" else 0.0,
        int(load) if plan.mode == "closed" else driver.runner.user_count,
    )
    source = metrics_source(plan.host, plan.server_metrics)  # asked once per run: none, latlab's or Triton's
    queue = QueueWatch(plan.host, deployment, plan.queue_sample_seconds if source.kind == "latlab" else 0.0)
    gevent.sleep(plan.warmup_seconds)
    recorder = driver.state.recorder
    lag = driver.lag_s
    batches_before = scrape_batches(plan.host, deployment, url=source.url) if source.url else None
    server_before = snapshot(plan.host, url=source.url) if source.url else None  # where a request's time went
    driver.generator_cpu()
    start = time.time()
    windows, stable = _windows_until_stable(plan, recorder, start, lag)
    decide = plan.slos_s if decide_for is None else decide_for
    extended = 0 if spans else _extend_until_decided(plan, decide, recorder, start, lag, windows)
    end = start + len(windows) * plan.window_seconds
    first = end - (min(3, len(windows) - extended) + extended) * plan.window_seconds
    cpu = driver.generator_cpu()
    driver.await_answers(end)
    stats, latencies, per_source = recorder.window_detail(first, end, time.time())
    pooled = (
        recovery_spans(recorder, [w["samples"] for w in windows], start, plan.window_seconds, time.time())
        if spans
        else None
    )
    batches_after = scrape_batches(plan.host, deployment, url=source.url) if source.url else None
    server_after = snapshot(plan.host, url=source.url) if source.url else None
    by_status = recorder.by_status(first, end)
    unread = (batches_before is None) + (batches_after is None) if source.url else 0  # none to read: not a failure
    interruption = _interruption(by_status, queue.failures + unread)
    step = Step(
        target=load,
        target_rps=load if plan.mode == "open" else None,
        users=int(load) if plan.mode == "closed" else driver.runner.user_count,
        **stats.as_dict(),
        duration_s=end - first,
        windows=len(windows),
        extended_windows=extended,
        window_seconds=plan.window_seconds,
        stable=stable,
        avg_batch_size=average_batch(batches_before, batches_after),
        server=server_step(server_before, server_after, deployment),
        generator_cpu_percent=cpu,
        generator_bound=cpu > GENERATOR_BOUND_CPU,
        sent_by_worker=per_source if driver.distributed else None,
        by_status=by_status,
        **queue.stop(),
        server_interrupted=interruption is not None,
        interruption=interruption,
        workers_lost=driver.lost_since(began),
        workers_left=driver.processes if driver.distributed else None,
        start_time=start,
        end_time=end,
        timeline=windows,
        confidence=step_confidence(
            latencies, [*plan.slos_s, *([plan.slo_p99_s] if plan.slo_p99_s else [])], plan.confidence
        ),
        phase=phase,
        recovery_spans=pooled,
    )
    metrics.record_step(deployment, index, latencies, step, ended_at=end)
    metrics.count_dropped(deployment, stats.dropped)
    metrics.count_late(deployment, stats.late)
    recorder.forget_before(first)
    return step


def window_for(plan: SweepPlan, load: float) -> float:
    """The plan's window, lengthened at a low rate so the step's three windows hold MIN_SAMPLES_P99 requests
    (up to LONGEST_WINDOW_S): at 5 req/s a 1.5 s window holds 7, and its "p99" would be a maximum."""
    if plan.mode != "open" or load <= 0:
        return plan.window_seconds
    # 1.5x the minimum expected, so that Poisson noise rarely leaves the step below it
    return max(plan.window_seconds, min(LONGEST_WINDOW_S, 1.5 * MIN_SAMPLES_P99 / (3 * load)))


def _windows_until_stable(plan: SweepPlan, recorder: Recorder, start: float, lag: float) -> tuple[list[dict], bool]:
    """Consecutive windows from `start`, each read `lag` after its end (late responses), until the last
    three agree (stable) or max_windows were taken."""
    windows: list[dict] = []
    while True:
        windows.append(_next_window(plan, recorder, start, lag, len(windows)))
        if len(windows) >= plan.min_windows:
            stable = is_stable(windows[-3:])
            if stable or len(windows) >= plan.max_windows:
                return windows, stable


def _next_window(plan: SweepPlan, recorder: Recorder, start: float, lag: float, index: int) -> dict:
    """Window `index` from `start`, read `lag` after its end, with its p99 interval (search.is_stable)."""
    edge = start + (index + 1) * plan.window_seconds
    gevent.sleep(max(0.0, edge + lag - time.time()))
    window_start = edge - plan.window_seconds
    stats, latencies, _ = recorder.window_detail(window_start, edge, time.time())
    p99 = percentile_interval(latencies, 0.99, plan.confidence)
    return {
        "t_s": window_start - start,
        **stats.as_dict(),
        "p99_low_s": p99.as_dict()["low"],
        "p99_high_s": p99.as_dict()["high"],
    }


def _extend_until_decided(
    plan: SweepPlan, slos_s: tuple[float, ...], recorder: Recorder, start: float, lag: float, windows: list[dict]
) -> int:
    """Add windows to a step while its p99 is undecided for one of `slos_s` (too few requests to say on which
    side of the bound it lies) and the plan.decide_windows still allowed could bring the requests a decision
    needs (loadtest/confidence.py's `needed`): a low rate's step, whose 150 requests cannot show a p99 met, gets
    the windows that can; a step whose tail sits on the bound, needing thousands more, gets none. Returns how
    many were added; the step's figures then come from its last three windows and these."""
    added = 0
    while slos_s and added < plan.decide_windows:
        counted = min(3, len(windows) - added) + added
        end = start + len(windows) * plan.window_seconds
        # A request still unanswered counts its age so far; read once every one is answered or older than the
        # largest bound, so none that will end over it passes for within it (and the step for decided).
        gevent.sleep(max(0.0, end + max(slos_s) + lag - time.time()))
        _, latencies, _ = recorder.window_detail(end - counted * plan.window_seconds, end, time.time())
        open_ = [
            d for d in (decide(latencies, slo, 0.99, plan.confidence) for slo in slos_s) if d.verdict == "undecided"
        ]
        reachable = len(latencies) * (counted + plan.decide_windows - added) / counted
        if not any(d.needed is not None and d.needed <= reachable for d in open_):
            break  # decided, or the windows left could not bring enough requests to decide
        windows.append(_next_window(plan, recorder, start, lag, len(windows)))
        added += 1
    return added


def _interruption(by_status: dict, failed_scrapes: int) -> str | None:
    """Why the step was interrupted by the server going away, or None when it was not."""
    unanswered = by_status.get("0", {})
    kinds = ", ".join(f"{kind} {count}" for kind, count in unanswered.get("errors", {}).items())
    parts = []
    if unanswered:
        parts.append(f"{unanswered['count']} requests got no HTTP answer" + (f" ({kinds})" if kinds else ""))
    if failed_scrapes:
        parts.append(f"/metrics unreachable {failed_scrapes} times")
    return ", ".join(parts) or None


def _stop_reason(step: Step, plan: SweepPlan) -> str | None:
    if step.workers_left == 0:
        return "no Locust worker left to send load"
    if step.server_interrupted or step.workers_lost:
        return None  # the errors and the shortfall are the restart's (or the lost worker's), not this load's
    if plan.mode == "open" and plan.stop_at_saturation and step.achieved_rps < SATURATED_BELOW * step.offered_rps:
        return f"saturated: achieved {step.achieved_rps:.0f} < 90% of offered {step.offered_rps:.0f} req/s"
    if step.sent and step.errors / step.sent > plan.max_error_ratio:
        return f"{step.errors} errors of {step.sent} requests"
    if plan.slo_p99_s and step.p99_s is not None and step.p99_s > plan.slo_margin * plan.slo_p99_s:
        return f"p99 {step.p99_s * 1e3:.1f} ms broke the SLO by more than {plan.slo_margin:g}x"
    return None


def progress_line(deployment: str, step: Step, mode: str, floor: dict | None = None) -> str:
    flags = ("" if step.stable else "  [unstable]") + ("  [generator-bound]" if step.generator_bound else "")
    if near_floor(step, floor):
        flags += "  [near the generator's floor]"
    if step.server_interrupted:
        flags += f"  [server interrupted: {step.interruption}]"
    if step.workers_lost:
        flags += f"  [workers lost: {', '.join(step.workers_lost)}]"
    batch = f"{step.avg_batch_size:.1f}" if step.avg_batch_size else "-"
    load = f"offered {step.offered_rps:7.0f}/s" if mode == "open" else f"users {step.users:4d}"
    late = step.send_lateness_p99_s
    sending = f"  sent late p99 {late * 1e3:.2f} ms" if mode == "open" and late is not None else ""
    return (
        f"{deployment:>14}  {load}  achieved {step.achieved_rps:7.0f}/s  "
        f"p50 {step.p50_s * 1e3:7.2f} ms  p99 {step.p99_s * 1e3:7.2f} ms  "
        f"errors {step.errors}  batch {batch}{sending}{flags}"
    )
