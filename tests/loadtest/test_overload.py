"""latlab.loadtest.overload: the figures of a burst and the time to recover, from step dicts alone."""

from __future__ import annotations

import pytest

from latlab.loadtest.overload import OverloadPlan, overload_figures, recovery_time, run_overload


def window(t_s: float, p99_s: float = 0.02, errors: int = 0, offered: float = 90.0, achieved: float = 90.0,
           incomplete: int = 0) -> dict:
    return {"t_s": t_s, "p99_s": p99_s, "errors": errors, "offered_rps": offered, "achieved_rps": achieved,
            "incomplete": incomplete}


def recovery(windows: list[dict]) -> dict:
    return {"timeline": windows, "window_seconds": 0.5, "duration_s": 1.5, "windows": len(windows),
            "start_time": 100.2}


def test_recovery_ends_with_the_first_normal_window() -> None:
    timeline = [window(0.0, p99_s=0.4), window(0.5, achieved=50.0), window(1.0, errors=1),
                window(1.5), window(2.0, p99_s=0.05), window(2.5)]
    seconds, after = recovery_time(recovery(timeline), baseline_p99_s=0.02)
    assert seconds == pytest.approx(2.0)  # the window starting at 1.5 s is the first normal one
    assert after == "2/3"                   # the 50 ms one (> 2x the 20 ms baseline) is not normal


def test_no_normal_window_is_no_recovery() -> None:
    assert recovery_time(recovery([window(0.0, incomplete=3), window(0.5, p99_s=None)]), 0.02) == (None, "0/2")


def test_figures_of_a_burst() -> None:
    by_status = {"200": {"count": 900, "p50_s": 0.2, "p99_s": 0.3, "max_s": 0.35},
                 "503": {"count": 1800, "p99_s": 0.004, "response_p99_s": 0.002, "response_max_s": 0.01,
                         "with_retry_after": 1799},
                 "504": {"count": 2}, "0": {"count": 1}, "500": {"count": 4}}
    burst = {"by_status": by_status, "offered_rps": 450.0, "achieved_rps": 148.0, "duration_s": 60.0,
             "incomplete": 5, "queue_depth_max": 32.0, "queue_capacity": 32.0, "end_time": 100.0,
             "generator_bound": False, "generator_cpu_percent": 30.0, "dropped": 0, "late": 12}
    figures = overload_figures(150.0, 3.0, {"batcher": {"timeout_ms": 1000}}, {"p99_s": 0.02}, burst,
                               recovery([window(0.0)]), hanging=0)
    assert figures["rejected"] == 1800 and figures["rejected_without_retry_after"] == 1
    assert figures["accepted"] == 900 and figures["timeouts"] == 2 and figures["unanswered"] == 1
    assert figures["other_statuses"] == {"500": 4} and figures["timeout_s"] == 1.0
    assert figures["recovery_s"] == pytest.approx(0.5) and figures["recovery_gap_s"] == pytest.approx(0.2)
    summary = figures["summary"]
    assert summary.startswith("overload 3x (450 req/s offered vs capacity 150, 60 s): served 148 req/s; ")
    assert "503 p99 4.0 ms (response 2.0 ms), Retry-After missing on 1" in summary
    assert "max queue depth 32 of bound 32" in summary and "recovery 0.5 s" in summary


def test_the_phases_measure_capacity_then_baseline_burst_and_recovery() -> None:
    calls: list[tuple] = []
    capacity = 120.0

    def phase(name: str, load: float, seconds: float, windows: int = 3, warmup: float = 0.0,
              drain: bool = True) -> dict:
        calls.append((name, load, seconds, windows, drain))
        served = min(load, capacity)
        by_status = {"200": {"count": int(served * seconds), "p50_s": 0.01, "p99_s": 0.02, "max_s": 0.03}}
        return {"achieved_rps": served, "offered_rps": load, "p99_s": 0.02, "by_status": by_status,
                "duration_s": seconds, "incomplete": 0, "queue_depth_max": 32.0, "queue_capacity": 32.0,
                "end_time": 10.0, "start_time": 10.1, "generator_bound": False, "generator_cpu_percent": 20.0,
                "dropped": 0, "late": 0, "window_seconds": seconds / windows, "windows": windows,
                "timeline": [window(i * seconds / windows) for i in range(windows)]}

    figures = run_overload(phase, OverloadPlan(factor=3.0, burst_seconds=60.0), start_rate=40.0,
                           probe_seconds=3.0, info={}, outstanding=lambda: 0)
    assert [(c[0], c[1]) for c in calls] == [("capacity", 40.0), ("capacity", 80.0), ("capacity", 160.0),
                                             ("baseline", 72.0), ("burst", 360.0), ("recovery", 72.0)]
    assert calls[4][2] == 60.0 and not calls[4][4] and not calls[5][4]  # no pause between burst and recovery
    assert calls[5][3] == 16  # 8 s of 0.5 s windows
    assert figures["capacity_rps"] == 120.0 and figures["recovery_s"] == pytest.approx(0.5)


def test_a_given_capacity_skips_the_probes() -> None:
    names: list[str] = []

    def phase(name: str, *args, **kwargs) -> dict:
        names.append(name)
        raise StopIteration  # enough: the first phase run is what matters

    with pytest.raises(StopIteration):
        run_overload(phase, OverloadPlan(capacity_rps=100.0), 40.0, 3.0, {}, lambda: 0)
    assert names == ["baseline"]
