"""Why a sweep stopped raising the rate (loadtest/stepping.py), and what the report then makes of its
highest rate (report/rates.py, is_lower_bound): a deployment's limit, or the load generator's."""

from __future__ import annotations

from latlab.loadtest.plan import SweepPlan, Workload
from latlab.loadtest.results import Curve, Step
from latlab.loadtest.schedule import Schedule
from latlab.loadtest.stepping import sweep_rates
from latlab.report.rates import is_lower_bound
from tests.loadtest.steps import simulated

PLAN = SweepPlan(Workload("http://127.0.0.1:9", ("d",)), Schedule(loads=(100.0, 200.0), max_rate=800.0))


def deployment(capacity: float, generator_limit: float) -> tuple[list[Step], callable]:
    """A deployment serving up to `capacity` req/s behind a generator that sends at most `generator_limit`: a step
    past the generator's limit falls short with the generator's CPU full."""
    steps: list[Step] = []

    def measure(rate: float) -> Step:
        sent = min(rate, generator_limit)
        achieved = min(sent, capacity)
        full = rate > generator_limit
        steps.append(
            simulated(
                target=rate,
                target_rps=rate,
                offered_rps=rate,
                achieved_rps=achieved,
                p99_s=0.005,
                generator_cpu_percent=99.0 if full else 20.0,
                generator_bound=full,
            )
        )
        return steps[-1]

    return steps, measure


def test_a_deployment_that_saturates_first_is_saturated() -> None:
    steps, measure = deployment(capacity=300, generator_limit=10_000)
    why, saturated = sweep_rates(PLAN, measure)
    assert saturated and why.startswith("stopped at ") and "saturated: achieved" in why
    curve = Curve("d", steps=steps, saturated=saturated)
    best = max((s for s in steps if s.achieved_rps >= 0.9 * s.offered_rps), key=lambda s: s.achieved_rps)
    assert not is_lower_bound(curve, best)


def test_a_generator_at_its_limit_leaves_the_deployment_unsaturated_and_its_rate_a_lower_bound() -> None:
    steps, measure = deployment(capacity=10_000, generator_limit=300)
    why, saturated = sweep_rates(PLAN, measure)
    assert not saturated and why.startswith("the load generator's limit at ") and why.endswith("not saturated")
    assert not why.startswith("stopped at")  # the sweep reads "stopped at" as a server gone: no SLO brackets
    curve = Curve("d", steps=steps, saturated=saturated)
    kept_up = [s for s in steps if not s.generator_bound]
    best = max(kept_up, key=lambda s: s.achieved_rps)
    assert best.target_rps <= 300 < max(s.target_rps for s in steps)  # faster steps ran, each generator-bound
    assert is_lower_bound(curve, best)
    # A faster step that the deployment itself failed (not the generator) settles it: no longer a lower bound.
    failed = simulated(target=450.0, target_rps=450.0, offered_rps=450.0, achieved_rps=200.0, p99_s=0.005)
    assert not is_lower_bound(Curve("d", steps=[*steps, failed], saturated=False), best)
