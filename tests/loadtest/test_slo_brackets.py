"""The SLO brackets of a sweep (search.bracket_slos) on simulated deployments whose latency curve is known:
each SLO's highest rate found within the resolution, below the first listed rate too, "never" only with the
one-at-a-time evidence, and the step budget held."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from latlab.loadtest.results import Curve, Step
from latlab.loadtest.search import NEVER, bracket_slos, open_slos, slo_bracket, slo_met
from tests.loadtest.steps import simulated


class SimulatedServer:
    """A deployment of service time `service_s` and `capacity` req/s whose p99 grows as 1 / (1 - load):
    p99(rate) = service_s * (1 + 10 * u / (1 - u)), u = rate / capacity. Its highest rate under a bound is
    known in closed form (`true_rate`). Records every rate it was asked for."""

    def __init__(self, service_s: float, capacity: float, samples: int = 500) -> None:
        self.service_s, self.capacity, self.samples = service_s, capacity, samples
        self.asked: list[float] = []
        self.single_calls = 0

    def p99(self, rate: float) -> float:
        u = rate / self.capacity
        return math.inf if u >= 1 else self.service_s * (1 + 10 * u / (1 - u))

    def true_rate(self, slo_s: float) -> float:
        """The rate at which p99 equals the bound (0 when even an idle deployment breaks it)."""
        k = slo_s / self.service_s - 1
        return max(0.0, self.capacity * k / (10 + k))

    def step(self, rate: float) -> Step:
        self.asked.append(rate)
        p99 = self.p99(rate)
        achieved = min(rate, self.capacity)
        return simulated(
            target=rate,
            target_rps=rate,
            offered_rps=rate,
            achieved_rps=achieved,
            p99_s=p99 if p99 < math.inf else 60.0,
            errors=0,
            dropped=0,
            sent=self.samples,
            too_few_samples=False,
        )

    def single(self) -> dict:
        self.single_calls += 1
        return {
            "requests": 300,
            "errors": 0,
            "p50_s": self.service_s,
            "p99_s": self.service_s,
            "max_s": self.service_s,
            "too_few_samples": False,
        }


def run(
    curve: SimulatedServer,
    listed: list[float],
    slos: tuple[float, ...],
    resolution: float = 0.1,
    floor: float = 1.0,
    budget: int = 40,
    time_left=lambda: True,
) -> tuple[list[Step], dict]:
    steps = [curve.step(rate) for rate in listed]

    def measure(rate: float) -> Step:
        steps.append(curve.step(rate))
        return steps[-1]

    return steps, bracket_slos(slos, steps, measure, curve.single, resolution, floor, budget, time_left)


SLOS = (0.010, 0.025, 0.050, 0.100)


@pytest.mark.parametrize("resolution", [0.1, 0.05])
def test_every_slo_is_found_within_the_resolution(resolution):
    curve = SimulatedServer(service_s=0.002, capacity=3000)
    steps, found = run(curve, [100, 500, 1000, 2000, 3000], SLOS, resolution)
    for record in found["slo_brackets"]:
        truth = curve.true_rate(record["slo_p99_s"])
        assert record["met_rps"] <= truth < record["broke_rps"]
        assert record["width"] <= resolution and record["meaning"] == "within the resolution"
        assert slo_met(slo_bracket(steps, record["slo_p99_s"]).met, record["slo_p99_s"])
    assert curve.single_calls == 0  # every SLO was met at a measured rate: no need for the evidence


def test_below_the_first_listed_rate_when_that_one_breaks_it():
    """cnn's case: the lowest listed step already breaks the bound, which is met at lower rates."""
    curve = SimulatedServer(service_s=0.040, capacity=20)
    _, found = run(curve, [8, 15, 20], (0.100,), floor=1.0)
    record = found["slo_brackets"][0]
    truth = curve.true_rate(0.100)
    assert truth < 8 and record["met_rps"] <= truth < record["broke_rps"] <= 8
    assert record["width"] <= 0.1
    assert curve.single_calls == 1 and "single_request" in found


def test_never_only_with_the_single_request_evidence():
    curve = SimulatedServer(service_s=0.040, capacity=20)
    steps, found = run(curve, [8, 15], (0.025, 0.100))
    never, met = found["slo_brackets"]
    assert never["meaning"] == NEVER and never["met_rps"] is None
    assert found["single_request"]["p99_s"] > 0.025
    assert met["met_rps"] is not None  # the looser bound is still searched below the first rate
    assert not any(s.target < 8 and slo_met(s, 0.025) for s in steps)


