"""latlab.loadtest.overload: the figures of a burst and the time to recover, from simulated steps alone."""

from __future__ import annotations

from typing import Callable

import pytest

from latlab.common.settings import BatcherSettings
from latlab.loadtest.overload import (
    NORMAL_P99_FACTOR,
    TAIL_REQUESTS,
    admitted_backlog,
    drain_seconds,
    overload_figures,
    recovery_time,
    run_overload,
)
from latlab.loadtest.plan import OverloadPlan
from latlab.loadtest.recorder import Recorder, recovery_spans
from latlab.loadtest.results import Step
from tests.loadtest.steps import simulated


def window(
    t_s: float,
    p99_s: float = 0.02,
    errors: int = 0,
    offered: float = 90.0,
    achieved: float = 90.0,
    incomplete: int = 0,
    samples: int = 45,
) -> dict:
    return {
        "t_s": t_s,
        "p99_s": p99_s,
        "errors": errors,
        "offered_rps": offered,
        "achieved_rps": achieved,
        "incomplete": incomplete,
        "samples": samples,
    }


def pooled(p99_s: float | None = 0.02, samples: int = 120, **fields) -> dict:
    return window(0.0, p99_s=p99_s, samples=samples, **fields)


def recovery(spans: list[tuple[dict, dict]], width: float = 0.5) -> Step:
    """A recovery step: (run, rest) pooled figures from each window on."""
    return simulated(
        window_seconds=width,
        duration_s=width * len(spans),
        windows=len(spans),
        start_time=100.2,
        recovery_spans=[{"t_s": k * width, "run": run, "rest": rest} for k, (run, rest) in enumerate(spans)],
    )


def test_recovery_starts_at_the_first_window_from_which_requests_were_served_normally() -> None:
    spans = [
        (pooled(p99_s=0.4), pooled(p99_s=0.3)),  # the backlog's slow answers
        (pooled(achieved=50.0), pooled()),  # throughput short
        (pooled(errors=1), pooled(errors=1)),  # an error
        (pooled(samples=99), pooled()),  # too few requests to have a p99
        (pooled(), pooled()),
        (pooled(p99_s=0.1), pooled()),
        (pooled(), pooled()),
    ]
    seconds, after = recovery_time(recovery(spans), baseline_p99_s=0.02)
    assert seconds == pytest.approx(2.0)  # the window starting at 2.0 s
    assert after == "2/3"  # the run from 2.5 s has p99 100 ms, > 4x the 20 ms baseline


def test_a_server_that_falls_back_has_not_recovered() -> None:
    """Every run from some window on is normal except the rest of the phase: the server got slow again."""
    spans = [(pooled(), pooled(p99_s=0.2)) for _ in range(5)] + [(pooled(p99_s=0.2), pooled(p99_s=0.2))]
    assert recovery_time(recovery(spans), 0.02) == (None, "0/6")


def test_no_normal_window_is_no_recovery() -> None:
    assert recovery_time(recovery([(pooled(samples=3), pooled(samples=3)), (pooled(p99_s=None), pooled())]), 0.02) == (
        None,
        "0/2",
    )


def served(recorder: Recorder, latency_at: Callable[[float], float], rate: float, seconds: float) -> None:
    """Requests at `rate` for `seconds` from t = 0, each answered `latency_at(t)` after its intended time."""
    for i in range(int(rate * seconds)):
        t = i / rate
        key = recorder.begin(t, t)
        recorder.end(key, t + latency_at(t), True)


def spans_of(recorder: Recorder, windows: int, width: float) -> Step:
    samples = [recorder.window(k * width, (k + 1) * width, 1e9).samples for k in range(windows)]
    return simulated(window_seconds=width, recovery_spans=recovery_spans(recorder, samples, 0.0, width, 1e9))


def test_a_few_slow_requests_after_the_drain_cannot_flip_the_recovery() -> None:
    """40 req/s in 0.5 s windows (20 requests each): a backlog answered slowly for 1.5 s, then 10 ms answers
    with one 300 ms straggler at 5 s and one at 8 s. Judged window by window, the stragglers' windows are
    abnormal (p99 of 20 requests is their maximum); pooled, the server recovered at 1.5 s."""
    recorder = Recorder()
    stragglers = {200, 320}  # request indices: 5.0 s and 8.0 s

    def latency(t: float) -> float:
        return 0.3 if round(t * 40) in stragglers else (0.5 - t / 3 if t < 1.5 else 0.01)

    served(recorder, latency, rate=40, seconds=12)
    seconds, _ = recovery_time(spans_of(recorder, windows=24, width=0.5), baseline_p99_s=0.012)
    assert seconds == pytest.approx(1.5)
    per_window = [recorder.window(k * 0.5, (k + 1) * 0.5, 1e9).p99_s for k in range(24)]
    assert sum(p > NORMAL_P99_FACTOR * 0.012 for p in per_window[3:]) == 2  # what a per-window judgement trips on


def test_a_server_that_never_drains_never_recovers() -> None:
    recorder = Recorder()
    served(recorder, lambda t: 0.5 + t / 10, rate=40, seconds=12)  # a queue that only grows
    assert recovery_time(spans_of(recorder, windows=24, width=0.5), baseline_p99_s=0.012)[0] is None


