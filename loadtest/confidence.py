"""How sure a load-test step's percentiles are: distribution-free confidence intervals and SLO early stopping.

A step measures n latencies. Two questions, both answered from the binomial distribution alone (no assumption
about the shape of the latency distribution):

* Where could the true q-quantile lie? The count B of samples at or below the true quantile x_q is
  Binomial(n, q), so order statistics X_(l) <= x_q <= X_(u) hold with probability
  >= 1 - P[B <= l-1] - P[B >= u]; ``percentile_interval`` picks l and u with equal tails (the classical
  order-statistic confidence interval, e.g. Conover, *Practical Nonparametric Statistics*, sec. 3.2).
* Does the step meet "p99 <= bound"? Each request is over the bound or not; if the true fraction over the bound
  were exactly 1-q, the count over would be Binomial(n, 1-q). Seeing few enough over rejects "fraction >= 1-q"
  (met); seeing many enough rejects "fraction <= 1-q" (broken); otherwise the step cannot tell (undecided).
  This is MLPerf LoadGen's early-stopping criterion (``loadgen/early_stopping.cc`` in mlcommons/inference),
  which is why, e.g., 299 requests with none over the bound already show p99 met at 95% confidence.

Binomial tails are summed exactly in log space over the window of counts that carry any mass, so a call costs
O(sqrt(n)) arithmetic besides the O(n) selection of order statistics; scipy is not needed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

DEFAULT_CONFIDENCE = 0.95
MAX_NEEDED = 10**9
"""Beyond this many requests a decision is reported as never coming (``needed`` None): no load test runs that long."""

_TAIL_SDS = 40
"""Counts further than this many standard deviations (plus _TAIL_PAD) past a point carry under e^-200 of the mass."""
_TAIL_PAD = 100


@dataclass(frozen=True)
class Interval:
    """A two-sided distribution-free confidence interval for one quantile of a step's latencies (seconds)."""

    q: float
    estimate: float
    low: float | None
    high: float | None
    confidence: float
    n: int

    def as_dict(self) -> dict:
        """JSON-ready: non-finite numbers (NaN estimate of an empty step, inf of a lost request) become None."""
        return {k: _finite_or_none(v) if k in ("estimate", "low", "high") else v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Decision:
    """Whether a step's q-quantile is under a latency bound, judged at a confidence level (early stopping)."""

    verdict: str
    n: int
    over: int
    q: float
    confidence: float
    needed: int | None

    def as_dict(self) -> dict:
        """JSON-ready fields."""
        return asdict(self)


def _finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _check(q: float, confidence: float) -> None:
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile q must lie strictly between 0 and 1, got {q!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence!r}")


# ---------------------------------------------------------------------------------------------------------------
# Exact binomial tails


def _window(n: int, p: float, centre: float) -> tuple[int, int]:
    """The counts within _TAIL_SDS standard deviations (+ pad) of `centre`, clipped to 0..n."""
    width = _TAIL_SDS * math.sqrt(n * p * (1.0 - p)) + _TAIL_PAD
    return max(0, math.floor(centre - width)), min(n, math.ceil(centre + width))


def _log_pmf(n: int, p: float, lo: int, hi: int) -> np.ndarray:
    """log P[Binomial(n, p) = k] for k = lo..hi: lgamma at lo, then cumulative sums of log pmf(k+1)/pmf(k)."""
    start = (
        math.lgamma(n + 1)
        - math.lgamma(lo + 1)
        - math.lgamma(n - lo + 1)
        + lo * math.log(p)
        + (n - lo) * math.log1p(-p)
    )
    k = np.arange(lo, hi, dtype=np.float64)
    steps = np.log((n - k) / (k + 1.0)) + (math.log(p) - math.log1p(-p))
    return start + np.concatenate(([0.0], np.cumsum(steps)))


def _sum_exp(logs: np.ndarray) -> float:
    top = float(logs.max())
    return math.exp(top) * float(np.exp(logs - top).sum()) if top > -math.inf else 0.0


def binom_cdf(k: int, n: int, p: float) -> float:
    """P[Binomial(n, p) <= k], exact up to rounding; sums the short tail directly so small values keep precision."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    if k > n * p:
        return 1.0 - binom_sf(k + 1, n, p)
    lo, _ = _window(n, p, k)
    return min(1.0, _sum_exp(_log_pmf(n, p, lo, k)))


def binom_sf(k: int, n: int, p: float) -> float:
    """P[Binomial(n, p) >= k], exact up to rounding (the upper-tail twin of binom_cdf)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if k <= n * p:
        return 1.0 - binom_cdf(k - 1, n, p)
    _, hi = _window(n, p, k)
    return min(1.0, _sum_exp(_log_pmf(n, p, k, hi)))


# ---------------------------------------------------------------------------------------------------------------
# Confidence interval for a percentile


def _as_latencies(latencies: Sequence[float] | np.ndarray) -> np.ndarray:
    """A flat float array; NaN (a lost request) ranks as the slowest possible, as in `decide`."""
    x = np.asarray(latencies, dtype=np.float64).ravel()
    return np.where(np.isnan(x), np.inf, x)


def _ranks(n: int, q: float, confidence: float) -> tuple[int | None, int | None]:
    """1-based ranks (l, u) with P[B <= l-1] <= alpha/2 and P[B >= u] <= alpha/2, B ~ Binomial(n, q); None: none."""
    tail = (1.0 - confidence) / 2.0
    lo, hi = _window(n, q, n * q)
    pmf = np.exp(_log_pmf(n, q, lo, hi))
    below = np.cumsum(pmf)  # P[B <= k], k = lo..hi (mass under lo is negligible)
    above = np.cumsum(pmf[::-1])[::-1]  # P[B >= k]
    lower = lo + int(np.searchsorted(below, tail, side="right"))  # largest k with P[B <= k] <= tail, plus 1
    u = lo + int(np.count_nonzero(above > tail))  # smallest k with P[B >= k] <= tail
    return (lower if lower >= 1 else None), (u if u <= hi else None)


def percentile_interval(
    latencies: Sequence[float] | np.ndarray, q: float, confidence: float = DEFAULT_CONFIDENCE
) -> Interval:
    """Two-sided distribution-free CI for the q-quantile: order statistics X_(l) <= x_q <= X_(u) with
    P >= confidence, from Binomial(n, q) (equal tails, each (1-confidence)/2). Bounds are sample values.

    The estimate is numpy's default ('linear') sample quantile. A bound is None when n is too small for it,
    e.g. an upper p99 bound at 95% needs n >= 368 (0.99**n <= 0.025).
    """
    _check(q, confidence)
    x = _as_latencies(latencies)
    n = int(x.size)
    if n == 0:
        return Interval(q, math.nan, None, None, confidence, 0)
    lower, u = _ranks(n, q, confidence)
    h = (n - 1) * q
    below, above = math.floor(h), math.ceil(h)
    kth = sorted({below, above} | {r - 1 for r in (lower, u) if r is not None})
    part = np.partition(x, kth)
    a, b = float(part[below]), float(part[above])
    estimate = a if a == b else a + (h - below) * (b - a)
    low = float(part[lower - 1]) if lower is not None else None
    high = float(part[u - 1]) if u is not None else None
    return Interval(q, estimate, low, high, confidence, n)


# ---------------------------------------------------------------------------------------------------------------
# Early stopping: is the step's q-quantile under the bound?


def _verdict(n: int, over: int, q: float, confidence: float) -> str:
    alpha = 1.0 - confidence
    if binom_cdf(over, n, 1.0 - q) <= alpha:
        return "met"
    if binom_sf(over, n, 1.0 - q) <= alpha:
        return "broken"
    return "undecided"


def _first(decides, start: int) -> int | None:
    """The first count >= start (found by doubling, then bisection) at which decides(count) holds; None past
    MAX_NEEDED. Assumes decides is (close to) monotone: rounding the over count makes its edge jagged by a sample."""
    if decides(start):
        return start
    lo, hi = start, max(2 * start, start + 1)
    while not decides(hi):
        if hi >= MAX_NEEDED:
            return None
        lo, hi = hi, min(2 * hi, MAX_NEEDED)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if decides(mid) else (mid, hi)
    return hi


def _needed(n: int, over: int, q: float, confidence: float) -> int | None:
    """Total samples at which the observed fraction over the bound would decide; None if it would never."""
    if n == 0:
        return min_samples_to_meet(q, confidence, 0)
    p = 1.0 - q
    if math.isclose(over / n, p, rel_tol=1e-9):
        return None
    target = "met" if over / n < p else "broken"

    def decides(total: int) -> bool:
        return _verdict(total, (over * total + n // 2) // n, q, confidence) == target

    return _first(decides, n + 1)


def slo_decision(n: int, over: int, q: float = 0.99, confidence: float = DEFAULT_CONFIDENCE) -> Decision:
    """met: the one-sided upper confidence bound on P(latency > bound) is below 1-q, i.e. P[Binom(n,1-q) <= over] <=
    1-confidence; broken: the one-sided lower bound is above 1-q, i.e. P[Binom(n,1-q) >= over] <= 1-confidence;
    else undecided. ``needed`` (undecided only) is the total count at which the same fraction over (rounded half up)
    would decide; None when it never would below MAX_NEEDED (a fraction at or very near 1-q)."""
    _check(q, confidence)
    if not 0 <= over <= n:
        raise ValueError(f"need 0 <= over <= n, got over={over!r}, n={n!r}")
    verdict = _verdict(n, over, q, confidence)
    needed = 0 if verdict != "undecided" else _needed(n, over, q, confidence)
    return Decision(verdict, n, over, q, confidence, needed)


def decide(
    latencies: Sequence[float] | np.ndarray, bound_s: float, q: float = 0.99, confidence: float = DEFAULT_CONFIDENCE
) -> Decision:
    """slo_decision on the samples: over = count of latencies > bound_s (NaN counts as over: a lost request)."""
    x = np.asarray(latencies, dtype=np.float64).ravel()
    return slo_decision(int(x.size), int(np.count_nonzero(~(x <= bound_s))), q, confidence)


def min_samples_to_meet(q: float = 0.99, confidence: float = DEFAULT_CONFIDENCE, over: int = 0) -> int:
    """The fewest samples with `over` of them over the bound that can be decided met (over=0 at p99, 95%: 299).
    Tells a load plan how long a step must run before a clean tail can count as a pass."""
    _check(q, confidence)
    if over < 0:
        raise ValueError(f"over must be >= 0, got {over!r}")
    found = _first(lambda total: binom_cdf(over, total, 1.0 - q) <= 1.0 - confidence, max(over, 1))
    if found is None:
        raise ValueError(f"over={over} would need more than {MAX_NEEDED} samples to be decided met")
    return found


def step_confidence(
    latencies: Sequence[float] | np.ndarray, slos_s: Sequence[float], confidence: float = DEFAULT_CONFIDENCE
) -> dict:
    """What a step's results carry: its p50 and p99 intervals, and per SLO bound the count over it and the
    decision (a report can judge the step again from these, without the raw latencies)."""
    values = _as_latencies(latencies)
    intervals = {f"p{round(q * 100)}": percentile_interval(values, q, confidence) for q in (0.5, 0.99)}
    decisions = []
    for bound in sorted(set(slos_s)):
        decision = decide(values, bound, 0.99, confidence)
        decisions.append(
            {"slo_p99_s": bound, "verdict": decision.verdict, "over": decision.over, "needed": decision.needed}
        )
    return {
        "level": confidence,
        "samples": int(len(values)),
        **{f"{name}_low_s": _finite_or_none(i.low) for name, i in intervals.items()},
        **{f"{name}_high_s": _finite_or_none(i.high) for name, i in intervals.items()},
        "slos": decisions,
    }
