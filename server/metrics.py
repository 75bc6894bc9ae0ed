"""Every Prometheus metric of the server, declared once against an injected registry."""

from __future__ import annotations

import os
from bisect import bisect_left
from collections import Counter as Tally
from typing import Iterator, Sequence

import psutil
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, values
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from latlab.server.gpu import GpuCollector

LABELS = ("deployment", "model", "provider")
# 100 µs .. 10 s. At most 0.1 ms apart below 1 ms and ~15% apart up to 10 ms, where a small model's whole
# request lives (a p50 read from 0.5 ms wide buckets could not tell +0.3 ms from +0.6 ms); the SLO bounds
# 10/25/50/100 ms are bucket edges, so "share of requests within the SLO" needs no interpolation.
LATENCY_BUCKETS = (
    0.0001,
    0.00015,
    0.0002,
    0.0003,
    0.0004,
    0.0005,
    0.0006,
    0.0007,
    0.0008,
    0.0009,
    0.001,
    0.0012,
    0.0014,
    0.0016,
    0.0018,
    0.002,
    0.0023,
    0.0026,
    0.003,
    0.0035,
    0.004,
    0.0045,
    0.005,
    0.006,
    0.007,
    0.008,
    0.01,
    0.0125,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.25,
    0.4,
    0.6,
    1.0,
    1.5,
    2.5,
    4.0,
    10.0,
)
BATCH_BUCKETS = tuple(float(2**i) for i in range(12))  # 1 .. 2048


