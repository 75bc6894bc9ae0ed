"""The replica check's fit of how much service varies and its comparison with the bracket the sweep measured."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from latlab.report.fleetplan.replica import ReplicaModel, simulate
from latlab.report.fleetplan.spread import service_spread, spread_for
from latlab.report.fleetplan.validate import measured_bracket, own_fit, validate_curve
from tests.report.report_fixtures import CPU_NAME, curve, server, step

ENV = {"name": CPU_NAME, "cpu": "SYNTHETIC CPU", "cores": 2}


@pytest.mark.parametrize("excess_s", [0.0005, 0.002, 0.006])
def test_the_fitted_spread_gives_a_lone_request_the_probes_p99_minus_p50(excess_s):
    model = ReplicaModel(0.0008, 0.0, 0.0002, max_batch=1)
    lone = {"requests": 300, "p50_s": 0.0012, "p99_s": 0.0012 + excess_s}
    deployment = curve("b1", "cpu", 1, [step(100, 5.0)], ENV, single_request=lone)
    fitted = ReplicaModel(0.0008, 0.0, 0.0002, max_batch=1, spread=service_spread(deployment, model))
    apart = np.arange(1, 200_001) * 0.1  # each request alone: its latency is its service
    served = simulate(apart, fitted, seed=1)
    assert served.percentile_s(99) - served.percentile_s(50) == pytest.approx(excess_s, rel=0.05)
    assert float(np.mean(served.latency_s)) == pytest.approx(model.service_s(1), rel=0.02)


def test_without_a_probe_the_lowest_step_less_the_floors_spread_is_used():
    model = ReplicaModel(0.001, 0.0, max_batch=1)
    steps = [step(500, 30.0), step(50, 9.0)]  # the fixture's p50 is a third of the p99: 3 ms at 50 req/s
    floor = {"rates": [{"achieved_rps": 100.0, "p50_s": 0.001, "p99_s": 0.003}, {"achieved_rps": 900.0}]}
    deployment = curve("b1", "cpu", 1, steps, ENV, generator_floor=floor)
    assert service_spread(deployment, model) == pytest.approx(spread_for((0.009 - 0.003 - 0.002) / 0.001))
    deployment.generator_floor = {"rates": [{"achieved_rps": 100.0, "p50_s": 0.001, "p99_s": 0.020}]}
    assert service_spread(deployment, model) == 0.0  # the floor alone spreads more: nothing left to the server


def test_spread_for_inverts_a_mean_one_log_normals_p99_minus_p50():
    for sigma in (0.1, 0.5, 1.0, 1.8):
        relative = math.exp(-(sigma**2) / 2) * (math.exp(2.3263 * sigma) - 1)
        assert spread_for(relative) == pytest.approx(sigma, abs=1e-6)
    assert spread_for(0.0) == 0.0 and spread_for(1e6) == 2.0


def test_the_measured_bracket_is_the_highest_step_met_and_the_next_that_broke():
    steps = [step(100, 8.0), step(200, 20.0), step(300, 40.0), step(400, 90.0)]
    deployment = curve("b1", "cpu", 1, steps, ENV)
    assert measured_bracket(deployment, 0.025) == (200, 300)
    assert measured_bracket(deployment, 0.005) == (0.0, 100)
    assert measured_bracket(deployment, 0.100) == (400, math.inf)


def test_judged_against_the_bracket_a_prediction_inside_it_is_not_off_and_one_outside_is_off_by_the_nearer_end():
    """A replica of 2 ms a request: its p99 passes 25 ms a little below its capacity, 500 req/s; the sweep's steps
    bracket that rate (300 met, 480 broke) or lie far below it (50 met, 100 broke)."""
    model = ReplicaModel(0.002, 0.0, max_batch=1)
    near = curve("b1", "cpu", 1, [step(300, 4.0), step(480, 30.0)], ENV)
    far = curve("b1", "cpu", 1, [step(50, 4.0), step(100, 30.0)], ENV)
    (inside,) = validate_curve(near, model, "test", slos_s=(0.025,), bracketed=True)["slos"]
    (outside,) = validate_curve(far, model, "test", slos_s=(0.025,), bracketed=True)["slos"]
    assert 300 <= inside["predicted_rps"] <= 480 and inside["bracket_error"] == 0.0 and not inside["off"]
    assert inside["error"] == pytest.approx(inside["predicted_rps"] / 300 - 1)
    assert outside["bracket_error"] == pytest.approx(outside["predicted_rps"] / 100 - 1) and outside["off"]
    assert outside["error"] == pytest.approx(outside["predicted_rps"] / 50 - 1)


def test_by_default_the_rate_is_judged_against_the_highest_step_that_met():
    model = ReplicaModel(0.002, 0.0, max_batch=1)
    near = curve("b1", "cpu", 1, [step(300, 4.0), step(480, 30.0)], ENV)
    (slo,) = validate_curve(near, model, "test", slos_s=(0.025,))["slos"]
    assert slo["off"] == (abs(slo["predicted_rps"] / 300 - 1) > 0.2)


def test_a_stray_batch_of_two_in_a_batching_off_sweep_gives_no_slope() -> None:
    steps = [
        step(100, 5.0, avg_batch_size=1.0, server=server(1, 0.2, 0.3, 0.1, 0.1)),
        step(500, 9.0, avg_batch_size=1.003, server=server(1, 0.2, 0.6, 0.3, 0.3)),
        step(900, 20.0, avg_batch_size=1.0, server=server(1, 0.2, 0.4, 0.5, 0.5)),
    ]
    fit, _ = own_fit(curve("b1", "cpu", 1, steps, ENV))
    assert fit.b_s == 0.0 and fit.a_s == statistics.median(s.server["compute_s"] for s in steps)


def test_a_bound_broken_at_a_step_whose_lateness_alone_could_have_broken_it_is_marked():
    """The step at 480 req/s broke 25 ms with a p99 of 30 ms: sent 10 ms late (p99) the generator alone could have
    broken it, 2 ms late it could not; 10 ms late cannot have broken a bound of 5 ms that its p99 passes sixfold."""
    model = ReplicaModel(0.002, 0.0, max_batch=1)
    late = curve("b1", "cpu", 1, [step(300, 4.0), step(480, 30.0, send_lateness_p99_s=0.010)], ENV)
    on_time = curve("b1", "cpu", 1, [step(300, 4.0), step(480, 30.0, send_lateness_p99_s=0.002)], ENV)
    (marked,) = validate_curve(late, model, "test", slos_s=(0.025,))["slos"]
    (unmarked,) = validate_curve(on_time, model, "test", slos_s=(0.025,))["slos"]
    assert marked["broke_by_generator"] and not unmarked["broke_by_generator"]
    (tight,) = validate_curve(late, model, "test", slos_s=(0.005,))["slos"]
    assert tight["broke_rps"] == 480 and not tight["broke_by_generator"]
