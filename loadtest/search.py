"""SLO search: the highest offered rate whose p99 meets a bound (bracket, then bisect), MLPerf-style.

Pure logic over a `measure(rate) -> step` callable, so it is tested without a server."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

MIN_REQUESTS = 500          # fewer samples than this cannot support a p99
SATURATED_BELOW = 0.9       # achieved / offered: a sweep stops below this
SEARCH_SATURATED_BELOW = 0.95  # the search is stricter: a short window hides a slight overload's latency
STABLE_WITHIN = 0.10        # perf_analyzer's rule: the last 3 windows agree within 10%


@dataclass
class SearchResult:
    """The answer with its evidence: VALID only if the passing step is trustworthy."""

    slo_p99_s: float
    rate: float | None
    valid: bool
    reasons: list[str]
    resolution: float
    probes: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        verdict = "VALID" if self.valid else "INVALID"
        rate = f"{self.rate:.0f} req/s" if self.rate else "no rate"
        why = f" ({'; '.join(self.reasons)})" if self.reasons else ""
        return f"SLO p99 ≤ {self.slo_p99_s * 1e3:g} ms: {rate}, {verdict}{why}, {len(self.probes)} probes"


def meets(step: dict, slo_p99_s: float) -> bool:
    """The step met the SLO: p99 within bound, no errors, nothing dropped, not saturated."""
    p99 = step.get("p99_s")
    return (p99 is not None and p99 == p99 and p99 <= slo_p99_s and not step["errors"] and not step["dropped"]
            and step["achieved_rps"] >= SEARCH_SATURATED_BELOW * step["offered_rps"])


def slo_met(step: dict, slo_p99_s: float) -> bool:
    """The rule every table and the sweep's SLO bracket judge a step by: its p99 (of enough samples to mean
    something) within the bound, no errors, nothing dropped, and, in open loop, the offered rate kept up with."""
    p99 = step.get("p99_s")
    if p99 is None or p99 != p99 or p99 > slo_p99_s or step.get("errors") or step.get("dropped"):
        return False
    if step.get("too_few_samples"):
        return False  # a "p99" of a handful of requests decides nothing
    offered = step.get("offered_rps") if step.get("target_rps") else None
    return not offered or step.get("achieved_rps", 0.0) >= SATURATED_BELOW * offered


@dataclass
class Bracket:
    """Where one SLO's highest rate lies among a deployment's open-loop steps: `met` is the highest-rate step
    that met it, `broke` the lowest-rate step above that one that did not (None: none measured)."""

    slo_p99_s: float
    met: dict | None
    broke: dict | None

    @property
    def low(self) -> float | None:
        return _rate(self.met) if self.met else None

    @property
    def high(self) -> float | None:
        return _rate(self.broke) if self.broke else None

    def width(self) -> float | None:
        """(high - low) / low: how far the true rate may lie above the one measured; None without both ends."""
        if self.low is None or self.high is None:
            return None
        return (self.high - self.low) / self.low


def _rate(step: dict) -> float:
    """A step's offered rate (what a bracket's ends are stated in)."""
    return float(step.get("target_rps") or step.get("offered_rps") or 0.0)


def slo_bracket(steps: list[dict], slo_p99_s: float) -> Bracket:
    """The bracket of one SLO over the open-loop steps measured so far (a step serves every SLO)."""
    rated = sorted((s for s in steps if s.get("target_rps")), key=_rate)
    met = [s for s in rated if slo_met(s, slo_p99_s)]
    best = met[-1] if met else None
    above = [s for s in rated if not slo_met(s, slo_p99_s) and (best is None or _rate(s) > _rate(best))]
    return Bracket(slo_p99_s, best, above[0] if above else None)


def next_slo_rate(bracket: Bracket, resolution: float, floor_rps: float) -> float | None:
    """The next rate to measure for this SLO, or None when the bracket is within `resolution` (or cannot
    narrow: met at every rate measured, or broken down to `floor_rps`). Between the ends: their geometric
    middle (a 104-500 bracket takes as many steps as a 10-50 one); below every step: half the lowest."""
    if bracket.broke is None:
        return None
    if bracket.met is None:
        if bracket.high <= floor_rps * (1 + resolution):
            return None
        return max(bracket.high / 2, floor_rps)
    if bracket.width() <= resolution:
        return None
    return (bracket.low * bracket.high) ** 0.5


def bracket_slos(slos_s: tuple[float, ...], steps: list[dict], measure: Callable[[float], dict],
                 single: Callable[[], dict], resolution: float, floor_rps: float, budget: int) -> dict:
    """Narrow every SLO's bracket to `resolution` with extra steps (`measure(rate)` appends each to `steps`; one
    step serves every SLO), the tightest SLO first, at most `budget` steps in all. Below the lowest step only
    once one request at a time (`single()`, called at most once) has shown the SLO can be met at all.
    Returns `slo_brackets` (one record per SLO), `slo_steps` and, when it was measured, `single_request`."""
    found: dict = {}
    extra = 0
    for slo in sorted(slos_s):
        while extra < budget:
            bracket = slo_bracket(steps, slo)
            if bracket.met is None and bracket.broke is not None:
                if "single_request" not in found:
                    found["single_request"] = single()
                if breaks(found["single_request"], slo):
                    break
            rate = next_slo_rate(bracket, resolution, floor_rps)
            if rate is None:
                break
            measure(rate)
            extra += 1
    records = [bracket_record(slo_bracket(steps, slo), found.get("single_request"), resolution, floor_rps)
               for slo in sorted(slos_s)]
    return {**found, "slo_brackets": records, "slo_steps": extra}


def bracket_record(bracket: Bracket, single: dict | None, resolution: float, floor_rps: float) -> dict:
    """One SLO's bracket as results record it: its ends' rates, its width, and what it means in words."""
    if bracket.met is None and single is not None and breaks(single, bracket.slo_p99_s):
        meaning = NEVER
    elif bracket.met is None:
        meaning = f"below the lowest rate measured (the search stops at {floor_rps:.3g} req/s)" if bracket.broke \
            else "not measured"
    elif bracket.broke is None:
        meaning = "met at every rate measured"
    else:
        meaning = "within the resolution" if bracket.width() <= resolution else "wider than the resolution (the " \
            "step budget ran out)"
    return {"slo_p99_s": bracket.slo_p99_s, "met_rps": bracket.low, "broke_rps": bracket.high,
            "width": bracket.width(), "resolution": resolution, "floor_rps": floor_rps, "meaning": meaning}


NEVER = "never: breaks it one request at a time"


def breaks(single: dict, slo_p99_s: float) -> bool:
    """The single-request evidence (loadtest/single.py) shows the SLO cannot be met at any rate: its p99 (of
    enough requests) is over the bound, its median is (then so is every higher percentile, however few the
    requests), or its requests failed."""
    if single.get("errors") or not single.get("requests"):
        return bool(single.get("errors"))
    if single["p50_s"] > slo_p99_s:
        return True
    return not single.get("too_few_samples") and single["p99_s"] > slo_p99_s


def validity(step: dict) -> list[str]:
    """Why a passing step's figure should not be trusted (empty list: VALID)."""
    reasons = []
    if step["sent"] < MIN_REQUESTS:
        reasons.append(f"too few requests ({step['sent']} < {MIN_REQUESTS})")
    if not step.get("stable", True):
        reasons.append("unstable: the last windows disagreed by more than 10%")
    if step.get("generator_bound"):
        reasons.append("generator saturated (its CPU > 90%)")
    return reasons