def test_below_the_floor_is_said_not_called_never():
    curve = SimulatedServer(service_s=0.040, capacity=20)
    _, found = run(curve, [8], (0.0402,), floor=4.0)  # met only below ~0.1 req/s
    record = found["slo_brackets"][0]
    assert record["met_rps"] is None and record["meaning"].startswith("below the lowest rate measured")
    assert record["meaning"] != NEVER


def test_the_step_budget_is_held_and_said():
    curve = SimulatedServer(service_s=0.002, capacity=3000)
    _, found = run(curve, [100, 3000], SLOS, budget=3)
    assert found["slo_steps"] == 3 and len(curve.asked) == 2 + 3
    assert any("wider than the resolution" in r["meaning"] for r in found["slo_brackets"])


def test_a_short_budget_narrows_every_slo_not_only_the_tightest():
    """Each step goes to the widest bracket left. Four steps between 100 and 3000 req/s, shared by four SLOs,
    leave every bracket at most an eighth of the listed one in log terms (3000/100 ** 1/8 = 1.53); spent on the
    tightest SLO first they left p99 <= 25, 50 and 100 ms at a quarter (2.34x) while p99 <= 10 ms reached 1.24x."""
    curve = SimulatedServer(service_s=0.002, capacity=3000)
    _, found = run(curve, [100, 3000], SLOS, budget=4)
    eighth = (3000 / 100) ** (1 / 8)
    assert all(1 + record["width"] <= eighth * (1 + 1e-9) for record in found["slo_brackets"])
    for record in found["slo_brackets"]:
        assert record["met_rps"] <= curve.true_rate(record["slo_p99_s"]) < record["broke_rps"]


def test_the_time_budget_stops_the_search_and_is_said():
    """No step starts once the time budget is spent (the sweep's clock; here a count of the steps it allowed)."""
    curve = SimulatedServer(service_s=0.002, capacity=3000)
    allowed = iter([True, True, False])
    _, found = run(curve, [100, 3000], SLOS, budget=40, time_left=lambda: next(allowed))
    assert found["slo_steps"] == 2 and len(curve.asked) == 2 + 2 and found["slo_budget_spent"]
    assert any("wider than the resolution" in r["meaning"] for r in found["slo_brackets"])
    _, unbounded = run(SimulatedServer(service_s=0.002, capacity=3000), [100, 3000], SLOS, budget=40)
    assert not unbounded["slo_budget_spent"]  # it stopped because every bracket was within the resolution


def test_a_step_serves_every_slo():
    """Brackets found for one SLO are reused by the others: fewer steps than searching each alone."""
    together = SimulatedServer(service_s=0.002, capacity=3000)
    run(together, [100, 3000], SLOS)
    alone = 0
    for slo in SLOS:
        curve = SimulatedServer(service_s=0.002, capacity=3000)
        run(curve, [100, 3000], (slo,))
        alone += len(curve.asked) - 2
    assert len(together.asked) - 2 < alone


def test_met_at_every_rate_has_no_upper_end():
    curve = SimulatedServer(service_s=0.001, capacity=1e6)
    _, found = run(curve, [100, 200], (0.100,))
    record = found["slo_brackets"][0]
    assert record["broke_rps"] is None and record["meaning"] == "met at every rate measured"


def test_a_saturated_step_breaks_every_slo_even_with_a_short_p99():
    step = simulated(target_rps=100, offered_rps=100, achieved_rps=70, p99_s=0.001, errors=0, dropped=0)
    assert not slo_met(step, 0.1) and slo_met(replace(step, achieved_rps=95), 0.1)
    assert not slo_met(replace(step, achieved_rps=95, too_few_samples=True), 0.1)


