"""latlab.loadtest.loadgen_metrics: the generator's metrics on a fresh registry, bucket accuracy, the exporter
(also under gevent)."""

from __future__ import annotations

import math
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import requests
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from latlab.common import procs
from latlab.loadtest.loadgen_metrics import LATENCY_BUCKETS_S, LoadGenMetrics, start_exporter
from latlab.loadtest.results import Step
from tests.loadtest.steps import simulated

RUN = {"run": "r1", "deployment": "ffn-batch"}


def step_stats(**overrides: object) -> Step:
    """A step as sweep.py measures it (the figures record_step reads, plus `stable`)."""
    stats = {
        "target_rps": 400.0,
        "offered_rps": 398.25,
        "achieved_rps": 397.5,
        "errors": 2,
        "p50_s": 0.0042,
        "p99_s": 0.0315,
        "generator_bound": False,
        "stable": True,
    }
    return simulated(**{**stats, **overrides})


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def metrics(registry: CollectorRegistry) -> LoadGenMetrics:
    return LoadGenMetrics(registry, "r1")


def bucket(registry: CollectorRegistry, name: str, le: float, **labels: str) -> float | None:
    le_label = "+Inf" if math.isinf(le) else floatToGoString(le)
    return registry.get_sample_value(f"{name}_bucket", {**labels, "le": le_label})


# --- live metrics -------------------------------------------------------------------------------------


def test_observe_counts_outcomes_and_fills_the_live_histogram(metrics, registry) -> None:
    metrics.observe("ffn-batch", [0.001, 0.002, 0.5], [True, False, True])
    metrics.observe("ffn-batch", np.array([0.003]), np.array([True]))
    assert registry.get_sample_value("latlab_loadtest_requests_total", {**RUN, "outcome": "ok"}) == 3
    assert registry.get_sample_value("latlab_loadtest_requests_total", {**RUN, "outcome": "error"}) == 1
    assert registry.get_sample_value("latlab_loadtest_latency_seconds_count", RUN) == 4
    assert registry.get_sample_value("latlab_loadtest_latency_seconds_sum", RUN) == pytest.approx(0.506)
    below_2ms = max(b for b in LATENCY_BUCKETS_S if b < 0.002)
    assert bucket(registry, "latlab_loadtest_latency_seconds", below_2ms, **RUN) == 1
    above_500ms = min(b for b in LATENCY_BUCKETS_S if b >= 0.5)
    assert bucket(registry, "latlab_loadtest_latency_seconds", above_500ms, **RUN) == 4
    assert bucket(registry, "latlab_loadtest_latency_seconds", math.inf, **RUN) == 4


def test_a_sample_on_a_bound_counts_in_that_bounds_bucket(metrics, registry) -> None:
    """Prometheus buckets are `le`: less than or equal to their bound."""
    bound = LATENCY_BUCKETS_S[100]
    metrics.observe("d", [bound], [True])
    labels = {"run": "r1", "deployment": "d"}
    assert bucket(registry, "latlab_loadtest_latency_seconds", bound, **labels) == 1
    assert bucket(registry, "latlab_loadtest_latency_seconds", LATENCY_BUCKETS_S[99], **labels) == 0


def test_observe_refuses_latencies_and_outcomes_of_different_lengths(metrics) -> None:
    with pytest.raises(ValueError, match="2 latencies but 1 outcomes"):
        metrics.observe("d", [0.1, 0.2], [True])


def test_dropped_late_and_load_gauges(metrics, registry) -> None:
    metrics.count_dropped("ffn-batch", 3)
    metrics.count_dropped("ffn-batch", 2)
    metrics.count_late("ffn-batch", 7)
    metrics.set_load("ffn-batch", step=4, target_rps=1600.0, users=2)
    assert registry.get_sample_value("latlab_loadtest_dropped_total", RUN) == 5
    assert registry.get_sample_value("latlab_loadtest_late_total", RUN) == 7
    assert registry.get_sample_value("latlab_loadtest_step", RUN) == 4
    assert registry.get_sample_value("latlab_loadtest_target_rps", RUN) == 1600.0
    assert registry.get_sample_value("latlab_loadtest_users", RUN) == 2


# --- per-step metrics -----------------------------------------------------------------------------------


def test_record_step_freezes_the_window_and_its_statistics(metrics, registry) -> None:
    latencies = np.random.default_rng(1).lognormal(math.log(0.005), 0.6, 500)
    metrics.record_step("ffn-batch", 3, latencies, step_stats(generator_bound=True), ended_at=1_763_730_000.25)
    labels = {**RUN, "step": "3"}
    gauge = lambda name: registry.get_sample_value(f"latlab_loadtest_step_{name}", labels)  # noqa: E731
    assert (gauge("target_rps"), gauge("offered_rps"), gauge("achieved_rps")) == (400.0, 398.25, 397.5)
    assert (gauge("p50_seconds"), gauge("p99_seconds"), gauge("errors")) == (0.0042, 0.0315, 2)
    assert (gauge("generator_bound"), gauge("stable")) == (1, 1)
    assert gauge("end_timestamp_seconds") == 1_763_730_000.25
    assert registry.get_sample_value("latlab_loadtest_step_latency_seconds_count", labels) == 500
    assert registry.get_sample_value("latlab_loadtest_step_latency_seconds_sum", labels) == pytest.approx(
        latencies.sum()
    )
    assert bucket(registry, "latlab_loadtest_step_latency_seconds", 0.005, **labels) is None  # not a bound
    below = max(b for b in LATENCY_BUCKETS_S if b < 0.005)
    assert bucket(registry, "latlab_loadtest_step_latency_seconds", below, **labels) == np.count_nonzero(
        latencies <= below
    )
    assert registry.get_sample_value("latlab_loadtest_latency_seconds_count", RUN) is None  # live one untouched