class ServerMetrics:
    """The server's metrics; `for_deployment` gives the batcher's metrics bound to one deployment's labels.
    `process`: whether this registry also describes the process and the GPUs (False in the processes of a
    multi-front-end server, whose /metrics is multiprocess_registry's view of them all). Each gauge says how
    processes' values combine (ignored in one process)."""

    def __init__(self, registry: CollectorRegistry, process: bool = True) -> None:
        self.registry = registry
        if process:
            registry.register(GpuCollector())
            ProcessCollector(registry=registry)  # process_cpu_seconds_total: the report's server-bound flag
        self.request_duration = Histogram(
            "latlab_server_request_duration_seconds",
            "Time from receiving an infer request to its response.",
            LABELS,
            registry=registry,
            buckets=LATENCY_BUCKETS,
        )
        self.requests = Counter(
            "latlab_server_requests", "Infer requests answered, by outcome.", (*LABELS, "outcome"), registry=registry
        )
        self.inflight = Gauge(
            "latlab_server_inflight_requests",
            "Infer requests being handled right now.",
            LABELS,
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.queue_duration = Histogram(
            "latlab_batcher_queue_duration_seconds",
            "Time a request waited in the batcher's queue.",
            LABELS,
            registry=registry,
            buckets=LATENCY_BUCKETS,
        )
        self.compute_duration = Histogram(
            "latlab_batcher_compute_duration_seconds",
            "Time of one batched model run.",
            LABELS,
            registry=registry,
            buckets=LATENCY_BUCKETS,
        )
        self.batch_size = Histogram(
            "latlab_batcher_batch_size", "Samples per model run.", LABELS, registry=registry, buckets=BATCH_BUCKETS
        )
        self.queue_depth = Gauge(
            "latlab_batcher_queue_depth",
            "Requests waiting in the batcher's queue.",
            LABELS,
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.queue_capacity = Gauge(
            "latlab_batcher_queue_capacity",
            "The deployment's max_queue_size: requests that may wait.",
            LABELS,
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.admission_limit = Gauge(
            "latlab_server_admission_limit",
            "Infer requests the deployment admits at once (max_queue_size + "
            "instances x max_batch_size); one more is refused with 503 before its body is read.",
            LABELS,
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.rejections = Counter(
            "latlab_batcher_rejections",
            "Requests refused or dropped by the batcher, by reason.",
            (*LABELS, "reason"),
            registry=registry,
        )
        self.model_load = Gauge(
            "latlab_server_model_load_seconds",
            "Time to create the deployment's ONNX Runtime session.",
            LABELS,
            registry=registry,
            multiprocess_mode="livemostrecent",
        )
        self.model_warmup = Gauge(
            "latlab_server_model_warmup_seconds",
            "Time the deployment's warm-up took (every batch size once); absent while it runs.",
            LABELS,
            registry=registry,
            multiprocess_mode="livemostrecent",
        )
        # Only device providers observe these: on CPU ORT reads the request's arrays in place, no transfer.
        self.input_transfer_duration = Histogram(
            "latlab_batcher_input_transfer_duration_seconds",
            "Time copying one batch's inputs to the device.",
            LABELS,
            registry=registry,
            buckets=LATENCY_BUCKETS,
        )
        self.output_transfer_duration = Histogram(
            "latlab_batcher_output_transfer_duration_seconds",
            "Time copying one batch's requested outputs from the device to the host.",
            LABELS,
            registry=registry,
            buckets=LATENCY_BUCKETS,
        )
        self.preprocess_duration = Histogram(
            "latlab_server_preprocess_duration_seconds",
            "Time turning one request's input into the model's tensors (a text deployment's tokenization), "
            "on the request thread before queueing.",
            LABELS,
            registry=registry,
            buckets=LATENCY_BUCKETS,
        )
        self.batches = Counter(
            "latlab_batcher_batches", "Model runs, by outcome.", (*LABELS, "outcome"), registry=registry
        )
        # Batch buckets: a run's rows = the batch's samples + padded rows (never returned, never requests).
        self.run_rows = Counter(
            "latlab_batcher_run_rows", "Rows computed by model runs, padded rows included.", LABELS, registry=registry
        )
        self.padded_rows = Counter(
            "latlab_batcher_padded_rows",
            "Rows added to batches to reach their batch bucket (computed, never returned).",
            LABELS,
            registry=registry,
        )

        # Padding on a padded axis (a text model's tokens): a run computes its rows x the batch's longest request.
        self.run_positions = Counter(
            "latlab_batcher_run_positions",
            "Positions along the padded axis computed by model runs that padded (rows x the batch's longest).",
            LABELS,
            registry=registry,
        )
        self.padded_positions = Counter(
            "latlab_batcher_padded_positions",
            "Positions added to requests to reach their batch's longest on the padded axis (pad tokens).",
            LABELS,
            registry=registry,
        )

    def for_deployment(self, labels: dict[str, str]) -> "DeploymentMetrics":
        return DeploymentMetrics(self, labels)


class DeploymentMetrics:
    """The batcher's metrics for one deployment (batcher.BatchMetrics and the request path's); children are
    resolved once, not per call."""

    def __init__(self, metrics: ServerMetrics, labels: dict[str, str]) -> None:
        self.labels = labels
        self._metrics = metrics
        self._queue_depth = metrics.queue_depth.labels(**labels)
        self._queue_duration = metrics.queue_duration.labels(**labels)
        self._compute = metrics.compute_duration.labels(**labels)
        self._batch_size = metrics.batch_size.labels(**labels)
        self.request_duration = metrics.request_duration.labels(**labels)
        self.inflight = metrics.inflight.labels(**labels)
        self._run_rows = metrics.run_rows.labels(**labels)
        self._padded_rows = metrics.padded_rows.labels(**labels)  # at 0 from the start: no padding is a figure
        self._run_positions = metrics.run_positions.labels(**labels)
        self._padded_positions = metrics.padded_positions.labels(**labels)
        self._outcomes: dict[tuple[Counter, str], Counter] = {}  # (counter, outcome) -> child, see _child

    def queue_depth(self, depth: int) -> None:
        self._queue_depth.set(depth)

    def rejected(self, reason: str) -> None:
        self._metrics.rejections.labels(**self.labels, reason=reason).inc()

    def batch_done(self, size: int, queue_s: Sequence[float], compute_s: float, ok: bool) -> None:
        observe_all(self._queue_duration, queue_s)
        observe_all(self._compute, (compute_s,))
        observe_all(self._batch_size, (size,))
        self._child(self._metrics.batches, "ok" if ok else "error").inc()

    def rows_run(self, rows: int, samples: int) -> None:
        """A model run of `rows` rows for `samples` requested samples: the rest were padding."""
        self._run_rows.inc(rows)
        if rows > samples:
            self._padded_rows.inc(rows - samples)

    def positions_run(self, run: int, real: int) -> None:
        """A padded batch ran `run` positions on the padded axis for its requests' `real` ones."""
        self._run_positions.inc(run)
        self._padded_positions.inc(run - real)

    def transfer_done(self, input_s: float, output_s: float) -> None:
        """A device run's host-to-device and device-to-host copy times (never called on CPU)."""
        self._metrics.input_transfer_duration.labels(**self.labels).observe(input_s)
        self._metrics.output_transfer_duration.labels(**self.labels).observe(output_s)

    def preprocessed(self, seconds: float) -> None:
        """One request's tokenization time (text deployments only)."""
        self._metrics.preprocess_duration.labels(**self.labels).observe(seconds)

    def answered(self, outcome: str, seconds: float) -> None:
        observe_all(self.request_duration, (seconds,))
        self._child(self._metrics.requests, outcome).inc()

    def answered_many(self, answers: Sequence[tuple[str, float]]) -> None:
        """Requests answered together, (outcome, seconds) each: as `answered` one by one, with one write per
        outcome's counter and per histogram bucket touched (fastpath.Ledger)."""
        observe_all(self.request_duration, [seconds for _, seconds in answers])
        for outcome, count in Tally(outcome for outcome, _ in answers).items():
            self._child(self._metrics.requests, outcome).inc(count)

    def _child(self, counter: Counter, outcome: str) -> Counter:
        """The counter's child for this deployment and `outcome`, looked up once and then cached."""
        child = self._outcomes.get((counter, outcome))
        if child is None:
            child = self._outcomes[(counter, outcome)] = counter.labels(**self.labels, outcome=outcome)
        return child


def observe_all(histogram: Histogram, amounts: Sequence[float]) -> None:
    """Observe every amount into a labelled histogram exactly as Histogram.observe does one at a time (an amount
    counts in the first bucket whose bound it does not exceed), with one write per bucket touched and one to the sum
    for the lot. Each write takes a lock, and in multiprocess mode writes a file-backed value, so a batch's queue
    times cost a few writes instead of two per request; the bucket is found by bisection, not the linear scan of
    Histogram.observe over LATENCY_BUCKETS. Reads the child's value fields, which prometheus_client has kept alike
    across its releases; tests/server/test_metrics.py holds it to Histogram.observe's samples."""
    if not amounts:
        return
    bounds, buckets = histogram._upper_bounds, histogram._buckets
    if len(amounts) == 1:
        buckets[bisect_left(bounds, amounts[0])].inc(1)
    else:
        for index, count in Tally(bisect_left(bounds, amount) for amount in amounts).items():
            buckets[index].inc(count)
    histogram._sum.inc(sum(amounts))


def use_multiprocess_values(folder: str) -> None:
    """Make every metric created from now on in this process write its values to `folder` (prometheus_client's
    multiprocess mode), where multiprocess_registry reads all the server's processes together. Called by each
    process of a multi-front-end server before it creates its metrics."""
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
    values.ValueClass = values.MultiProcessValue()


def multiprocess_registry(folder: str, server_pid: int) -> CollectorRegistry:
    """What /metrics shows of a multi-front-end server: every process's metrics combined (counters and
    histograms summed, gauges by their multiprocess_mode), the GPUs, and the CPU time and memory of the whole
    server (the supervisor `server_pid` and every process under it), so the report's server-bound flag weighs
    every front end and the engine, not one process."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=folder)
    registry.register(GpuCollector())
    registry.register(ServerProcessesCollector(server_pid))
    return registry


class ServerProcessesCollector:
    """process_cpu_seconds_total and process_resident_memory_bytes summed over a process and its descendants
    (prometheus_client's ProcessCollector describes one process)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def collect(self) -> Iterator[Metric]:
        cpu, rss, count = 0.0, 0, 0
        try:
            root = psutil.Process(self.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            tree = []
        for process in tree:
            try:
                with process.oneshot():
                    times = process.cpu_times()
                    cpu += times.user + times.system
                    rss += process.memory_info().rss
                    count += 1
            except psutil.Error:  # it ended between the listing and now
                continue
        total = CounterMetricFamily(
            "process_cpu_seconds_total",
            "User and system CPU time of every process of the server (supervisor, front ends, engine), in seconds.",
        )
        total.add_metric([], cpu)
        yield total
        memory = GaugeMetricFamily(
            "process_resident_memory_bytes", "Resident memory of every process of the server, in bytes."
        )
        memory.add_metric([], rss)
        yield memory
        processes = GaugeMetricFamily(
            "latlab_server_processes", "Processes serving: supervisor, front ends and engine."
        )
        processes.add_metric([], count)
        yield processes
