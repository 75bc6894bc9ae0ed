"""SLO search: the highest offered rate whose p99 meets a bound (bracket, then bisect), MLPerf-style.

Pure logic over a `measure(rate) -> step` callable, so it is tested without a server. A little over 400 lines on
purpose: what makes a passing step trustworthy (validity, the generator's lateness) stays beside the searches
that judge by it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

from latlab.loadtest.results import Step

MIN_REQUESTS = 500  # fewer samples than this cannot support a p99
SATURATED_BELOW = 0.9  # achieved / offered: a sweep stops below this
SEARCH_SATURATED_BELOW = 0.95  # the search is stricter: a short window hides a slight overload's latency


@dataclass
class SearchResult:
    """The answer with its evidence: VALID only if the passing step is trustworthy."""

    slo_p99_s: float
    rate: float | None
    valid: bool
    reasons: list[str]
    resolution: float
    probes: list[Step] = field(default_factory=list)

    def as_dict(self) -> dict:
        """As results record it (a deployment's `search`): plain JSON values, each probe a step's fields."""
        return asdict(self)

    def summary(self) -> str:
        verdict = "VALID" if self.valid else "INVALID"
        rate = f"{self.rate:.0f} req/s" if self.rate else "no rate"
        why = f" ({'; '.join(self.reasons)})" if self.reasons else ""
        return f"SLO p99 ≤ {self.slo_p99_s * 1e3:g} ms: {rate}, {verdict}{why}, {len(self.probes)} probes"


def meets(step: Step, slo_p99_s: float) -> bool:
    """The step met the SLO: p99 within bound, no errors, nothing dropped, not saturated."""
    p99 = step.p99_s
    return (
        p99 is not None
        and p99 == p99
        and p99 <= slo_p99_s
        and not step.errors
        and not step.dropped
        and step.achieved_rps >= SEARCH_SATURATED_BELOW * step.offered_rps
    )


def slo_verdict(step: Step, slo_p99_s: float) -> str:
    """ "met", "broken" or "undecided": the rule every table and the sweep's SLO brackets judge a step by.
    Errors, dropped arrivals or an offered rate not kept up with (open loop) break any SLO. Otherwise the
    step's decision at its confidence (`confidence.slos`, loadtest/confidence.py): met only when the count of
    requests over the bound is small enough for their number, broken when it is too large, else undecided.
    Steps without decisions (older results, or a bound not given to the sweep): the sample p99 against the
    bound, undecided with fewer than MIN_SAMPLES_P99 requests."""
    if step.errors or step.dropped:
        return "broken"
    offered = step.offered_rps if step.target_rps else None
    if offered and step.achieved_rps < SATURATED_BELOW * offered:
        return "broken"
    decision = step_decision(step, slo_p99_s)
    if decision is not None:
        return decision["verdict"]
    p99 = step.p99_s
    if p99 is None or p99 != p99 or step.too_few_samples:
        return "undecided"  # a "p99" of a handful of requests decides nothing
    return "met" if p99 <= slo_p99_s else "broken"


def step_decision(step: Step, slo_p99_s: float) -> dict | None:
    """The step's recorded decision for this bound (results since percentile confidence), else None."""
    for decision in (step.confidence or {}).get("slos", []):
        if abs(decision["slo_p99_s"] - slo_p99_s) <= 1e-9 * slo_p99_s:
            return decision
    return None


def slo_met(step: Step, slo_p99_s: float) -> bool:
    """The step met the SLO (slo_verdict says "met")."""
    return slo_verdict(step, slo_p99_s) == "met"


def open_slos(slos_s: tuple[float, ...], steps: list[Step], rate: float) -> tuple[float, ...]:
    """The SLOs whose verdict a step at `rate` could still add to: those the steps measured so far do not already
    settle there, as a p99 rises with the load (met at a rate at or above it settles "met"; broken at a rate at or
    below it, "broken"). A low rate's step, whose windows must hold the 299 requests a p99 "met" needs, is then
    lengthened only for the SLOs it brackets, not for the loose ones a higher rate met long ago."""
    rated = [(_rate(s), s) for s in steps if s.target_rps]
    return tuple(
        slo
        for slo in slos_s
        if not any(
            (r >= rate and slo_verdict(s, slo) == "met") or (r <= rate and slo_verdict(s, slo) == "broken")
            for r, s in rated
        )
    )


@dataclass
class Bracket:
    """Where one SLO's highest rate lies among a deployment's open-loop steps: `met` is the highest-rate step
    that met it, `broke` the lowest-rate step above that one that did not (None: none measured)."""

    slo_p99_s: float
    met: Step | None
    broke: Step | None

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


def _rate(step: Step) -> float:
    """A step's offered rate (what a bracket's ends are stated in)."""
    return float(step.target_rps or step.offered_rps or 0.0)


def slo_bracket(steps: list[Step], slo_p99_s: float) -> Bracket:
    """The bracket of one SLO over the open-loop steps measured so far (a step serves every SLO)."""
    rated = sorted((s for s in steps if s.target_rps), key=_rate)
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


def bracket_slos(
    slos_s: tuple[float, ...],
    steps: list[Step],
    measure: Callable[[float], Step],
    single: Callable[[], dict],
    resolution: float,
    floor_rps: float,
    budget: int,
    time_left: Callable[[], bool] = lambda: True,
) -> dict:
    """Narrow every SLO's bracket to `resolution` with extra steps (`measure(rate)` appends each to `steps`; one
    step serves every SLO), at most `budget` steps in all, each spent on the widest bracket left (a budget that
    runs out leaves every SLO narrowed some way, not the tightest one exact and the others as listed). Below the
    lowest step only once one request at a time (`single()`, called at most once) has shown the SLO can be met
    at all. No step starts once `time_left()` says the time budget is spent (a low rate's step costs ten times a
    high rate's: its windows must hold the requests a p99 needs). Returns `slo_brackets` (one record per SLO),
    `slo_steps`, `slo_budget_spent` (the step or time budget stopped the search) and, when it was measured,
    `single_request`."""
    found: dict = {}
    extra = 0
    lowest = min((_rate(s) for s in steps if s.target_rps), default=0.0)

    def single_once() -> dict:
        if "single_request" not in found:
            found["single_request"] = single()
        return found["single_request"]

    spent = False
    while True:
        rate = _widest_next(slos_s, steps, single_once, resolution, floor_rps, lowest)
        spent = rate is not None and (extra >= budget or not time_left())
        if rate is None or spent:
            break
        measure(rate)
        extra += 1
    records = [
        bracket_record(
            slo_bracket(steps, slo), found.get("single_request"), resolution, floor_rps, tail_flat(steps, lowest)
        )
        for slo in sorted(slos_s)
    ]
    return {**found, "slo_brackets": records, "slo_steps": extra, "slo_budget_spent": spent}


def _widest_next(
    slos_s: tuple[float, ...],
    steps: list[Step],
    single: Callable[[], dict],
    resolution: float,
    floor_rps: float,
    lowest: float,
) -> float | None:
    """The next rate of the SLO whose bracket is widest (ratio of its ends; below every step, of the lowest
    broken to the floor), the tightest SLO first among equals; None when no bracket can narrow."""
    candidates = []
    flat = tail_flat(steps, lowest) is not None  # the same for every SLO: it depends on the steps alone
    for slo in sorted(slos_s):
        bracket = slo_bracket(steps, slo)
        below = bracket.met is None and bracket.broke is not None
        if below and (breaks(single(), slo) or flat):
            continue
        rate = next_slo_rate(bracket, resolution, floor_rps)
        if rate is not None:
            ratio = bracket.high / floor_rps if below else 1 + bracket.width()
            candidates.append((-ratio, slo, rate))
    return min(candidates)[2] if candidates else None


TAIL_FLAT = 0.8
"""Below this ratio of p99s, halving the rate still helps; at or above it the p99 has stopped falling."""


def tail_flat(steps: list[Step], below: float) -> Step | None:
    """The lowest-rate step when the p99 has stopped falling with the load: the search measured it below `below`
    (the sweep's lowest rate) and its p99 is at least TAIL_FLAT times that of the next rate up. Below that, lower
    rates buy nothing (the machine's tail, not queueing, sets the p99), so a search for a bound the deployment
    breaks there stops instead of halving on to the floor."""
    rated = sorted((s for s in steps if s.target_rps and s.p99_s is not None), key=_rate)
    if len(rated) < 2 or _rate(rated[0]) >= below:
        return None
    low, high = rated[0], rated[1]
    return low if low.p99_s >= TAIL_FLAT * high.p99_s else None


def bracket_record(
    bracket: Bracket, single: dict | None, resolution: float, floor_rps: float, flat: Step | None = None
) -> dict:
    """One SLO's bracket as results record it: its ends' rates, its width, and what it means in words."""
    if bracket.met is None and single is not None and breaks(single, bracket.slo_p99_s):
        meaning = NEVER
    elif bracket.met is None and bracket.broke is not None and flat is not None:
        meaning = (
            f"{FLAT} {_rate(flat):.3g} req/s: the p99 stopped falling with the load ({flat.p99_s * 1e3:.1f} ms there"
            + ("; under the bound, on too few requests to show it met" if flat.p99_s <= bracket.slo_p99_s else "")
            + ")"
        )
    elif bracket.met is None:
        meaning = (
            f"below the lowest rate measured (the search stops at {floor_rps:.3g} req/s)"
            if bracket.broke
            else "not measured"
        )
    elif bracket.broke is None:
        meaning = "met at every rate measured"
    else:
        meaning = (
            "within the resolution"
            if bracket.width() <= resolution
            else "wider than the resolution (the step or time budget ran out)"
        )
    upper = slo_verdict(bracket.broke, bracket.slo_p99_s) if bracket.broke else None
    needed = (step_decision(bracket.broke, bracket.slo_p99_s) or {}).get("needed") if upper == "undecided" else None
    return {
        "slo_p99_s": bracket.slo_p99_s,
        "met_rps": bracket.low,
        "broke_rps": bracket.high,
        "width": bracket.width(),
        "resolution": resolution,
        "floor_rps": floor_rps,
        "meaning": meaning,
        "broke_verdict": upper,
        "needed": needed,
    }


NEVER = "never: breaks it one request at a time"
FLAT = "not met down to"
"""How a bracket's meaning starts when the search below stopped because the p99 stopped falling (tail_flat)."""


def breaks(single: dict, slo_p99_s: float) -> bool:
    """The single-request evidence (loadtest/single.py) shows the SLO cannot be met at any rate: its p99 (of
    enough requests) is over the bound, its median is (then so is every higher percentile, however few the
    requests), or its requests failed."""
    if single.get("errors") or not single.get("requests"):
        return bool(single.get("errors"))
    if single["p50_s"] > slo_p99_s:
        return True
    return not single.get("too_few_samples") and single["p99_s"] > slo_p99_s


GENERATOR_BOUND_CPU = 90.0  # % of one core used by a generator process during a step
LATE_SHARE_OF_SLO = 0.1
"""Send lateness above this share of an SLO bound is material to it: latencies count from the intended send time,
so that much of the budget is the instrument's own, which bursts make likely."""


def late_for(lateness_p99_s: float | None, p99_s: float | None, bounds: tuple[float, ...]) -> bool:
    """Whether the generator's send lateness could have decided the step against one of the SLO bounds: it is a
    material share of the bound (LATE_SHARE_OF_SLO) and the step's p99 broke the bound by no more than it (a p99
    far above a bound breaks it whatever the generator did; one below it met it in spite of the generator)."""
    if lateness_p99_s is None or p99_s is None:
        return False
    return any(lateness_p99_s > LATE_SHARE_OF_SLO * b and b < p99_s <= b + lateness_p99_s for b in bounds)


def validity(step: Step) -> list[str]:
    """Why a passing step's figure should not be trusted (empty list: VALID)."""
    reasons = []
    if step.sent < MIN_REQUESTS:
        reasons.append(f"too few requests ({step.sent} < {MIN_REQUESTS})")
    if not step.stable:
        reasons.append("unstable: the last windows disagreed by more than 10%")
    if step.generator_bound:
        if (step.generator_cpu_percent or 0.0) > GENERATOR_BOUND_CPU or step.send_lateness_p99_s is None:
            reasons.append("generator saturated (its CPU > 90%)")
        else:
            late = step.send_lateness_p99_s * 1e3
            reasons.append(f"generator late: its sends p99 {late:.2f} ms after their time, enough to decide the SLO")
    return reasons


def slo_search(
    measure: Callable[[float], Step],
    slo_p99_s: float,
    start: float,
    resolution: float = 0.05,
    max_probes: int = 16,
    min_rate: float = 1.0,
    growth: float = 2.0,
) -> SearchResult:
    """Raise the rate by `growth` from `start` until the SLO breaks (or halve until it holds), then bisect the
    bracket until its width is within `resolution` of the passing rate. A start known to lie near the edge (a
    tuning probe starting at the best rate so far) takes a small growth: doubling past a 2-core machine's
    ceiling overloaded it so far that the bisection steps after it broke the bound at rates that had met it."""
    probes: list[Step] = []

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
            rate *= growth
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
    """Whether a reader may trust the windows as one steady state: every two of them agree within their noise.
    Throughput: their answered counts differ by at most AGREE_SIGMAS Poisson standard deviations. Latency:
    their p99 intervals (`p99_low_s`..`p99_high_s`, loadtest/confidence.py) overlap; a window without an upper
    bound (too few requests for one) overlaps everything above its lower one. Fewer than 3 windows: not yet.
    (perf_analyzer's rule, within 10% of the mean, fired on 72 of 80 steps of a 2-core lab: p99s of ~100 requests
    differ by more than 10% by chance alone.)"""
    if len(windows) < 3:
        return False
    for i, a in enumerate(windows):
        for b in windows[i + 1 :]:
            if not _counts_agree(a.get("ok"), b.get("ok")) or not _intervals_overlap(a, b):
                return False
    return True


AGREE_SIGMAS = 3.0


def _counts_agree(a: int | None, b: int | None) -> bool:
    if a is None or b is None:
        return True
    return abs(a - b) <= AGREE_SIGMAS * max(a + b, 1) ** 0.5


def _intervals_overlap(a: dict, b: dict) -> bool:
    def bounds(w: dict) -> tuple[float, float]:
        low, high = w.get("p99_low_s"), w.get("p99_high_s")
        return (0.0 if low is None else low, float("inf") if high is None else high)

    (a_low, a_high), (b_low, b_high) = bounds(a), bounds(b)
    return a_low <= b_high and b_low <= a_high
