"""One step of a sweep at one load: warm up, then measure windows until the last three agree, lengthened where an
SLO is undecided; the step's figures and its progress line. The sweep (sweep.py) and the overload test run it.

Import this module before anything that uses sockets or threads: Locust monkey-patches them for gevent.
"""

from __future__ import annotations

import locust  # noqa: F401 - imported first for its side effect: gevent's monkey-patching must precede other imports

import time
from dataclasses import replace

import gevent

from latlab.loadtest.confidence import decide, percentile_interval, step_confidence
from latlab.loadtest.driver import LoadDriver
from latlab.loadtest.floor import near_floor
from latlab.loadtest.loadgen_metrics import LoadGenMetrics
from latlab.loadtest.machine_load import other_load, other_load_text
from latlab.loadtest.plan import SweepPlan
from latlab.loadtest.recorder import MIN_SAMPLES_P99, Recorder, recovery_spans
from latlab.loadtest.results import Step
from latlab.loadtest.schedule import Schedule, SloSearch
from latlab.loadtest.scrape import QueueWatch, average_batch, metrics_source, scrape_batches, server_step, snapshot
from latlab.loadtest.search import GENERATOR_BOUND_CPU, is_stable, late_for

BURSTS_PER_WINDOW = 3  # bursts (with their lulls) each measurement window holds under bursty arrivals
LONGEST_WINDOW_S = 10.0  # a low rate's windows grow to hold MIN_SAMPLES_P99 requests in three, up to this


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
    `decide_for`: the SLOs the step is lengthened to decide (search.open_slos; default every one of the plan's
    slos); it records its decision for every SLO all the same."""
    began = time.time()
    schedule = plan.schedule
    if not spans:
        schedule = replace(schedule, window_seconds=window_for(schedule, load))
    host, mode, window_s = plan.workload.host, schedule.mode, schedule.window_seconds
    driver.step_index = index
    driver.set_load(deployment, load)
    metrics.set_load(
        deployment,
        index,
        load if mode == "open" else 0.0,
        int(load) if mode == "closed" else driver.runner.user_count,
    )
    source = metrics_source(host, plan.provenance.server_metrics)  # asked once per run: none, latlab's or Triton's
    queue = QueueWatch(host, deployment, schedule.queue_sample_seconds if source.kind == "latlab" else 0.0)
    gevent.sleep(schedule.warmup_seconds)
    recorder = driver.state.recorder
    lag = driver.lag_s
    batches_before = scrape_batches(host, deployment, url=source.url) if source.url else None
    server_before = snapshot(host, url=source.url) if source.url else None  # where a request's time went
    driver.generator_cpu()
    driver.machine.busy_cores()
    start = time.time()
    windows, stable = _windows_until_stable(schedule, plan.slo.confidence, recorder, start, lag)
    decide = plan.slo.slos.seconds if decide_for is None else decide_for
    extended = 0 if spans else _extend_until_decided(schedule, plan.slo, decide, recorder, start, lag, windows)
    end = start + len(windows) * window_s
    first = end - (min(3, len(windows) - extended) + extended) * window_s
    cpu = driver.generator_cpu()
    machine_busy = driver.machine.busy_cores()
    driver.await_answers(end)
    stats, latencies, per_source = recorder.window_detail(first, end, time.time())
    pooled = recovery_spans(recorder, [w["samples"] for w in windows], start, window_s, time.time()) if spans else None
    batches_after = scrape_batches(host, deployment, url=source.url) if source.url else None
    server_after = snapshot(host, url=source.url) if source.url else None
    by_status = recorder.by_status(first, end)
    unread = (batches_before is None) + (batches_after is None) if source.url else 0  # none to read: not a failure
    interruption = _interruption(by_status, queue.failures + unread)
    server = server_step(server_before, server_after, deployment)
    step = Step(
        target=load,
        target_rps=load if mode == "open" else None,
        users=int(load) if mode == "closed" else driver.runner.user_count,
        **stats.as_dict(),
        duration_s=end - first,
        windows=len(windows),
        extended_windows=extended,
        window_seconds=window_s,
        stable=stable,
        avg_batch_size=average_batch(batches_before, batches_after),
        server=server,
        generator_cpu_percent=cpu,
        machine_busy_cores=machine_busy,
        other_load_cores=other_load(
            machine_busy,
            (server or {}).get("process_cpu_cores"),
            driver.generator_cores,
            host,
            fleet=bool(plan.provenance.fleet),
        ),
        generator_bound=cpu > GENERATOR_BOUND_CPU or late_for(stats.send_lateness_p99_s, stats.p99_s, plan.slo.bounds),
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
        confidence=step_confidence(latencies, plan.slo.bounds, plan.slo.confidence),
        phase=phase,
        recovery_spans=pooled,
    )
    metrics.record_step(deployment, index, latencies, step, ended_at=end)
    metrics.count_dropped(deployment, stats.dropped)
    metrics.count_late(deployment, stats.late)
    recorder.forget_before(first)
    return step


def window_for(schedule: Schedule, load: float) -> float:
    """The schedule's window, lengthened at a low rate so the step's three windows hold MIN_SAMPLES_P99 requests
    (up to LONGEST_WINDOW_S): at 5 req/s a 1.5 s window holds 7, and its "p99" would be a maximum. Under bursty
    arrivals, so that each window holds as many independent requests (Arrivals.dispersion) and BURSTS_PER_WINDOW
    bursts (Arrivals.burst_cycle_s): the requests of one burst queue behind each other and share their fate, and
    windows of one burst each would disagree by chance and never settle (the confidence of a percentile counts
    requests, not bursts)."""
    if schedule.mode != "open" or load <= 0:
        return schedule.window_seconds
    # 1.5x the minimum expected, so that Poisson noise rarely leaves the step below it
    arrivals = schedule.arrivals
    enough = max(
        1.5 * MIN_SAMPLES_P99 * arrivals.dispersion / (3 * load), BURSTS_PER_WINDOW * arrivals.burst_cycle_s(load)
    )
    return max(schedule.window_seconds, min(LONGEST_WINDOW_S, enough))


def _windows_until_stable(
    schedule: Schedule, confidence: float, recorder: Recorder, start: float, lag: float
) -> tuple[list[dict], bool]:
    """Consecutive windows from `start`, each read `lag` after its end (late responses), until the last
    three agree (stable) or max_windows were taken."""
    windows: list[dict] = []
    while True:
        windows.append(_next_window(schedule.window_seconds, confidence, recorder, start, lag, len(windows)))
        if len(windows) >= schedule.min_windows:
            stable = is_stable(windows[-3:])
            if stable or len(windows) >= schedule.max_windows:
                return windows, stable


def _next_window(window_s: float, confidence: float, recorder: Recorder, start: float, lag: float, index: int) -> dict:
    """Window `index` from `start`, read `lag` after its end, with its p99 interval (search.is_stable)."""
    edge = start + (index + 1) * window_s
    gevent.sleep(max(0.0, edge + lag - time.time()))
    window_start = edge - window_s
    stats, latencies, _ = recorder.window_detail(window_start, edge, time.time())
    p99 = percentile_interval(latencies, 0.99, confidence)
    return {
        "t_s": window_start - start,
        **stats.as_dict(),
        "p99_low_s": p99.as_dict()["low"],
        "p99_high_s": p99.as_dict()["high"],
    }


def _extend_until_decided(
    schedule: Schedule,
    slo: SloSearch,
    slos_s: tuple[float, ...],
    recorder: Recorder,
    start: float,
    lag: float,
    windows: list[dict],
) -> int:
    """Add windows to a step while its p99 is undecided for one of `slos_s` (too few requests to say on which
    side of the bound it lies) and the slo.decide_windows still allowed could bring the requests a decision
    needs (loadtest/confidence.py's `needed`): a low rate's step, whose 150 requests cannot show a p99 met, gets
    the windows that can; a step whose tail sits on the bound, needing thousands more, gets none. Returns how
    many were added; the step's figures then come from its last three windows and these."""
    added, window_s = 0, schedule.window_seconds
    allowed, confidence = slo.decide_windows, slo.confidence
    while slos_s and added < allowed:
        counted = min(3, len(windows) - added) + added
        end = start + len(windows) * window_s
        # A request still unanswered counts its age so far; read once every one is answered or older than the
        # largest bound, so none that will end over it passes for within it (and the step for decided).
        gevent.sleep(max(0.0, end + max(slos_s) + lag - time.time()))
        _, latencies, _ = recorder.window_detail(end - counted * window_s, end, time.time())
        open_ = [d for d in (decide(latencies, slo, 0.99, confidence) for slo in slos_s) if d.verdict == "undecided"]
        reachable = len(latencies) * (counted + allowed - added) / counted
        if not any(d.needed is not None and d.needed <= reachable for d in open_):
            break  # decided, or the windows left could not bring enough requests to decide
        windows.append(_next_window(window_s, confidence, recorder, start, lag, len(windows)))
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


def progress_line(deployment: str, step: Step, mode: str, floor: dict | None = None) -> str:
    flags = ("" if step.stable else "  [unstable]") + ("  [generator-bound]" if step.generator_bound else "")
    if near_floor(step, floor):
        flags += "  [near the generator's floor]"
    if step.server_interrupted:
        flags += f"  [server interrupted: {step.interruption}]"
    if step.workers_lost:
        flags += f"  [workers lost: {', '.join(step.workers_lost)}]"
    if other_load_text(step.other_load_cores):
        flags += f"  [{other_load_text(step.other_load_cores)}]"
    batch = f"{step.avg_batch_size:.1f}" if step.avg_batch_size else "-"
    load = f"offered {step.offered_rps:7.0f}/s" if mode == "open" else f"users {step.users:4d}"
    late = step.send_lateness_p99_s
    sending = f"  sent late p99 {late * 1e3:.2f} ms" if mode == "open" and late is not None else ""
    return (
        f"{deployment:>14}  {load}  achieved {step.achieved_rps:7.0f}/s  "
        f"p50 {step.p50_s * 1e3:7.2f} ms  p99 {step.p99_s * 1e3:7.2f} ms  "
        f"errors {step.errors}  batch {batch}{sending}{flags}"
    )
