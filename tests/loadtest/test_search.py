"""The SLO search's bracketing and bisection, and its VALID/INVALID verdicts, on a simulated server."""

from __future__ import annotations

from dataclasses import replace

import pytest

from latlab.loadtest.results import Step
from latlab.loadtest.search import MIN_REQUESTS, meets, slo_search
from latlab.loadtest.search import is_stable, late_for
from tests.loadtest.steps import simulated as step


def simulated(capacity: float, slo_break: float, **extra):
    """A server meeting any SLO below `slo_break` req/s and saturating at `capacity`."""

    def measure(rate: float) -> Step:
        achieved = min(rate, capacity)
        p99 = 0.010 if rate <= slo_break else 0.500
        return step(
            **{
                "target": rate,
                "offered_rps": rate,
                "achieved_rps": achieved,
                "p99_s": p99,
                "errors": 0,
                "dropped": 0,
                "sent": 5000,
                "stable": True,
                "generator_bound": False,
                **extra,
            }
        )

    return measure


@pytest.mark.parametrize("start", [10.0, 100.0, 900.0, 5000.0])
def test_search_finds_the_break_point_within_the_resolution(start):
    result = slo_search(simulated(capacity=2000, slo_break=730), 0.050, start=start, resolution=0.02, max_probes=30)
    assert result.valid and not result.reasons
    assert 730 * 0.98 <= result.rate <= 730
    assert all(p.target <= 730 for p in result.probes if p.target == result.rate)


def test_a_small_growth_never_probes_far_past_the_edge_and_still_finds_it():
    """From a start just under the break point, doubling probes twice the edge; a growth of 1.25 probes at most a
    quarter past it (what a tuning probe starting at the best rate so far uses) and still ends within the
    resolution."""
    probed: list[float] = []
    measure = simulated(capacity=10_000, slo_break=4800)

    def counted(rate: float) -> Step:
        probed.append(rate)
        return measure(rate)

    doubled = slo_search(counted, 0.025, start=4600, resolution=0.05, max_probes=30)
    assert max(probed) == 9200 and 4800 * 0.95 <= doubled.rate <= 4800
    probed.clear()
    gentle = slo_search(counted, 0.025, start=4600, resolution=0.05, max_probes=30, growth=1.25)
    assert max(probed) <= 4800 * 1.25 and 4800 * 0.95 <= gentle.rate <= 4800 and gentle.valid


def test_saturation_counts_as_a_failure_even_when_latency_looks_fine():
    result = slo_search(simulated(capacity=400, slo_break=10_000), 0.050, start=100, resolution=0.05, max_probes=30)
    assert 400 * 0.9 <= result.rate <= 400 / 0.9


@pytest.mark.parametrize(
    "extra, reason",
    [
        ({"sent": MIN_REQUESTS - 1}, "too few requests"),
        ({"stable": False}, "unstable"),
        ({"generator_bound": True}, "generator saturated"),
        ({"generator_bound": True, "generator_cpu_percent": 20.0, "send_lateness_p99_s": 0.004}, "generator late"),
    ],
)
def test_untrustworthy_passing_step_makes_the_result_invalid(extra, reason):
    result = slo_search(simulated(capacity=2000, slo_break=500, **extra), 0.050, start=100, max_probes=30)
    assert not result.valid
    assert any(reason in r for r in result.reasons)
    assert "INVALID" in result.summary()


def test_no_passing_rate_and_no_upper_bound_are_reported():
    never = slo_search(simulated(capacity=2000, slo_break=0.5), 0.050, start=100, max_probes=12)
    assert never.rate is None and not never.valid and "no probed rate" in never.reasons[0]
    always = slo_search(simulated(capacity=1e9, slo_break=1e9), 0.050, start=100, max_probes=5)
    assert not always.valid and any("no upper bound" in r for r in always.reasons)


def test_meets_requires_bound_no_errors_no_drops_and_no_saturation():
    good = step(p99_s=0.01, errors=0, dropped=0, achieved_rps=95, offered_rps=100)
    assert meets(good, 0.05)
    assert not meets(replace(good, p99_s=0.06), 0.05)
    assert not meets(replace(good, errors=1), 0.05)
    assert not meets(replace(good, dropped=1), 0.05)
    assert not meets(replace(good, achieved_rps=80), 0.05)
    assert not meets(replace(good, p99_s=float("nan")), 0.05)


def test_stability_flags_windows_that_disagree_beyond_their_noise():
    """Windows agree when their answered counts lie within 3 Poisson standard deviations and their p99
    intervals overlap; a 10% wobble of a 100-request p99, perf_analyzer's rule, is noise and no longer fires."""
    window = {"ok": 300, "p99_low_s": 0.018, "p99_high_s": 0.024, "p99_s": 0.020}
    assert is_stable([window, {**window, "ok": 330}, {**window, "p99_s": 0.023, "p99_low_s": 0.020}])
    assert not is_stable([window, window, {**window, "p99_low_s": 0.030, "p99_high_s": 0.045}])  # latency moved
    assert not is_stable([window, window, {**window, "ok": 390}])  # 90 more than 300: > 3 sigma of ~26
    assert is_stable([window, window, {**window, "p99_low_s": 0.019, "p99_high_s": None}])  # no upper bound
    assert not is_stable([window, window])


def test_the_search_halves_no_further_than_its_floor():
    """A tuning probe ranks: below a share of the best so far a configuration is out of the running, and the
    low rates cost the slowest steps (`latlab loadtest --slo-floor`)."""
    probed: list[float] = []
    measure = simulated(capacity=2000, slo_break=3)

    def counted(rate: float) -> Step:
        probed.append(rate)
        return measure(rate)

    below = slo_search(counted, 0.050, start=400, min_rate=50)
    assert below.rate is None and min(probed) >= 50 and "no probed rate" in below.reasons[0]
    import subprocess
    import sys

    args = ["--host", "http://127.0.0.1:9", "--deployment", "d", "--slo", "p99=50ms", "--slo-floor", "0"]
    refused = subprocess.run(
        [sys.executable, "-m", "latlab.cli", "loadtest", *args], capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "latlab: error: --slo-floor must be a positive rate in req/s, got 0"
    ]
    args[-2:] = ["--slo-growth", "1"]
    refused = subprocess.run(
        [sys.executable, "-m", "latlab.cli", "loadtest", *args], capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "latlab: error: --slo-growth must be above 1 and at most 16, got 1"
    ]


def test_lateness_marks_a_step_only_where_it_could_decide_an_slo():
    ms = 1e-3
    assert late_for(2 * ms, 11 * ms, (10 * ms,))  # 2 ms late, 1 ms over a 10 ms bound: it could have decided it
    assert not late_for(2 * ms, 9 * ms, (10 * ms,))  # met in spite of the generator
    assert not late_for(2 * ms, 40 * ms, (10 * ms,))  # broken by far more than the lateness
    assert not late_for(0.5 * ms, 10.2 * ms, (10 * ms,))  # close, but the lateness is no material share
    assert late_for(6 * ms, 52 * ms, (10 * ms, 50 * ms)) and not late_for(None, 10 * ms, (10 * ms,))
