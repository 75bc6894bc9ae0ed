"""Distribution-free percentile intervals and p99 early stopping (latlab.loadtest.confidence)."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from latlab.loadtest.confidence import (
    DEFAULT_CONFIDENCE,
    Decision,
    Interval,
    _ranks,
    binom_cdf,
    binom_sf,
    decide,
    min_samples_to_meet,
    percentile_interval,
    slo_decision,
)

SEED = 20240607
BOUND_S = 0.100


def brute_cdf(k: int, n: int, p: float) -> float:
    return math.fsum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(0, k + 1))


def tail_sample(n: int, fraction_over: float, seed: int = SEED) -> np.ndarray:
    """n latencies in seconds: each one over BOUND_S with probability fraction_over, the rest well under it."""
    rng = np.random.default_rng(seed)
    fast = rng.uniform(0.005, 0.050, n)
    slow = rng.uniform(0.150, 2.0, n)
    return np.where(rng.random(n) < fraction_over, slow, fast)


# --- exact binomial tails ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n, k, p",
    [
        (1, 0, 0.5),
        (10, 3, 0.3),
        (50, 0, 0.01),
        (50, 2, 0.01),
        (30, 29, 0.5),
        (200, 190, 0.99),
        (200, 1, 0.01),
        (120, 60, 0.5),
        (400, 3, 0.01),
    ],
)
def test_binomial_tails_match_brute_force_sum(n: int, k: int, p: float) -> None:
    assert binom_cdf(k, n, p) == pytest.approx(brute_cdf(k, n, p), rel=1e-9, abs=1e-15)
    assert binom_sf(k, n, p) == pytest.approx(1 - brute_cdf(k - 1, n, p), rel=1e-9, abs=1e-15)


def test_binomial_tails_keep_small_values_and_edges() -> None:
    assert binom_cdf(-1, 10, 0.5) == 0.0 and binom_cdf(10, 10, 0.5) == 1.0
    assert binom_sf(0, 10, 0.5) == 1.0 and binom_sf(11, 10, 0.5) == 0.0
    # a far tail is summed directly, not as 1 - (something close to 1)
    assert binom_cdf(0, 5000, 0.01) == pytest.approx(0.99**5000, rel=1e-9)
    assert binom_sf(5000, 5000, 0.99) == pytest.approx(0.99**5000, rel=1e-9)


def test_binomial_cdf_at_large_n_agrees_with_normal_approximation() -> None:
    n, p = 1_000_000, 0.01
    sd = math.sqrt(n * p * (1 - p))
    k = round(n * p - 2 * sd)
    assert binom_cdf(k, n, p) == pytest.approx(NormalDist(n * p, sd).cdf(k + 0.5), abs=2e-3)


# --- early stopping: known values --------------------------------------------------------------------------------


def test_min_samples_to_meet_p99_with_none_over_is_299() -> None:
    assert 0.99**299 < 0.05 <= 0.99**298
    assert min_samples_to_meet(0.99, 0.95, 0) == 299
    assert min_samples_to_meet() == 299


@pytest.mark.parametrize("over", [1, 5, 20])
def test_min_samples_to_meet_is_the_edge_of_met(over: int) -> None:
    n = min_samples_to_meet(0.99, DEFAULT_CONFIDENCE, over)
    assert slo_decision(n, over).verdict == "met"
    assert slo_decision(n - 1, over).verdict == "undecided"


def test_slo_decision_at_the_299_edge() -> None:
    met = slo_decision(299, 0)
    assert (met.verdict, met.needed) == ("met", 0)
    early = slo_decision(298, 0)
    assert (early.verdict, early.needed) == ("undecided", 299)


def test_three_percent_over_is_broken() -> None:
    d = slo_decision(10_000, 300)
    assert (d.verdict, d.needed) == ("broken", 0)


@pytest.mark.parametrize("n", [100, 1_000, 10_000, 100_000, 1_000_000])
def test_exactly_one_percent_over_never_decides(n: int) -> None:
    d = slo_decision(n, n // 100)
    assert d.verdict == "undecided"
    assert d.needed is None or d.needed > 100 * n


def test_empty_step_is_undecided_and_needs_the_clean_minimum() -> None:
    d = slo_decision(0, 0)
    assert d.verdict == "undecided" and d.needed == 299
    assert decide([], BOUND_S).verdict == "undecided"


@pytest.mark.parametrize("n, over", [(200, 1), (100, 2), (500, 3), (60, 2), (1_000, 14)])
def test_needed_is_where_the_same_fraction_decides(n: int, over: int) -> None:
    d = slo_decision(n, over)
    assert d.verdict == "undecided" and d.needed is not None and d.needed > n
    at_needed = slo_decision(d.needed, (over * d.needed + n // 2) // n)  # the fraction, rounded half up
    assert at_needed.verdict == ("met" if over / n < 0.01 else "broken")


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError):
        slo_decision(10, 11)
    with pytest.raises(ValueError):
        slo_decision(10, -1)
    with pytest.raises(ValueError):
        slo_decision(10, 0, q=1.0)
    with pytest.raises(ValueError):
        percentile_interval([0.1], 0.5, confidence=1.0)
    with pytest.raises(ValueError):
        min_samples_to_meet(over=-1)


# --- early stopping on sampled tails -----------------------------------------------------------------------------


def test_tail_just_inside_the_slo_is_met_once_enough_samples_arrive() -> None:
    x = tail_sample(5_000, 0.005)
    assert decide(x, BOUND_S).verdict == "met"
    early = decide(x[:200], BOUND_S)
    assert early.verdict == "undecided" and early.needed is not None and early.needed > 200


def test_tail_just_outside_the_slo_is_broken_once_enough_samples_arrive() -> None:
    x = tail_sample(5_000, 0.02)
    assert decide(x, BOUND_S).verdict == "broken"
    early = decide(x[:100], BOUND_S)
    assert early.verdict == "undecided" and early.needed is not None and early.needed > 100


def test_decide_counts_over_the_bound_and_nan_as_over() -> None:
    d = decide([0.01, 0.2, float("nan"), 0.1, 0.05], 0.1)
    assert isinstance(d, Decision)
    assert (d.n, d.over, d.q, d.confidence) == (5, 2, 0.99, DEFAULT_CONFIDENCE)
    assert d.as_dict() == {"verdict": d.verdict, "n": 5, "over": 2, "q": 0.99, "confidence": 0.95, "needed": d.needed}


# --- percentile intervals ----------------------------------------------------------------------------------------


def lognormal_quantile(mu: float, sigma: float, q: float) -> float:
    return math.exp(mu + sigma * NormalDist().inv_cdf(q))


@pytest.mark.parametrize("q", [0.5, 0.99])
def test_interval_covers_the_true_percentile(q: float) -> None:
    mu, sigma, n, reps = math.log(0.020), 0.5, 1_000, 400
    truth = lognormal_quantile(mu, sigma, q)
    draws = np.random.default_rng(SEED).lognormal(mu, sigma, (reps, n))
    intervals = [percentile_interval(x, q) for x in draws]
    assert all(iv.low is not None and iv.high is not None for iv in intervals)
    covered = sum(iv.low <= truth <= iv.high for iv in intervals)
    assert covered / reps >= 0.92
    # the bounds are sample values a few ranks either side of the estimate, not the sample's extremes
    sd = math.sqrt(n * q * (1 - q))
    for x, iv in zip(draws[:20], intervals[:20]):
        assert iv.low in x and iv.high in x
        assert iv.low <= iv.estimate <= iv.high
        assert n * q - 3 * sd - 1 <= np.count_nonzero(x < iv.low) <= n * q
        assert n * q <= np.count_nonzero(x <= iv.high) <= n * q + 3 * sd + 1


@pytest.mark.parametrize("n, q", [(1_000, 0.5), (1_000, 0.99), (400, 0.99), (37, 0.5), (100_000, 0.999)])
def test_interval_ranks_are_exact_and_tightest(n: int, q: float) -> None:
    tail = (1 - DEFAULT_CONFIDENCE) / 2
    low, high = _ranks(n, q, DEFAULT_CONFIDENCE)
    assert low is not None and high is not None
    assert binom_cdf(low - 1, n, q) <= tail < binom_cdf(low, n, q)
    assert binom_sf(high, n, q) <= tail < binom_sf(high - 1, n, q)
    coverage = 1 - binom_cdf(low - 1, n, q) - binom_sf(high, n, q)
    assert DEFAULT_CONFIDENCE <= coverage < 0.99


def test_estimate_is_numpys_linear_quantile() -> None:
    x = list(np.random.default_rng(SEED).exponential(0.03, 777))
    for q in (0.5, 0.9, 0.99, 0.999):
        assert percentile_interval(x, q).estimate == pytest.approx(float(np.quantile(x, q)), rel=1e-12)


def test_too_few_samples_leave_the_upper_p99_bound_open() -> None:
    x = np.random.default_rng(SEED).lognormal(math.log(0.02), 0.5, 50)
    iv = percentile_interval(x, 0.99)
    assert iv.high is None and iv.low is not None and iv.low <= iv.estimate
    assert (iv.n, iv.q, iv.confidence) == (50, 0.99, DEFAULT_CONFIDENCE)
    assert 0.99**368 <= 0.025 < 0.99**367
    assert percentile_interval(np.resize(x, 367), 0.99).high is None
    assert percentile_interval(np.resize(x, 368), 0.99).high is not None


def test_empty_and_tiny_steps() -> None:
    empty = percentile_interval([], 0.99)
    assert isinstance(empty, Interval) and math.isnan(empty.estimate)
    assert (empty.low, empty.high, empty.n) == (None, None, 0)
    assert empty.as_dict() == {"q": 0.99, "estimate": None, "low": None, "high": None, "confidence": 0.95, "n": 0}
    one = percentile_interval([0.01], 0.5)
    assert (one.estimate, one.low, one.high) == (0.01, None, None)


def test_lost_requests_rank_slowest() -> None:
    x = [0.01] * 500 + [float("nan")] * 500
    iv = percentile_interval(x, 0.99)
    assert iv.estimate == math.inf and iv.as_dict()["estimate"] is None
    assert percentile_interval(x[:600] + [float("nan")], 0.5).estimate == 0.01


def test_large_step_interval_is_narrow() -> None:
    x = np.random.default_rng(SEED).lognormal(math.log(0.02), 0.5, 1_000_000)
    iv = percentile_interval(x, 0.99)
    truth = lognormal_quantile(math.log(0.02), 0.5, 0.99)
    assert iv.low < iv.estimate < iv.high
    assert iv.high - iv.low < 0.02 * truth
