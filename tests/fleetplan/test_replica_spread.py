"""A replica whose batch time varies (a log-normal factor of mean 1 per batch): the M/G/1 mean wait, the same
answers as a plain FIFO queue fed the same service times, and the deterministic replica where the spread is 0."""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from latlab.report.fleetplan.replica import ReplicaModel, simulate


def poisson(rate: float, count: int, seed: int = 1) -> np.ndarray:
    return np.cumsum(np.random.default_rng(seed).exponential(1 / rate, count))


def fifo_reference(arrivals: np.ndarray, services: np.ndarray, instances: int) -> np.ndarray:
    """Latency of each request in a FIFO queue of `instances` servers, request n taking services[n]."""
    free = [0.0] * instances
    latency = []
    for t, service in zip(arrivals.tolist(), services.tolist()):
        start = max(t, heapq.heappop(free))
        heapq.heappush(free, start + service)
        latency.append(start + service - t)
    return np.array(latency)


def test_mg1_mean_wait_is_pollaczek_khinchine():
    """E[W] = rate E[S^2] / (2 (1 - rho)); a mean-1 log-normal factor of sigma s has E[F^2] = exp(s^2)."""
    service, rate, sigma = 0.001, 600.0, 0.6
    model = ReplicaModel(service, 0.0, max_batch=1, queue_size=10**9, spread=sigma)
    served = simulate(poisson(rate, 400_000), model, seed=2)
    rho = rate * service
    mean_wait = float(np.mean(served.latency_s)) - service
    assert mean_wait == pytest.approx(rate * service**2 * np.exp(sigma**2) / (2 * (1 - rho)), rel=0.05)


@pytest.mark.parametrize("instances", [1, 2])
def test_batches_of_one_are_a_fifo_queue_fed_the_drawn_times(instances):
    """One instance takes the vectorised path, two the batch loop: both serve request n in factor n's time."""
    arrivals = poisson(1800.0 * instances, 20_000)
    model = ReplicaModel(0.0003, 0.0001, 0.0001, max_batch=1, instances=instances, queue_size=10**6, spread=0.8)
    services = model.service_s(1) * model.factors(arrivals.size, seed=5)
    served = simulate(arrivals, model, seed=5)
    np.testing.assert_allclose(served.latency_s, fifo_reference(arrivals, services, instances), rtol=1e-9)


@pytest.mark.parametrize(
    "settings",
    [
        dict(max_batch=1),
        dict(max_batch=1, instances=3),
        dict(max_batch=16, delay_s=0.002),
        dict(max_batch=16, delay_s=0.002, adaptive=True),
        dict(max_batch=8, delay_s=0.002, queue_size=20),
    ],
)
def test_no_spread_is_the_deterministic_replica(settings):
    arrivals = poisson(3000.0, 20_000, seed=4)
    fixed = ReplicaModel(0.0005, 0.0002, 0.0001, **settings)
    zero = ReplicaModel(0.0005, 0.0002, 0.0001, spread=0.0, **settings)
    assert zero.factors(10, seed=1) is None
    np.testing.assert_array_equal(simulate(arrivals, zero, seed=9).latency_s, simulate(arrivals, fixed).latency_s)


def test_a_spread_repeats_with_its_seed_and_keeps_the_mean_service():
    arrivals = np.arange(1, 20_001) * 0.01  # far apart: each request is served alone, at once
    model = ReplicaModel(0.002, 0.0, max_batch=4, delay_s=0.0, spread=0.5)
    first, again, other = (simulate(arrivals, model, seed=s).latency_s for s in (3, 3, 4))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    assert float(np.mean(first)) == pytest.approx(model.service_s(1), rel=0.02)
    assert np.percentile(first, 99) > 2 * np.percentile(first, 50)


def test_a_spread_raises_the_tail_at_the_same_load():
    arrivals = poisson(1400.0, 50_000)
    fixed = ReplicaModel(0.0005, 0.0, 0.0001, max_batch=1)
    varying = ReplicaModel(0.0005, 0.0, 0.0001, max_batch=1, spread=1.0)
    assert simulate(arrivals, varying).percentile_s(99) > 2 * simulate(arrivals, fixed).percentile_s(99)


@pytest.mark.parametrize("spread", [-0.1, 5.0, float("nan")])
def test_a_bad_spread_is_refused(spread):
    with pytest.raises(ValueError, match="spread"):
        ReplicaModel(0.001, 0.0, spread=spread)