def test_the_expected_drain_is_the_admitted_backlog_over_the_spare_capacity() -> None:
    info = {"batcher": BatcherSettings.partial(max_queue_size=72, max_batch_size=1, instances=1)}
    assert admitted_backlog(info) == 73
    assert drain_seconds(info, capacity=100.0, recovery_load=0.4) == pytest.approx(73 / 60)
    assert drain_seconds({}, 100.0, 0.4) is None  # a server that does not say what it admits


def test_figures_of_a_burst() -> None:
    by_status = {
        "200": {"count": 900, "p50_s": 0.2, "p99_s": 0.3, "max_s": 0.35},
        "503": {
            "count": 1800,
            "p99_s": 0.004,
            "response_p99_s": 0.002,
            "response_max_s": 0.01,
            "with_retry_after": 1799,
        },
        "504": {"count": 2},
        "0": {"count": 1},
        "500": {"count": 4},
    }
    burst = simulated(
        by_status=by_status,
        offered_rps=450.0,
        achieved_rps=148.0,
        duration_s=60.0,
        incomplete=5,
        queue_depth_max=32.0,
        queue_capacity=32.0,
        end_time=100.0,
        generator_bound=False,
        generator_cpu_percent=30.0,
        dropped=0,
        late=12,
    )
    figures = overload_figures(
        150.0,
        3.0,
        {"batcher": BatcherSettings.partial(timeout_ms=1000)},
        simulated(p99_s=0.02),
        burst,
        recovery([(pooled(), pooled())]),
        hanging=0,
    )
    assert figures["rejected"] == 1800 and figures["rejected_without_retry_after"] == 1
    assert figures["accepted"] == 900 and figures["timeouts"] == 2 and figures["unanswered"] == 1
    assert figures["other_statuses"] == {"500": 4} and figures["timeout_s"] == 1.0
    assert figures["recovery_s"] == pytest.approx(0.0) and figures["recovery_gap_s"] == pytest.approx(0.2)
    assert figures["goodput_source"] == "generator" and figures["goodput_fraction"] == pytest.approx(148 / 150)
    summary = figures["summary"]
    assert summary.startswith("overload 3x (450 req/s offered vs capacity 150, 60 s): served 148 req/s; ")
    assert "503 p99 4.0 ms (response 2.0 ms), Retry-After missing on 1" in summary
    assert "goodput 148 req/s = 99% of capacity;" in summary
    assert "max queue depth 32 of bound 32" in summary and "recovery 0.0 s" in summary


def test_the_phases_measure_capacity_then_baseline_burst_and_recovery() -> None:
    calls: list[tuple] = []
    capacity = 120.0

    def phase(
        name: str,
        load: float,
        seconds: float,
        windows: int = 3,
        warmup: float = 0.0,
        drain: bool = True,
        spans: bool = False,
    ) -> Step:
        calls.append((name, load, seconds, windows, drain, spans))
        served = min(load, capacity)
        by_status = {"200": {"count": int(served * seconds), "p50_s": 0.01, "p99_s": 0.02, "max_s": 0.03}}
        return simulated(
            target=load,
            target_rps=load,
            achieved_rps=served,
            offered_rps=load,
            p99_s=0.02,
            by_status=by_status,
            duration_s=seconds,
            incomplete=0,
            queue_depth_max=32.0,
            queue_capacity=32.0,
            end_time=10.0,
            start_time=10.1,
            generator_bound=False,
            generator_cpu_percent=20.0,
            dropped=0,
            late=0,
            window_seconds=seconds / windows,
            windows=windows,
            timeline=[window(i * seconds / windows) for i in range(windows)],
            recovery_spans=[{"t_s": i * seconds / windows, "run": pooled(), "rest": pooled()} for i in range(windows)]
            if spans
            else None,
            phase=name,
        )

    figures = run_overload(
        phase,
        OverloadPlan(factor=3.0, burst_seconds=60.0),
        start_rate=40.0,
        probe_seconds=3.0,
        info={},
        outstanding=lambda: 0,
    )
    assert [(c[0], c[1]) for c in calls] == [
        ("capacity", 40.0),
        ("capacity", 80.0),
        ("capacity", 160.0),
        ("baseline", 72.0),
        ("burst", 360.0),
        ("recovery", 72.0),
    ]
    assert calls[4][2] == 60.0 and not calls[4][4] and not calls[5][4]  # no pause between burst and recovery
    assert calls[5][3] == 16 and calls[5][5]  # 8 s of 0.5 s windows, pooled
    assert figures["capacity_rps"] == 120.0 and figures["recovery_s"] == pytest.approx(0.0)
    assert figures["drain_s"] is None  # the stub server does not say what it admits

    calls.clear()
    info = {"batcher": BatcherSettings.partial(max_queue_size=64, max_batch_size=1)}
    figures = run_overload(phase, OverloadPlan(capacity_rps=20.0, recovery_load=0.5), 40.0, 3.0, info, lambda: 0)
    # at 10 req/s the phase holds the 65 requests' drain (6.5 s) and then TAIL_REQUESTS more (20 s)
    assert figures["drain_s"] == pytest.approx(6.5) and calls[-1][2] == pytest.approx(6.5 + TAIL_REQUESTS / 10)


def test_a_given_capacity_skips_the_probes() -> None:
    names: list[str] = []

    def phase(name: str, *args, **kwargs) -> Step:
        names.append(name)
        raise StopIteration  # enough: the first phase run is what matters

    with pytest.raises(StopIteration):
        run_overload(phase, OverloadPlan(capacity_rps=100.0), 40.0, 3.0, {}, lambda: 0)
    assert names == ["baseline"]
