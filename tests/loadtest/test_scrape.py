"""latlab.loadtest.scrape: batch totals and averages read from a real registry's exposition text; where it reads."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import requests
from prometheus_client import CollectorRegistry, generate_latest

from latlab.common.settings import BatcherSettings, CpuOptions
from latlab.loadtest.results import Curve
from latlab.loadtest.describe import describe
from latlab.loadtest.scrape import average_batch, batch_totals, fetch, observer, server_step, snapshot
from latlab.server.metrics import DeploymentMetrics, ServerMetrics

from tests.loadtest.stub_server import StubModel, stub_server
from tests.reliability.conftest import running_server

FAST = {"deployment": "fast", "model": "ffn", "provider": "cpu"}
SLOW = {"deployment": "slow", "model": "ffn", "provider": "cuda"}


@pytest.fixture
def metrics() -> ServerMetrics:
    return ServerMetrics(CollectorRegistry())


def run_batches(metrics: DeploymentMetrics, sizes: list[int]) -> None:
    for size in sizes:
        # Queue and compute times large enough that reading the wrong histogram would show.
        metrics.batch_done(size, queue_s=[5.0] * size, compute_s=7.0, ok=True)


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


# --- server_step: the server's own account of a step ---------------------------------------------------


def test_server_step_means_per_request_busy_share_and_transfers(metrics: ServerMetrics) -> None:
    fast = metrics.for_deployment(FAST)
    fast.batch_done(2, queue_s=[9.0, 9.0], compute_s=9.0, ok=True)  # before the step: must not count
    fast.answered("ok", 9.0)
    before = (100.0, scrape(metrics))
    fast.batch_done(2, queue_s=[0.001, 0.003], compute_s=0.004, ok=True)
    fast.batch_done(1, queue_s=[0.002], compute_s=0.002, ok=True)
    fast.transfer_done(0.0005, 0.0003)
    for seconds in (0.010, 0.012, 0.008):
        fast.answered("ok", seconds)
    fast.answered("rejected", 0.0001)
    metrics.for_deployment(SLOW).answered("ok", 0.01)  # another deployment's
    metrics.for_deployment(SLOW).batch_done(1, queue_s=[5.0], compute_s=5.0, ok=True)  # another deployment
    figures = server_step(before, (102.0, scrape(metrics)), "fast", instances=2)
    assert figures["seconds"] == 2.0
    assert figures["request_s"] == pytest.approx((0.010 + 0.012 + 0.008 + 0.0001) / 4)
    assert figures["request_count"] == 4 and figures["ok_count"] == 3 and figures["rejected_count"] == 1
    assert figures["queue_s"] == pytest.approx(0.002)  # per request
    assert figures["compute_s"] == pytest.approx(0.003)  # per batch: what each of its requests waits through
    assert figures["input_transfer_s"] == pytest.approx(0.0005)
    assert figures["output_transfer_s"] == pytest.approx(0.0003)
    assert figures["busy_s"] == pytest.approx(0.006) and figures["busy_share"] == pytest.approx(0.006 / 4)
    assert "preprocess_s" not in figures  # a histogram the server does not have
    assert figures["process_cpu_cores"] >= 0  # this test's own process, through ServerMetrics


def test_server_step_gives_the_padding_its_batches_added(metrics: ServerMetrics) -> None:
    """Pad tokens over the positions computed, and rows added for a bucket over rows run, in the step only."""
    fast = metrics.for_deployment(FAST)
    fast.positions_run(100, 10)  # before the step: must not count
    before = (100.0, scrape(metrics))
    assert "padded_position_share" not in server_step(before, (101.0, scrape(metrics)), "fast")  # none padded
    fast.positions_run(4 * 12, 3 + 12 + 7 + 8)  # lengths 3, 12, 7, 8 padded to 12
    fast.positions_run(2 * 5, 2 * 5)  # two of one length: nothing added
    fast.rows_run(8, 6)
    metrics.for_deployment(SLOW).positions_run(50, 1)  # another deployment's
    figures = server_step(before, (102.0, scrape(metrics)), "fast")
    assert figures["padded_position_share"] == pytest.approx((48 - 30) / (48 + 10))
    assert figures["padded_row_share"] == pytest.approx(2 / 8)


def test_server_step_reads_process_cpu_and_preprocess_when_exported() -> None:
    before = (
        10.0,
        "process_cpu_seconds_total 4.0\n"
        'latlab_server_preprocess_duration_seconds_sum{deployment="fast"} 1.0\n'
        'latlab_server_preprocess_duration_seconds_count{deployment="fast"} 10.0\n',
    )
    after = (
        14.0,
        "process_cpu_seconds_total 7.0\n"
        'latlab_server_preprocess_duration_seconds_sum{deployment="fast"} 1.5\n'
        'latlab_server_preprocess_duration_seconds_count{deployment="fast"} 110.0\n',
    )
    figures = server_step(before, after, "fast")
    assert figures["process_cpu_cores"] == pytest.approx(0.75)
    assert figures["preprocess_s"] == pytest.approx(0.005)
    assert server_step(None, after, "fast") is None and server_step(after, before, "fast") is None
    unexported = server_step((1.0, ""), (2.0, ""), "fast")  # a server without the process collector
    assert unexported["process_cpu_cores"] is None and unexported["busy_share"] is None
    assert "ok_count" not in unexported  # a server without latlab's request counts: goodput from the generator


def test_scrapes_go_to_the_observer_port(tmp_path: Path, tiny_model: Path) -> None:
    """The server's /metrics and /config are read where they never wait behind the load being measured."""
    with running_server(tmp_path, [{"name": "tiny", "model_path": str(tiny_model)}]) as server:
        port = requests.get(f"{server.url}/v2", timeout=5).json()["metrics_port"]
        assert observer(server.url + "/") == f"http://127.0.0.1:{port}"
        assert fetch(server.url, "/v2/models/tiny/config").url == f"http://127.0.0.1:{port}/v2/models/tiny/config"
        assert "latlab_server_admission_limit" in snapshot(server.url)[1]


def test_a_server_without_an_observer_is_read_where_it_is() -> None:
    with stub_server(StubModel()) as host:
        assert observer(host) == host.rstrip("/")
        assert fetch(host, "/v2/models/m/config").status_code == 200


def test_every_setting_latlab_describes_is_a_field_of_the_results(tmp_path: Path, tiny_model: Path) -> None:
    """The sweep keeps the deployment fields of the server's /config and leaves out the rest: a setting latlab's
    server adds to its /config must also become a field of the results, or results files would lose it."""
    with running_server(tmp_path, [{"name": "tiny", "model_path": str(tiny_model)}]) as server:
        described = describe(server.url, "tiny")
    fields = {f.name for f in dataclasses.fields(Curve)}
    assert {"name", "batcher", "cpu", "environment", "frontends"} <= set(described)
    assert set(described) <= fields, set(described) - fields
    assert isinstance(described["batcher"], BatcherSettings) and isinstance(described["cpu"], CpuOptions)
    assert described["batcher"].as_dict() == BatcherSettings().as_dict()  # every setting, in order
    assert {"cuda", "tensorrt", "tokenizer"} <= fields  # what a GPU or a text deployment adds
