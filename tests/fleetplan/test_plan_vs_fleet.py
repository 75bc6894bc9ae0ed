"""The arithmetic of checking the plan against a real fleet (benchmarks/plan_vs_fleet.py): how a balancer's split
is predicted, and each prediction's error against a measured step or rate (stub predictors, no timing)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from latlab.loadtest.results import Step
from latlab.report.fleetplan.against_fleet import (
    Checked,
    error_text,
    fleet_p99_s,
    fleet_rate_under,
    median_error,
    p99_rows,
    rate_rows,
    split_arrivals,
)
from latlab.report.fleetplan.replica import ReplicaModel, simulate
from latlab.report.fleetplan.traffic import gamma_arrivals

ONE_AND_A_HALF_MS = ReplicaModel(0.0015, 0.0, max_batch=1)


def step(rate: float, p99_s: float) -> Step:
    """A measured open-loop step that kept up, with no errors (its SLO verdict: its p99 against the bound)."""
    return Step(rate, rate, rate, 0, p99_s / 2, p99_s, p99_s, p99_s, target_rps=rate)


def test_roundrobin_sends_the_kth_request_to_replica_k_mod_n_and_random_splits_them_all():
    arrivals = np.arange(10.0)
    assert [part.tolist() for part in split_arrivals(arrivals, 2, "roundrobin", np.random.default_rng(0))] == [
        [0, 2, 4, 6, 8],
        [1, 3, 5, 7, 9],
    ]
    parts = split_arrivals(arrivals, 3, "random", np.random.default_rng(0))
    assert sorted(np.concatenate(parts).tolist()) == arrivals.tolist()
    assert all(np.all(np.diff(p) > 0) for p in parts)  # each replica's arrivals stay in time order
    with pytest.raises(ValueError, match="roundrobin"):
        split_arrivals(arrivals, 2, "leastconn", np.random.default_rng(0))


def test_one_replica_is_the_replica_model_alone_plus_what_every_measurement_adds():
    arrivals = gamma_arrivals(400.0, 1.0, 50.0, np.random.default_rng(0))
    alone = simulate(arrivals, ONE_AND_A_HALF_MS).percentile_s(99)
    assert fleet_p99_s(ONE_AND_A_HALF_MS, 400.0, 1) == pytest.approx(alone, rel=0.05)
    assert fleet_p99_s(ONE_AND_A_HALF_MS, 400.0, 1, added_s=0.003) == pytest.approx(
        fleet_p99_s(ONE_AND_A_HALF_MS, 400.0, 1) + 0.003
    )


def test_roundrobin_over_two_replicas_serves_evenly_spaced_arrivals_one_replica_cannot():
    """Gaps of 1 ms against a 1.5 ms service: one replica falls behind without end; two in turn each see 2 ms
    gaps and answer every request in its service time; a random split sends some pairs to one replica, which
    queue."""
    regular = 1e-3  # a gamma CV this small is evenly spaced arrivals
    assert fleet_p99_s(ONE_AND_A_HALF_MS, 1000.0, 1, cv=regular) > 0.1
    assert fleet_p99_s(ONE_AND_A_HALF_MS, 1000.0, 2, "roundrobin", cv=regular) == pytest.approx(0.0015, rel=1e-3)
    assert fleet_p99_s(ONE_AND_A_HALF_MS, 1000.0, 2, "random", cv=regular) > 0.0015 * 2


def test_the_highest_rate_under_an_slo_is_where_the_predicted_p99_crosses_it():
    rate = fleet_rate_under(ONE_AND_A_HALF_MS, 0.010, 2, p99_at=lambda r: r * 1e-5)  # p99 = 10 ms at 1000 req/s
    assert rate == pytest.approx(1000, rel=1e-3)
    assert fleet_rate_under(ONE_AND_A_HALF_MS, 0.010, 2, p99_at=lambda r: 1.0) == 0.0


def test_each_measured_steps_p99_gets_each_predictors_error():
    steps = [step(100, 0.010), step(200, 0.020), Step(300, 0, 300, 5, None, None, None, None)]
    rows = p99_rows(steps, {"roundrobin": lambda r: r * 1.2e-4, "random": lambda r: r * 0.5e-4})
    assert [r["rate"] for r in rows] == [100, 200]  # a step with no answers has no p99 to compare
    assert rows[0]["roundrobin"].predicted == pytest.approx(0.012)
    assert rows[0]["roundrobin"].error == pytest.approx(0.2) and rows[1]["random"].error == pytest.approx(-0.5)
    assert error_text(rows[0]["roundrobin"]) == "+20%"
    assert median_error(rows, "random") == pytest.approx(0.5)
    rows[0]["random"] = Checked(0.010, math.inf)  # past the model's capacity at one rate
    assert median_error(rows, "random") == math.inf and median_error(rows + rows[1:] * 2, "random") == 0.5


def test_steps_the_generator_bounded_are_shown_in_rate_order_and_left_out_of_the_median_error():
    late = step(300, 0.900)
    late.generator_bound, late.send_lateness_p99_s = True, 0.850
    rows = p99_rows([late, step(200, 0.020), step(100, 0.010)], {"model": lambda r: r * 1.1e-4})  # by offered
    assert [(r["rate"], r["generator_bound"]) for r in rows] == [(100, False), (200, False), (300, True)]
    assert rows[2]["sent_late_p99_s"] == 0.850
    assert median_error(rows, "model") == pytest.approx(0.1)  # the 300 req/s step's -96% is not the model's
    assert math.isnan(median_error(rows[2:], "model"))


def test_each_slo_compares_the_measured_highest_rate_with_the_predicted_one():
    steps = [step(100, 0.008), step(200, 0.020), step(400, 0.060)]
    steps.append(Step(800, 300, 800, 0, 1.0, 2.0, 3.0, 4.0, target_rps=800))  # past capacity: achieved the least
    rows = rate_rows(steps, (0.010, 0.050, 0.005), {"roundrobin": lambda slo_s: slo_s * 2e4})
    ten, fifty, five = rows
    assert (ten["measured_rps"], ten["next_rps"]) == (100, 200)
    assert ten["roundrobin"].predicted == pytest.approx(200) and ten["roundrobin"].error == pytest.approx(1.0)
    assert (fifty["measured_rps"], fifty["next_rps"]) == (200, 400)  # by the rate offered, not achieved
    assert fifty["roundrobin"].error == pytest.approx(4.0)
    assert five["measured_rps"] == 0 and five["next_rps"] == 100  # none met it: nothing to compare with
    assert math.isinf(five["roundrobin"].error)
    assert error_text(five["roundrobin"]) == "n/a"
    assert Checked(0.0, 0.0).error == 0.0
