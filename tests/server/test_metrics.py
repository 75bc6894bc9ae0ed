"""latlab.server.metrics: observe_all keeps every histogram sample Histogram.observe gives, in one process and in
prometheus_client's multiprocess mode, and a batch's metrics count each of its requests once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry, Histogram, values
from prometheus_client.multiprocess import MultiProcessCollector

from latlab.server.errors import QueueFull
from latlab.server.http import fastpath
from latlab.server.http.app import create_app
from latlab.server.http.fastpath import Accounted, Ledger
from latlab.server.metrics import BATCH_BUCKETS, LATENCY_BUCKETS, ServerMetrics, observe_all

LABELS = {"deployment": "tiny", "model": "tiny", "provider": "cpu"}
AMOUNTS = [
    [0.0021],
    [0.0, 0.0001, 0.001, 0.001, 0.0012, 10.0, 11.5, 0.00099],  # on bounds, past the last one, repeated
    [float(n) for n in (1, 2, 3, 64, 2048, 4096, 1)],
    [0.0001 * n for n in range(200)],
]


def samples(registry: CollectorRegistry) -> dict[tuple, float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in registry.collect()
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


def observed(amounts: list[float], buckets: tuple[float, ...], together: bool) -> CollectorRegistry:
    registry = CollectorRegistry()
    child = Histogram("h_seconds", "h", ["deployment"], registry=registry, buckets=buckets).labels(deployment="d")
    if together:
        observe_all(child, amounts)
    else:
        for amount in amounts:
            child.observe(amount)
    return registry


@pytest.mark.parametrize("amounts", AMOUNTS)
@pytest.mark.parametrize("buckets", [LATENCY_BUCKETS, BATCH_BUCKETS])
def test_observe_all_gives_the_samples_of_observing_one_at_a_time(amounts, buckets) -> None:
    assert samples(observed(amounts, buckets, True)) == samples(observed(amounts, buckets, False))


def test_observe_all_of_nothing_writes_nothing() -> None:
    registry = observed([], LATENCY_BUCKETS, True)
    assert samples(registry)[("h_seconds_count", (("deployment", "d"),))] == 0


def test_observe_all_in_multiprocess_mode_reads_back_as_observe(tmp_path: Path, monkeypatch) -> None:
    """Each way into a folder of its own, read as a multi-front-end server's /metrics reads them."""
    views = []
    for together in (True, False):
        folder = tmp_path / str(together)
        folder.mkdir()
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(folder))
        monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue())
        observed(AMOUNTS[1] + AMOUNTS[3], LATENCY_BUCKETS, together)
        view = CollectorRegistry()
        MultiProcessCollector(view, path=str(folder))
        views.append(samples(view))
    assert views[0] == views[1]
    assert views[0][("h_seconds_count", (("deployment", "d"),))] == len(AMOUNTS[1] + AMOUNTS[3])


def test_batched_requests_are_each_counted_once(tiny_model: Path, make_config) -> None:
    """Concurrent requests share batches: every histogram of the request path counts each request exactly once,
    and the batch-size histogram sums to the samples sent."""
    registry = CollectorRegistry()
    app = create_app(make_config(tiny_model, max_batch_size=8, max_queue_delay_ms=5.0), registry=registry)
    n = 40
    body = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}]})
    try:
        with ThreadPoolExecutor(8) as pool:
            codes = list(
                pool.map(lambda _: app.test_client().post("/v2/models/tiny/infer", data=body).status_code, range(n))
            )
        batches = registry.get_sample_value("latlab_batcher_batches_total", {**LABELS, "outcome": "ok"})
    finally:
        app.extensions["latlab"].close()
    assert codes == [200] * n
    assert batches < n  # requests did share batches
    for name in ("latlab_server_request_duration_seconds", "latlab_batcher_queue_duration_seconds"):
        assert registry.get_sample_value(f"{name}_count", LABELS) == n
        assert registry.get_sample_value(f"{name}_bucket", {**LABELS, "le": "+Inf"}) == n
        assert registry.get_sample_value(f"{name}_sum", LABELS) > 0
    assert registry.get_sample_value("latlab_batcher_batch_size_sum", LABELS) == n
    assert registry.get_sample_value("latlab_batcher_batch_size_count", LABELS) == batches
    assert registry.get_sample_value("latlab_batcher_compute_duration_seconds_count", LABELS) == batches
    assert registry.get_sample_value("latlab_server_requests_total", {**LABELS, "outcome": "ok"}) == n


class Counted:
    """What Accounted needs of a deployment: its metrics (no door: these requests are not admitted)."""

    def __init__(self) -> None:
        self.metrics = ServerMetrics(CollectorRegistry(), process=False).for_deployment(LABELS)


def test_a_ledger_writes_what_accounting_each_request_writes(monkeypatch) -> None:
    """Five requests in, three out (two answered, one refused as the queue full), two still in flight: a Ledger
    flushed once leaves every series as accounting each request as it goes does, and writes nothing before."""
    monkeypatch.setattr(fastpath.time, "perf_counter", lambda: 10.0)
    each, gathered, ledger = Counted(), Counted(), Ledger()
    starts = [9.9, 9.95, 9.99, 9.999, 9.5]
    outcomes = [None, QueueFull("full"), None]
    for deployment, book in ((each, None), (gathered, ledger)):
        accounts = [Accounted(deployment, started, book).__enter__() for started in starts]
        for account, error in zip(accounts, outcomes):
            account.__exit__(None if error is None else type(error), error, None)
    registry = gathered.metrics._metrics.registry
    before = samples(registry)
    assert before == samples(Counted().metrics._metrics.registry)  # as a deployment that served nothing
    ledger.flush()
    after = samples(registry)
    assert after == samples(each.metrics._metrics.registry)
    assert after[("latlab_server_inflight_requests", tuple(sorted(LABELS.items())))] == 2
    ledger.flush()  # nothing gathered since: nothing written again
    assert samples(registry) == after