def test_a_step_with_decisions_is_judged_by_them_not_by_its_sample_p99():
    """Since percentile confidence, a step meets an SLO only when its count over the bound says so."""
    from latlab.loadtest.search import bracket_record, slo_verdict

    def step(rate: float, verdict: str, needed: int = 0) -> Step:
        decision = {"slo_p99_s": 0.05, "verdict": verdict, "over": 2, "needed": needed}
        return simulated(
            target_rps=rate,
            offered_rps=rate,
            achieved_rps=rate,
            p99_s=0.049,
            errors=0,
            dropped=0,
            confidence={"level": 0.95, "samples": 300, "slos": [decision]},
        )

    assert slo_verdict(step(100, "undecided", 473), 0.05) == "undecided"  # sample p99 within, yet not "met"
    assert slo_verdict(step(100, "met"), 0.05) == "met"
    assert slo_verdict(replace(step(100, "met"), errors=1), 0.05) == "broken"
    assert slo_verdict(replace(step(100, "met"), achieved_rps=50), 0.05) == "broken"  # saturated
    steps = [step(100, "met"), step(120, "undecided", 900), step(400, "broken")]
    bracket = slo_bracket(steps, 0.05)
    assert bracket.low == 100 and bracket.high == 120  # an undecided rate is not claimed
    record = bracket_record(bracket, None, 0.3, 5.0)
    assert record["broke_verdict"] == "undecided" and record["needed"] == 900
    assert slo_verdict(simulated(p99_s=0.04, errors=0), 0.05) == "met"  # older results: the sample p99
    assert slo_verdict(simulated(p99_s=0.04, errors=0, too_few_samples=True), 0.05) == "undecided"


def test_tables_show_a_wide_bracket_and_an_undecided_upper_end():
    from latlab.report.rates import rate_text

    step = simulated(target_rps=100, offered_rps=100, achieved_rps=101, p99_s=0.005, errors=0)
    bracket = {
        "slo_p99_s": 0.01,
        "met_rps": 100,
        "broke_rps": 500,
        "width": 4.0,
        "resolution": 0.1,
        "meaning": "wider than the resolution (the step or time budget ran out)",
        "broke_verdict": "broken",
    }
    curve = Curve("m", steps=[step], slo_brackets=[bracket], saturated=True)
    assert rate_text(curve, step, 0.01) == "101–500"
    narrow = {**bracket, "broke_rps": 108, "width": 0.08, "broke_verdict": "undecided", "needed": 900}
    assert (
        rate_text(replace(curve, slo_brackets=[narrow]), step, 0.01)
        == "101 (undecided at 108 req/s: a step of 900 requests would decide)"
    )
    hopeless = {**narrow, "needed": 1548690}
    assert (
        rate_text(replace(curve, slo_brackets=[hopeless]), step, 0.01)
        == "101 (undecided at 108 req/s: its p99 is too close to the bound to decide)"
    )
    assert rate_text(replace(curve, slo_brackets=[{**narrow, "broke_verdict": "broken"}]), step, 0.01) == "101"


def test_the_search_below_stops_where_the_p99_stops_falling():
    """A machine whose tail, not its load, sets the p99 at low rates: halving the rate does not help, so the
    search stops after the step that shows it and says so (never 'never': one request at a time meets it)."""

    def measure(rate: float) -> Step:
        asked.append(rate)
        steps.append(
            simulated(
                target=rate,
                target_rps=rate,
                offered_rps=rate,
                achieved_rps=rate,
                p99_s=0.015 if rate < 200 else 0.030,
                errors=0,
                dropped=0,
            )
        )
        return steps[-1]

    asked: list[float] = []
    steps: list[Step] = []
    for rate in (100, 500):
        measure(rate)
    single = {"requests": 300, "errors": 0, "p50_s": 0.002, "p99_s": 0.004, "too_few_samples": False}
    found = bracket_slos((0.010,), steps, measure, lambda: single, 0.1, 5.0, 12)
    (record,) = found["slo_brackets"]
    assert asked == [100, 500, 50] and record["meaning"].startswith("not met down to 50 req/s")
    from latlab.report.rates import rate_text

    assert rate_text(Curve("m", steps=steps, slo_brackets=[record]), None, 0.010).startswith("not met down to 50")


def test_open_slos_leave_out_what_other_steps_settle_at_a_rate():
    """A step at a rate need not decide a bound met at a higher rate or broken at a lower one (a p99 rises with
    the load); it must decide the ones whose bracket it lies in."""
    curve = SimulatedServer(service_s=0.002, capacity=1000)
    tight, middle, loose = 0.004, curve.p99(500) * 1.01, 1.0
    steps = [curve.step(rate) for rate in (100, 500, 900)]
    assert slo_met(steps[1], middle) and not slo_met(steps[2], middle) and not slo_met(steps[0], tight)
    assert open_slos((tight, middle, loose), steps, 50) == (tight,)  # middle and loose met above, tight open
    assert open_slos((tight, middle, loose), steps, 700) == (middle,)  # tight broken below, loose met above
    assert open_slos((tight, middle, loose), steps, 2000) == (loose,)  # met only lower; middle broken at 900
    assert open_slos((tight, middle, loose), [], 50) == (tight, middle, loose)
