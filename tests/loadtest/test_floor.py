"""The generator's floor (loadtest/floor.py, calibrate.py): measured through real Locust users against a real
server before a sweep, kept in the results, and read by the report where a step or a bound sits near it."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys


from latlab.loadtest.floor import HIGH_PER_PROCESS, NEAR_FACTOR, calibration_rates, floor_at, floor_line, near_floor
from latlab.loadtest.floor import only_the_floor_breaks
from latlab.loadtest.recorder import MIN_SAMPLES_P99
from latlab.loadtest.results import Curve, read_results
from latlab.loadtest.search import FLAT
from latlab.report.sections import steps_table
from latlab.report.rates import unmet_text

from .steps import simulated
from .stub_server import StubModel, stub_server


def floor_of(*rows: tuple[float, float, float]) -> dict:
    """A floor record of (rate, p50 s, p99 s) rows, as calibrate writes it."""
    return {
        "route": "/v2/health/live",
        "seconds": 2.0,
        "processes": 1,
        "rates": [
            {
                "target_rps": rate,
                "achieved_rps": rate,
                "requests": int(rate * 2),
                "errors": 0,
                "p50_s": p50,
                "p99_s": p99,
                "mean_s": p50,
                "send_lateness_p50_s": p50 / 10,
                "send_lateness_p99_s": p99 / 10,
                "generator_cpu_percent": 10.0,
                "cpu_per_request_s": 0.0003,
                "too_few_samples": False,
            }
            for rate, p50, p99 in rows
        ],
    }


def test_the_calibration_measures_the_sweeps_lowest_and_highest_rates_within_the_generators_reach() -> None:
    low_enough = 1.5 * MIN_SAMPLES_P99 / 2.0
    assert calibration_rates([100, 400], 2000, 1, 2.0) == [100, HIGH_PER_PROCESS]
    assert calibration_rates([100, 400], 2000, 3, 2.0) == [100, 2000]
    assert calibration_rates([5, 400], 0, 1, 2.0) == [low_enough, 400]  # enough requests for a p99
    assert calibration_rates([100, 150], 0, 1, 2.0) == [100]  # one rate when the two are close


def test_a_step_is_read_against_the_floor_at_the_nearest_calibrated_rate() -> None:
    floor = floor_of((50, 0.0004, 0.0008), (1000, 0.0006, 0.003))
    assert floor_at(floor, 60)["target_rps"] == 50
    assert floor_at(floor, 600)["target_rps"] == 1000
    assert near_floor(simulated(target_rps=50, p99_s=NEAR_FACTOR * 0.0008), floor)
    assert not near_floor(simulated(target_rps=50, p99_s=NEAR_FACTOR * 0.0008 * 1.01), floor)
    assert near_floor(simulated(target_rps=900, p99_s=0.005), floor)  # 1000 req/s's floor: p99 3 ms
    assert not near_floor(simulated(target_rps=50, p99_s=0.001), None)
    failed = floor_of((50, 0.0004, 0.0008))
    failed["rates"][0]["errors"] = 100
    assert floor_at(failed, 50) is None and "failed" in floor_line(failed)


def test_only_the_floor_breaks_a_bound_the_p99_less_the_floor_would_meet() -> None:
    floor = floor_of((50, 0.0004, 0.002))
    assert only_the_floor_breaks(0.011, 0.010, floor, 50) is not None  # 11 ms - 2 ms floor = 9 ms <= 10 ms
    assert only_the_floor_breaks(0.013, 0.010, floor, 50) is None  # 13 - 2 = 11 ms: the deployment breaks it
    assert only_the_floor_breaks(0.009, 0.010, floor, 50) is None  # met: nothing to excuse
    assert only_the_floor_breaks(0.011, 0.010, None, 50) is None


def flat_curve(p99_s: float, floor: dict | None) -> Curve:
    """A deployment whose p99 stopped falling above a 10 ms bound down to 50 req/s."""
    steps = [simulated(target_rps=rate, p99_s=p99_s, p50_s=p99_s / 2) for rate in (50, 100, 200)]
    bracket = {
        "slo_p99_s": 0.010,
        "met_rps": None,
        "broke_rps": 50,
        "width": None,
        "resolution": 0.1,
        "floor_rps": 5,
        "meaning": f"{FLAT} 50 req/s: the p99 stopped falling with the load ({p99_s * 1e3:.1f} ms there)",
        "broke_verdict": "broken",
        "needed": None,
    }
    curve = Curve(name="ffn", model="ffn", provider="cpu", steps=steps, slo_brackets=[bracket])
    curve.generator_floor = floor
    return curve


def test_a_bound_only_the_floor_breaks_is_not_reported_as_not_met_without_saying_so() -> None:
    floor = floor_of((50, 0.0009, 0.002))
    said = unmet_text([flat_curve(0.011, floor)], 0.010)
    assert said.startswith(FLAT) and "within the generator's floor" in said and "p99 2.00 ms" in said
    assert "generator's floor" not in unmet_text([flat_curve(0.014, floor)], 0.010)
    assert "generator's floor" not in unmet_text([flat_curve(0.011, None)], 0.010)


def test_a_flat_tail_s_floor_clause_reads_the_curve_whose_bracket_it_says() -> None:
    floor = floor_of((10, 0.0009, 0.002), (50, 0.0009, 0.002))
    flat = flat_curve(0.011, floor)  # only the floor breaks its 10 ms bound at its lowest rate, 50 req/s
    # Another deployment, with no bracket, whose lowest rate (10 req/s) is below the flat curve's and far over it.
    slow = Curve(name="slow", model="ffn", provider="cpu", steps=[simulated(target_rps=10, p99_s=0.030)])
    slow.generator_floor = floor
    said = unmet_text([slow, flat], 0.010)
    assert said.startswith(f"{FLAT} 50 req/s") and "within the generator's floor" in said


def test_the_step_details_mark_steps_near_the_floor_and_state_it() -> None:
    floor = floor_of((50, 0.0009, 0.002))
    curve = flat_curve(0.003, floor)
    curve.steps[1] = simulated(target_rps=100, p99_s=0.009, p50_s=0.004)
    html = steps_table(curve)
    assert html.count("near the generator&#x27;s floor") == 2  # the 3 ms steps, not the 9 ms one
    assert "this generator adds p50 0.90 ms, p99 2.00 ms at 50 req/s" in html


def test_the_floor_accounts_for_what_the_generator_adds_to_a_known_service_time(tmp_path) -> None:
    """A stub serving every request in `service` seconds: the generator's reading of it lies between the truth and
    the truth plus the floor it measured before the sweep (twice it, for the noise of two samples). The truth is
    the stub's own time for each request as it passed (from its start to its answer encoded), not the sleep asked
    for: on a busy machine a sleep overshoots, and that is the server's time, which no floor of the generator's
    accounts for."""
    model = StubModel(slow_every=1, slow_for=0.02)
    with stub_server(model) as url:
        out = tmp_path / "run"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "latlab.cli",
                "loadtest",
                "--host",
                url,
                "--deployment",
                "m",
                "--rates",
                "30",
                "--constant",
                "--step-seconds",
                "6",
                "--warmup-seconds",
                "1",
                "--calibrate-seconds",
                "2",
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=170,
        )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "generator floor (GET /v2/health/live): this generator adds p50" in done.stdout
    (run,) = read_results(out)
    (row,) = run.generator_floor["rates"]  # the sweep's one rate, raised to hold enough requests
    assert row["errors"] == 0 and row["requests"] >= MIN_SAMPLES_P99 and row["p50_s"] > 0
    assert json.loads((out / "results.json").read_text())["generator_floor"] == run.generator_floor
    (step,) = run.deployments[0].steps
    median, mean = statistics.median(model.service_s), statistics.fmean(model.service_s)
    assert median <= step.p50_s <= median + 2 * row["p50_s"], (median, step.p50_s, row["p50_s"])
    assert mean <= step.mean_s <= mean + 2 * row["mean_s"], (mean, step.mean_s, row["mean_s"])
    assert run.deployments[0].generator_floor == run.generator_floor  # read into every deployment


def test_a_flat_tail_under_the_bound_says_why_it_is_not_met() -> None:
    from latlab.loadtest.search import Bracket, bracket_record

    low = simulated(target_rps=25, p99_s=0.0077, p50_s=0.003)
    said = bracket_record(Bracket(0.010, None, low), None, 0.1, 5, flat=low)["meaning"]
    assert said.startswith(FLAT) and "7.7 ms there; under the bound, on too few requests to show it met)" in said
    broke = simulated(target_rps=25, p99_s=0.015, p50_s=0.003)
    assert "under the bound" not in bracket_record(Bracket(0.010, None, broke), None, 0.1, 5, flat=broke)["meaning"]