def test_record_step_of_an_empty_window_leaves_its_percentiles_out(metrics, registry) -> None:
    metrics.record_step("d", 0, [], step_stats(p50_s=None, p99_s=float("nan"), stable=None))
    labels = {"run": "r1", "deployment": "d", "step": "0"}
    assert registry.get_sample_value("latlab_loadtest_step_p50_seconds", labels) is None
    assert registry.get_sample_value("latlab_loadtest_step_p99_seconds", labels) is None
    assert registry.get_sample_value("latlab_loadtest_step_stable", labels) is None
    assert registry.get_sample_value("latlab_loadtest_step_latency_seconds_count", labels) == 0
    assert registry.get_sample_value("latlab_loadtest_step_offered_rps", labels) == 398.25
    assert registry.get_sample_value("latlab_loadtest_step_end_timestamp_seconds", labels) > 1.7e9


# --- bucket accuracy ------------------------------------------------------------------------------------


def interpolated_quantile(q: float, bounds: list[float], cumulative: list[float]) -> float:
    """Prometheus's histogram_quantile: find the bucket holding rank q·n, interpolate linearly inside it."""
    rank = q * cumulative[-1]
    b = next(i for i, c in enumerate(cumulative) if c >= rank)
    if b == len(bounds):  # the +Inf bucket: Prometheus answers the highest finite bound
        return bounds[-1]
    lower, below = (0.0, 0.0) if b == 0 else (bounds[b - 1], cumulative[b - 1])
    return lower + (bounds[b] - lower) * (rank - below) / (cumulative[b] - below)


def test_buckets_are_geometric_with_factor_1_05_from_50us_past_60s() -> None:
    bounds = np.asarray(LATENCY_BUCKETS_S)
    assert bounds[0] == 50e-6 and bounds[-2] < 60.0 <= bounds[-1]
    assert np.allclose(bounds[1:] / bounds[:-1], 1.05, rtol=2e-5, atol=0)
    assert len(set(floatToGoString(b) for b in bounds)) == len(bounds)  # every `le` label distinct


@pytest.mark.parametrize("median_s, sigma", [(0.0003, 0.3), (0.004, 0.8), (0.05, 1.5), (2.0, 0.5)])
def test_interpolated_quantiles_are_within_5_percent_of_exact(registry, metrics, median_s, sigma) -> None:
    latencies = np.random.default_rng(7).lognormal(math.log(median_s), sigma, 2000)
    metrics.record_step("d", 0, latencies, step_stats())
    labels = {"run": "r1", "deployment": "d", "step": "0"}
    cumulative = [
        bucket(registry, "latlab_loadtest_step_latency_seconds", b, **labels) for b in [*LATENCY_BUCKETS_S, math.inf]
    ]
    for q in (0.5, 0.9, 0.99, 0.999):
        exact = np.percentile(latencies, q * 100, method="inverted_cdf")
        estimate = interpolated_quantile(q, list(LATENCY_BUCKETS_S), cumulative)
        assert abs(estimate - exact) / exact < 0.05, (q, estimate, exact)


# --- the exporter ---------------------------------------------------------------------------------------


def test_exporter_serves_metrics_on_127_0_0_1_and_stops(metrics, registry) -> None:
    metrics.observe("d", [0.01], [True])
    exporter = start_exporter(registry, 0)
    try:
        body = requests.get(f"http://127.0.0.1:{exporter.port}/metrics", timeout=5).text
    finally:
        exporter.stop()
    assert 'latlab_loadtest_requests_total{deployment="d",outcome="ok",run="r1"} 1.0' in body
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{exporter.port}/metrics", timeout=5)


GEVENT_EXPORTER = textwrap.dedent("""
    import locust  # first, as in a sweep: Locust monkey-patches sockets and threads for gevent
    import sys

    import gevent
    from gevent import monkey
    from prometheus_client import CollectorRegistry

    from latlab.loadtest.loadgen_metrics import LoadGenMetrics, start_exporter

    assert monkey.is_module_patched("socket") and monkey.is_module_patched("threading"), "not patched"
    registry = CollectorRegistry()
    metrics = LoadGenMetrics(registry, "g1")
    start_exporter(registry, int(sys.argv[1]))
    while True:  # the main greenlet keeps generating, as the sweep's does, and must not starve the exporter
        metrics.observe("d", [0.01], [True])
        gevent.sleep(0.02)
""")


def test_exporter_serves_under_gevent_monkey_patching(tmp_path: Path) -> None:
    script, log = tmp_path / "gevent_exporter.py", tmp_path / "gevent_exporter.log"
    script.write_text(GEVENT_EXPORTER)
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    process = procs.start([sys.executable, str(script), str(port)], log_path=log)
    try:
        procs.wait_ready(url, process, timeout_s=60, log_path=log)
        first = ok_requests(requests.get(url, timeout=5).text)
        time.sleep(0.3)
        second = ok_requests(requests.get(url, timeout=5).text)
    finally:
        procs.stop(process)
    assert 0 < first < second  # served twice while the main greenlet kept observing


def ok_requests(metrics_text: str) -> float:
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "latlab_loadtest_requests_total" and sample.labels["outcome"] == "ok":
                return sample.value
    raise AssertionError("no latlab_loadtest_requests_total{outcome='ok'} in the scrape")
