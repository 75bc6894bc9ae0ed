"""latlab.loadtest.scrape: batch totals and averages read from a real registry's exposition text."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from latlab.loadtest.scrape import average_batch, batch_totals
from latlab.server.metrics import DeploymentObserver, ServerMetrics

FAST = {"deployment": "fast", "model": "ffn", "provider": "cpu"}
SLOW = {"deployment": "slow", "model": "ffn", "provider": "cuda"}


@pytest.fixture
def metrics() -> ServerMetrics:
    return ServerMetrics(CollectorRegistry())


def run_batches(observer: DeploymentObserver, sizes: list[int]) -> None:
    for size in sizes:
        # Queue and compute times large enough that reading the wrong histogram would show.
        observer.batch_done(size, queue_s=[5.0] * size, compute_s=7.0, ok=True)


def scrape(metrics: ServerMetrics) -> str:
    return generate_latest(metrics.registry).decode()


def test_totals_are_per_deployment(metrics: ServerMetrics) -> None:
    run_batches(metrics.for_deployment(FAST), [1, 4, 8])
    run_batches(metrics.for_deployment(SLOW), [2])
    text = scrape(metrics)
    assert batch_totals(text, "fast") == (13.0, 3.0)
    assert batch_totals(text, "slow") == (2.0, 1.0)
    assert batch_totals(text, "absent") == (0.0, 0.0)


def test_failed_batches_count_too(metrics: ServerMetrics) -> None:
    metrics.for_deployment(FAST).batch_done(3, queue_s=[0.1] * 3, compute_s=0.01, ok=False)
    assert batch_totals(scrape(metrics), "fast") == (3.0, 1.0)


def test_average_batch_between_two_scrapes(metrics: ServerMetrics) -> None:
    fast, slow = metrics.for_deployment(FAST), metrics.for_deployment(SLOW)
    run_batches(fast, [1, 1, 1])
    run_batches(slow, [64])
    before = scrape(metrics)
    run_batches(fast, [16, 8])
    run_batches(slow, [32, 32, 32, 32])
    after = scrape(metrics)
    assert average_batch(batch_totals(before, "fast"), batch_totals(after, "fast")) == 12.0
    assert average_batch(batch_totals(before, "slow"), batch_totals(after, "slow")) == 32.0


def test_average_batch_is_none_when_no_batch_ran(metrics: ServerMetrics) -> None:
    fast = metrics.for_deployment(FAST)
    metrics.for_deployment(SLOW)  # labelled children exist, but no batch
    empty = scrape(metrics)
    assert batch_totals(empty, "slow") == (0.0, 0.0)
    assert average_batch(batch_totals(empty, "slow"), batch_totals(empty, "slow")) is None
    run_batches(fast, [4])
    before = scrape(metrics)
    run_batches(metrics.for_deployment(SLOW), [2])  # another deployment's batch: not fast's
    after = scrape(metrics)
    assert average_batch(batch_totals(before, "fast"), batch_totals(after, "fast")) is None


def test_average_batch_from_nothing_to_something(metrics: ServerMetrics) -> None:
    before = scrape(metrics)  # the histogram has no children yet
    run_batches(metrics.for_deployment(FAST), [5, 7])
    after = scrape(metrics)
    assert batch_totals(before, "fast") == (0.0, 0.0)
    assert average_batch(batch_totals(before, "fast"), batch_totals(after, "fast")) == 6.0