def slo_search(measure: Callable[[float], dict], slo_p99_s: float, start: float, resolution: float = 0.05,
               max_probes: int = 16, min_rate: float = 1.0) -> SearchResult:
    """Double from `start` until the SLO breaks (or halve until it holds), then bisect the bracket
    until its width is within `resolution` of the passing rate."""
    probes: list[dict] = []

    def probe(rate: float) -> bool:
        step = measure(rate)
        probes.append(step)
        return meets(step, slo_p99_s)

    passing, failing = None, None
    rate = start
    while len(probes) < max_probes and rate >= min_rate:
        if probe(rate):
            passing = (rate, probes[-1])
            if failing is not None:
                break
            rate *= 2
        else:
            failing = rate
            if passing is not None:
                break
            rate /= 2
    while passing and failing and (failing - passing[0]) > resolution * passing[0] and len(probes) < max_probes:
        middle = (passing[0] + failing) / 2
        if probe(middle):
            passing = (middle, probes[-1])
        else:
            failing = middle
    if passing is None:
        return SearchResult(slo_p99_s, None, False, ["no probed rate met the SLO"], resolution, probes)
    reasons = validity(passing[1])
    if failing is None:
        reasons.append("no upper bound found: every probed rate met the SLO")
    elif failing - passing[0] > resolution * passing[0]:
        reasons.append(f"probe budget ({max_probes}) ran out before the {resolution:.0%} resolution")
    return SearchResult(slo_p99_s, passing[0], not reasons, reasons, resolution, probes)


def is_stable(windows: list[dict]) -> bool:
    """perf_analyzer's rule: throughput and p99 of each of the last 3 windows within 10% of their mean."""
    if len(windows) < 3:
        return False
    for key in ("achieved_rps", "p99_s"):
        values = [w[key] for w in windows]
        if any(v is None or v != v for v in values):
            return False
        mean = sum(values) / len(values)
        if mean <= 0 or any(abs(v - mean) > STABLE_WITHIN * mean for v in values):
            return False
    return True
