"""How an open-loop sweep walks the rates of one deployment: the listed ones, then raising past them up to the cap,
then narrowing the bracket after the first failure; and why it stopped: the deployment's limit, or the load
generator's (its rate is then only a lower bound)."""

from __future__ import annotations

from typing import Callable

import requests

from latlab.loadtest.plan import SweepPlan
from latlab.loadtest.results import Step
from latlab.loadtest.schedule import Schedule
from latlab.loadtest.search import SATURATED_BELOW

RAISE_BY = 1.5  # past the listed rates, each step offers this much more until saturation or the cap


class ServerGone(requests.ConnectionError):
    """The server stopped answering during a step and did not come back."""


def sweep_rates(plan: SweepPlan, measure: Callable[[float], Step]) -> tuple[str, bool]:
    """Step through the listed loads; with a cap, raise the rate until the deployment saturates, breaks the SLO
    or errs, then narrow the bracket to refine_within. (why it stopped, whether the deployment's limit did)."""
    schedule = plan.schedule
    listed, passed, failed, why, generator = list(schedule.loads[1:]), None, None, "", False
    load: float | None = schedule.loads[0]
    while load is not None:
        try:
            step = measure(load)
        except ServerGone as exc:
            return f"stopped at {load:g}: {exc}", False
        reason = _stop_reason(step, plan)
        if reason and reason.startswith("no Locust worker"):
            return f"stopped at {load:g}: {reason}", False
        if reason:
            failed, why, generator = load, reason, step.generator_bound
        else:
            passed = load
        load = _next_load(schedule, listed, passed, failed)
    if failed is not None and generator:  # the instrument's limit, not the deployment's: its rate is a lower bound
        return f"the load generator's limit at {failed:g} ({why} with the generator at its limit): not saturated", False
    if failed is not None:
        return f"stopped at {failed:g}: {why}", True
    capped = schedule.max_rate > max(schedule.loads)
    return (f"rate cap {schedule.max_rate:g} reached" if capped else "all loads done") + ": not saturated", False


def _next_load(schedule: Schedule, listed: list[float], passed: float | None, failed: float | None) -> float | None:
    """The next listed rate; past them, x RAISE_BY up to the cap; after a failure, the bracket's middle while it
    is wider than refine_within (only when raising was asked for: a plain sweep stops at its first failure)."""
    if failed is None:
        if listed:
            return listed.pop(0)
        if schedule.mode != "open" or passed is None or passed >= schedule.max_rate:
            return None
        return min(passed * RAISE_BY, schedule.max_rate)
    if schedule.mode != "open" or not schedule.max_rate or passed is None:
        return None
    if failed - passed <= schedule.refine_within * passed:
        return None
    return (passed + failed) / 2


def _stop_reason(step: Step, plan: SweepPlan) -> str | None:
    if step.workers_left == 0:
        return "no Locust worker left to send load"
    if step.server_interrupted or step.workers_lost:
        return None  # the errors and the shortfall are the restart's (or the lost worker's), not this load's
    schedule, slo = plan.schedule, plan.slo
    saturated = step.achieved_rps < SATURATED_BELOW * step.offered_rps
    if schedule.mode == "open" and schedule.stop_at_saturation and saturated:
        return f"saturated: achieved {step.achieved_rps:.0f} < 90% of offered {step.offered_rps:.0f} req/s"
    if step.sent and step.errors / step.sent > schedule.max_error_ratio:
        return f"{step.errors} errors of {step.sent} requests"
    if slo.p99_s and step.p99_s is not None and step.p99_s > slo.margin * slo.p99_s:
        return f"p99 {step.p99_s * 1e3:.1f} ms broke the SLO by more than {slo.margin:g}x"
    return None
