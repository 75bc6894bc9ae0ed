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
