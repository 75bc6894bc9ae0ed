"""A curve's rates under an SLO, read the sweep's way: the highest step meeting the bound, the bracket around it,
whether it is only a lower bound, and how a table writes it; where none met the bound, why (never, flat tail,
below the lowest rate), with what the load generator's own floor accounts for."""

from __future__ import annotations

import math

from latlab.loadtest.floor import only_the_floor_breaks
from latlab.loadtest.results import Curve, Step
from latlab.loadtest.search import FLAT, NEVER, slo_met


def max_rate_under(steps: list[Step], slo_s: float) -> Step | None:
    """The step with the highest achieved throughput that met the SLO (search.slo_met: the sweep's own rule)."""
    return max((s for s in steps if slo_met(s, slo_s)), key=lambda s: s.achieved_rps, default=None)


def bracket_of(curve: Curve, slo_s: float) -> dict | None:
    """The sweep's bracket of this SLO for the deployment (`latlab loadtest --slos`); None in older results."""
    return next((b for b in curve.slo_brackets or [] if math.isclose(b["slo_p99_s"], slo_s)), None)


def unmet_text(curves: list[Curve], slo_s: float) -> str:
    """What a table says for deployments none of whose steps met the SLO: "never" only when one request at a
    time broke it for every one of them (with the fastest such p99), else where the search stopped (a flat tail:
    the lowest such bracket, with its own curve's lowest step); either with what the generator's own floor
    accounts for, where only the floor breaks the bound (floor_clause)."""
    singles = [c.single_request for c in curves]
    brackets = [bracket_of(c, slo_s) for c in curves]
    if curves and all(b and b["meaning"] == NEVER for b in brackets) and all(singles):
        fastest = min((s["p99_s"] for s in singles if s.get("p99_s") is not None), default=None)
        said = "never" + (f" (p99 {fastest * 1e3:.0f} ms one request at a time)" if fastest is not None else "")
        return said + floor_clause(curves, slo_s, fastest, None)
    flat = [(c, b) for c, b in zip(curves, brackets) if b and b["meaning"].startswith(FLAT)]
    if flat:
        curve, bracket = min(flat, key=lambda pair: pair[1]["broke_rps"] or 0)
        lowest = min((s for s in curve.steps if s.p99_s is not None), key=_target, default=None)
        return bracket["meaning"] + (floor_clause([curve], slo_s, lowest.p99_s, _target(lowest)) if lowest else "")
    below = [b["broke_rps"] for b in brackets if b and b["broke_rps"] and b["meaning"] != NEVER]
    if below:
        return f"< {min(below):.3g} (met only below the lowest rate measured)"
    lowest = min((_target(s) for c in curves for s in c.steps), default=None)
    return f"not met at ≥ {lowest:g}" if lowest else "not measured"


def floor_clause(curves: list[Curve], slo_s: float, p99_s: float | None, rate: float | None) -> str:
    """'; within the generator's floor: ...' where the p99 that broke the bound, less what the generator itself
    adds at that rate (loadtest/floor.py), would meet it: the instrument, not the deployment, may break it."""
    floors = [c.generator_floor for c in curves if c.generator_floor]
    row = next((r for f in floors if (r := only_the_floor_breaks(p99_s, slo_s, f, rate))), None)
    if row is None:
        return ""
    return (
        f"; within the generator's floor: it adds p99 {row['p99_s'] * 1e3:.2f} ms on its own here "
        f"(GET of a trivial route at {row['target_rps']:.0f} req/s), so the deployment itself may meet the bound"
    )


def unmet_clause(why: str) -> str:
    """An unmet_text as a sentence's clause: 'never meets it (...)' or 'does not meet it at the rates measured'."""
    if why.startswith("never"):
        return f"never meets it{why.removeprefix('never')}"
    return f"does not meet it at the rates measured ({why})"


def bracket_text(curve: Curve, step: Step, slo_s: float | None) -> str:
    """A met step's rate, with the rate that broke the SLO beside it when the bracket is wider than the
    sweep's resolution: '104–500'."""
    rate = f"{step.achieved_rps:.0f}"
    bracket = bracket_of(curve, slo_s) if slo_s else None
    if bracket and bracket["broke_rps"] and bracket["width"] is not None and bracket["width"] > bracket["resolution"]:
        rate = f"{rate}–{bracket['broke_rps']:.0f}"
    if bracket and bracket.get("broke_verdict") == "undecided" and bracket.get("needed"):
        rate += f" ({undecided_text(bracket['broke_rps'], bracket['needed'])})"
    return rate


DECIDABLE_REQUESTS = 100_000
"""A step that would need more requests than this to decide a bound is said to sit too close to it: at the
rates a lab measures, such a step would take minutes to hours."""


def undecided_text(rate: float, needed: int) -> str:
    """Why a step neither met nor broke a bound, in words a reader can act on."""
    if needed > DECIDABLE_REQUESTS:
        return f"undecided at {rate:.0f} req/s: its p99 is too close to the bound to decide"
    return f"undecided at {rate:.0f} req/s: a step of {needed:,} requests would decide"


def _target(step: Step) -> float:
    """The load a step was asked for (a rate, or users in closed loop), else what was offered."""
    return float(step.target_rps or step.target or step.offered_rps or 0.0)


def is_lower_bound(curve: Curve, step: Step) -> bool:
    """Whether a step's rate is only a lower bound of the deployment's: the sweep ended (its cap, or its rates
    ran out) before the deployment saturated, and this is its highest load. A curve that does not say
    (results from before the saturation search) counts as saturated. Faster steps where the load generator was
    the limit (Step.generator_bound) do not count against it: they measured the instrument."""
    return curve.saturated is False and all(s.generator_bound for s in curve.steps if _target(s) > _target(step))


def rate_text(curve: Curve, step: Step | None, slo_s: float | None = None) -> str:
    """A step's achieved rate as a table shows it: '≥ N (not saturated)' when it is only a lower bound, the
    bracket when it is wider than the resolution; with no step, why (see unmet_text)."""
    if step is None:
        return unmet_text([curve], slo_s) if slo_s else "–"
    if is_lower_bound(curve, step):
        return f"≥ {step.achieved_rps:.0f} (not saturated)"
    return bracket_text(curve, step, slo_s)
