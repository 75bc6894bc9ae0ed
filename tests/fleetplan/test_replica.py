"""The replica simulator against closed-form queueing results and the batcher's rules."""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from latlab.report.fleetplan.replica import ReplicaModel, simulate


def fifo_reference(arrivals: np.ndarray, service_s: float, instances: int) -> np.ndarray:
    """Latency of each request in a plain FIFO queue of `instances` servers, one request at a time."""
    free = [0.0] * instances
    latency = []
    for t in arrivals.tolist():
        start = max(t, heapq.heappop(free))
        heapq.heappush(free, start + service_s)
        latency.append(start + service_s - t)
    return np.array(latency)


def poisson(rate: float, count: int, seed: int = 1) -> np.ndarray:
    return np.cumsum(np.random.default_rng(seed).exponential(1 / rate, count))


def test_md1_mean_wait_is_pollaczek_khinchine():
    service, rate = 0.001, 700.0
    served = simulate(poisson(rate, 400_000), ReplicaModel(service, 0.0, max_batch=1, queue_size=10**9))
    rho = rate * service
    mean_wait = float(np.mean(served.latency_s)) - service
    assert mean_wait == pytest.approx(rho * service / (2 * (1 - rho)), rel=0.03)
    assert served.rejected == 0


@pytest.mark.parametrize("instances", [1, 3])
@pytest.mark.parametrize("delay_s", [0.0, 0.005])
def test_batches_of_one_are_a_plain_fifo_queue(instances, delay_s):
    arrivals = poisson(1500.0 * instances, 5_000)
    model = ReplicaModel(0.0004, 0.0002, 0.0001, max_batch=1, delay_s=delay_s, instances=instances, queue_size=10**6)
    served = simulate(arrivals, model)
    np.testing.assert_allclose(served.latency_s, fifo_reference(arrivals, model.service_s(1), instances), atol=1e-12)
    assert served.batches == arrivals.size


def test_a_batcher_that_never_waits_sends_lone_requests_alone():
    """B > 1 but no delay: with every request arriving after the last is done, each is a batch of one."""
    arrivals = np.arange(1, 1001) * 0.01
    served = simulate(arrivals, ReplicaModel(0.002, 0.001, 0.0005, max_batch=8, delay_s=0.0))
    np.testing.assert_allclose(served.latency_s, 0.0035, atol=1e-12)
    assert served.batches == 1000


def test_constant_arrivals_slower_than_service_wait_for_nothing():
    arrivals = np.arange(1, 501) * 0.004
    served = simulate(arrivals, ReplicaModel(0.001, 0.0005, 0.0005, max_batch=1))
    np.testing.assert_allclose(served.latency_s, 0.002, atol=1e-12)


def test_a_lone_request_waits_out_the_delay():
    arrivals = np.arange(1, 101) * 0.05
    served = simulate(arrivals, ReplicaModel(0.001, 0.0005, 0.0, max_batch=8, delay_s=0.004))
    np.testing.assert_allclose(served.latency_s, 0.004 + 0.0015, atol=1e-12)


def test_a_batch_goes_as_soon_as_it_is_full():
    """Eight requests 1 ms apart fill a batch of eight before a 100 ms delay runs out: the first waits 7 ms."""
    arrivals = np.arange(8) * 0.001
    served = simulate(arrivals, ReplicaModel(0.002, 0.001, 0.0, max_batch=8, delay_s=0.1))
    assert served.batches == 1
    np.testing.assert_allclose(served.latency_s, 0.007 + 0.010 - arrivals, atol=1e-12)


def test_a_full_queue_rejects():
    """100 requests at once, one instance, room for 10: one runs, ten wait, the rest are rejected."""
    served = simulate(np.zeros(100), ReplicaModel(0.001, 0.0, max_batch=1, queue_size=10))
    assert served.rejected == 89
    np.testing.assert_allclose(np.sort(served.latency_s[np.isfinite(served.latency_s)]), 0.001 * np.arange(1, 12))
    assert served.attainment(1.0) == pytest.approx(11 / 100)


@pytest.mark.parametrize(
    "model",
    [ReplicaModel(0.0005, 0.0, 0.0002, max_batch=1, instances=2), ReplicaModel(0.001, 0.0002, 0.0, max_batch=16)],
)
def test_p99_rises_with_the_rate(model):
    unit = poisson(1.0, 20_000, seed=3)  # the same draws at every rate
    rates = np.linspace(0.1, 0.95, 12) * model.capacity_rps()
    p99 = [simulate(unit / rate, model).percentile_s(99) for rate in rates]
    assert all(later >= earlier for earlier, later in zip(p99, p99[1:]))
    assert p99[-1] > 2 * p99[0]


def test_batches_grow_with_the_load():
    model = ReplicaModel(0.002, 0.0001, 0.0, max_batch=32, delay_s=0.002)
    low = simulate(poisson(100.0, 5_000), model)
    high = simulate(poisson(5_000.0, 20_000), model)
    assert low.mean_batch < 1.5 < 8 < high.mean_batch <= 32


def test_adaptive_mode_sends_a_lone_request_at_once():
    """At low load waiting for a second request does not pay: the adaptive batcher does not wait out the delay."""
    arrivals = np.arange(1, 201) * 0.05
    fixed = simulate(arrivals, ReplicaModel(0.002, 0.0001, 0.0, max_batch=8, delay_s=0.01))
    adaptive = simulate(arrivals, ReplicaModel(0.002, 0.0001, 0.0, max_batch=8, delay_s=0.01, adaptive=True))
    np.testing.assert_allclose(fixed.latency_s, 0.01 + 0.0021, atol=1e-12)
    np.testing.assert_allclose(adaptive.latency_s, 0.0021, atol=1e-12)


def test_unsorted_arrivals_are_refused():
    with pytest.raises(ValueError, match="sorted"):
        simulate(np.array([1.0, 0.5]), ReplicaModel(0.001, 0.0))


def test_an_overloaded_replica_rejects_what_its_queue_cannot_hold_and_serves_the_rest():
    """Twice the capacity for a while: the queue fills, the excess is rejected, and once the burst ends the replica
    drains its queue and serves the later requests at once again."""
    model = ReplicaModel(0.001, 0.0001, 0.0, max_batch=8, delay_s=0.002, queue_size=50)
    burst = poisson(2 * model.capacity_rps(), 20_000)
    calm = burst[-1] + 1 + np.arange(100) * 0.1
    served = simulate(np.concatenate([burst, calm]), model)
    assert 0.3 < served.rejected / burst.size < 0.7
    assert served.latency_s[np.isfinite(served.latency_s)].max() <= (50 + 8) * model.service_s(8) / 8 + 0.01
    np.testing.assert_allclose(served.latency_s[-100:], 0.002 + model.service_s(1), atol=1e-12)
