"""The load generator's Prometheus metrics: live series while load runs, and one frozen set per measured step."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Iterator, Sequence
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest, start_http_server
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.metrics_core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from latlab.loadtest.results import Step


def geometric_buckets(start: float, stop: float, factor: float) -> tuple[float, ...]:
    """Bounds start·factorⁱ up to the first one ≥ stop.

    Rounded to 6 significant digits so `le` labels stay readable (the factor moves by under 1e-5)."""
    count = math.ceil(math.log(stop / start) / math.log(factor)) + 1
    return tuple(float(f"{start * factor**i:.6g}") for i in range(count))


# histogram_quantile interpolates linearly inside a bucket, so its error is at most one bucket's width:
# 5% of the value with a 1.05 factor. 289 bounds from 50 µs to 63 s.
LATENCY_BUCKETS_S = geometric_buckets(50e-6, 60.0, 1.05)

RUN_LABELS = ("run", "deployment")
STEP_LABELS = ("run", "deployment", "step")

# The Step fields (as the sweep writes them to results.json) and the gauge each one goes to.
KEEP_STEPS = 2  # per-step series stay in the exposition this many steps after their own

STEP_GAUGES = {
    "target_rps": ("latlab_loadtest_step_target_rps", "Arrival rate the step asked for (requests/s)."),
    "offered_rps": ("latlab_loadtest_step_offered_rps", "Arrivals intended in the window (sent or dropped) per s."),
    "achieved_rps": ("latlab_loadtest_step_achieved_rps", "Successful completions in the window per second."),
    "p50_s": ("latlab_loadtest_step_p50_seconds", "Exact median latency of the window (order statistic)."),
    "p99_s": ("latlab_loadtest_step_p99_seconds", "Exact 99th percentile latency of the window (order statistic)."),
    "errors": ("latlab_loadtest_step_errors", "Failed requests among the window's arrivals."),
    "generator_bound": (
        "latlab_loadtest_step_generator_bound",
        "1 if the load generator was saturated (CPU) or sent late enough to break an SLO the step broke.",
    ),
    "stable": ("latlab_loadtest_step_stable", "1 if the step's latency was judged stable."),
}


class BatchHistogram(Collector):
    """A labelled histogram filled a batch of samples at a time, with numpy.

    prometheus_client's Histogram.observe scans its buckets one by one: about 4 µs a sample with these
    289 buckets, so filling a busy step's histogram would stall the gevent loop for a tenth of a second."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._bounds = np.asarray(buckets, dtype=float)
        self._le = [floatToGoString(b) for b in buckets] + ["+Inf"]
        self._lock = threading.Lock()  # the exporter's thread reads while the generator writes
        self._counts: dict[tuple[str, ...], np.ndarray] = {}
        self._sums: dict[tuple[str, ...], float] = {}
        self._prefixes: dict[tuple[str, ...], list[str]] = {}

    def observe_many(self, labelvalues: Sequence[str], values: Sequence[float]) -> None:
        """Add a batch of samples to one series (creating it, empty, when the batch is empty)."""
        if len(labelvalues) != len(self._labelnames):
            raise ValueError(f"{self._name} takes labels {self._labelnames}, got {tuple(labelvalues)}")
        samples = np.asarray(values, dtype=float)
        # side="left": a sample equal to a bound belongs to that bound's bucket (Prometheus's `le`).
        counts = np.bincount(np.searchsorted(self._bounds, samples, side="left"), minlength=len(self._le))
        key = tuple(labelvalues)
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + counts
            self._sums[key] = self._sums.get(key, 0.0) + float(samples.sum())

    def forget(self, labelvalues: Sequence[str]) -> None:
        """Stop exporting one series (Prometheus keeps what it already scraped)."""
        key = tuple(labelvalues)
        with self._lock:
            self._counts.pop(key, None)
            self._sums.pop(key, None)
            self._prefixes.pop(key, None)

    def render(self) -> str:
        """The text exposition, ~50x faster than prometheus_client's generic path: a scrape must not
        stall the load generator's event loop (that stall would show up as latency in every step)."""
        with self._lock:
            snapshot = [(key, np.cumsum(counts), self._sums[key]) for key, counts in self._counts.items()]
        lines = [f"# HELP {self._name} {self._documentation}", f"# TYPE {self._name} histogram"]
        for key, cumulative, total in snapshot:
            prefixes = self._prefixes.get(key)
            if prefixes is None:
                labels = ",".join(f'{n}="{_escape(v)}"' for n, v in zip(self._labelnames, key))
                prefixes = [f'{self._name}_bucket{{{labels}{"," if labels else ""}le="{le}"}} ' for le in self._le]
                prefixes += [f"{self._name}_count{{{labels}}} ", f"{self._name}_sum{{{labels}}} "]
                self._prefixes[key] = prefixes
            values = [*map(str, cumulative.tolist()), str(cumulative[-1]), repr(total)]
            lines.extend(map(str.__add__, prefixes, values))
        return "\n".join(lines) + "\n"

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)
        with self._lock:
            snapshot = [(key, np.cumsum(counts), self._sums[key]) for key, counts in self._counts.items()]
        for key, cumulative, total in snapshot:
            family.add_metric(list(key), list(zip(self._le, cumulative.tolist())), total)
        yield family


class LoadGenMetrics:
    """Every metric the load generator exports, declared once on the registry it is given.

    Every series carries the run's id, so one Prometheus can hold many runs. The per-step series are
    written once, when a step's window is measured, so a run's curves can be rebuilt from Prometheus alone."""

    def __init__(self, registry: CollectorRegistry, run_id: str) -> None:
        self.run_id = run_id
        self.latency = BatchHistogram(
            "latlab_loadtest_latency_seconds",
            "Request latency from the intended send time (open loop).",
            RUN_LABELS,
            LATENCY_BUCKETS_S,
        )
        self.step_latency = BatchHistogram(
            "latlab_loadtest_step_latency_seconds",
            "Latency from the intended send time of exactly one step's measurement window.",
            STEP_LABELS,
            LATENCY_BUCKETS_S,
        )
        registry.register(self.latency)
        registry.register(self.step_latency)
        self.requests = Counter(
            "latlab_loadtest_requests",
            "Completed requests by outcome (ok or error).",
            RUN_LABELS + ("outcome",),
            registry=registry,
        )
        self.dropped = Counter(
            "latlab_loadtest_dropped",
            "Arrivals not sent: too many requests outstanding.",
            RUN_LABELS,
            registry=registry,
        )
        self.late = Counter(
            "latlab_loadtest_late", "Arrivals sent later than the recorder's threshold.", RUN_LABELS, registry=registry
        )
        self.target_rps = Gauge(
            "latlab_loadtest_target_rps", "Arrival rate asked for now (requests/s).", RUN_LABELS, registry=registry
        )
        self.users = Gauge("latlab_loadtest_users", "Locust users generating the load.", RUN_LABELS, registry=registry)
        self.step = Gauge("latlab_loadtest_step", "Index of the sweep step running now.", RUN_LABELS, registry=registry)
        self.step_gauges = {
            key: Gauge(name, doc, STEP_LABELS, registry=registry) for key, (name, doc) in STEP_GAUGES.items()
        }
        self.step_end = Gauge(
            "latlab_loadtest_step_end_timestamp_seconds",
            "Unix time the step's measurement window ended.",
            STEP_LABELS,
            registry=registry,
        )
        self._registry = registry
        self._recorded: set[tuple[str, str, str]] = set()
        counters = (self.requests, self.dropped, self.late)
        gauges = (self.target_rps, self.users, self.step, self.step_end, *self.step_gauges.values())
        self._small_names = (
            {f"{c._name}_total" for c in counters}
            | {f"{c._name}_created" for c in counters}
            | {g._name for g in gauges}
        )

    def observe(self, deployment: str, latencies_s: Sequence[float], oks: Sequence[bool]) -> None:
        """A batch of completed requests: their latencies (from intended send) and whether each succeeded."""
        if len(latencies_s) != len(oks):
            raise ValueError(f"{len(latencies_s)} latencies but {len(oks)} outcomes")
        self.latency.observe_many((self.run_id, deployment), latencies_s)
        ok = int(np.count_nonzero(np.asarray(oks, dtype=bool)))
        self.requests.labels(self.run_id, deployment, "ok").inc(ok)
        self.requests.labels(self.run_id, deployment, "error").inc(len(oks) - ok)

    def count_dropped(self, deployment: str, n: int) -> None:
        self.dropped.labels(self.run_id, deployment).inc(n)

    def count_late(self, deployment: str, n: int) -> None:
        self.late.labels(self.run_id, deployment).inc(n)

    def set_load(self, deployment: str, step: int, target_rps: float, users: int) -> None:
        """What the generator is asked to do now, so dashboards can line latency up with load."""
        self.step.labels(self.run_id, deployment).set(step)
        self.target_rps.labels(self.run_id, deployment).set(target_rps)
        self.users.labels(self.run_id, deployment).set(users)

    def record_step(
        self, deployment: str, step: int, latencies_s: Sequence[float], stats: Step, *, ended_at: float | None = None
    ) -> None:
        """Freeze one measured step: its window's every latency and its results.json statistics.

        ended_at is the unix time the window ended (now when not given). The end timestamp is written
        last: it is what marks a step as recorded."""
        labels = (self.run_id, deployment, str(step))
        self._recorded.add(labels)
        self.step_latency.observe_many(labels, latencies_s)
        for key, gauge in self.step_gauges.items():
            value = _gauge_value(getattr(stats, key))
            if value is not None:
                gauge.labels(*labels).set(value)
        self.step_end.labels(*labels).set(time.time() if ended_at is None else ended_at)
        self._forget_step(deployment, step - KEEP_STEPS)

    def _forget_step(self, deployment: str, step: int) -> None:
        """Older steps leave the exposition (Prometheus has scraped them by then), so a scrape's cost
        stays flat however long the sweep runs."""
        labels = (self.run_id, deployment, str(step))
        if step < 0 or labels not in self._recorded:
            return
        self._recorded.discard(labels)
        self.step_latency.forget(labels)
        for gauge in (*self.step_gauges.values(), self.step_end):
            try:
                gauge.remove(*labels)
            except KeyError:
                pass

    def render(self) -> bytes:
        """Everything, for the exporter: the histograms through their fast path, the rest as usual."""
        fast = self.latency.render() + self.step_latency.render()
        return fast.encode() + generate_latest(self._registry.restricted_registry(self._small_names))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _gauge_value(value: float | bool | None) -> float | None:
    """Statistics of an empty window are None or NaN: leave their gauge out rather than export NaN."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


@dataclass
class Exporter:
    """A running /metrics endpoint; stop() frees its port."""

    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return self.server.server_port

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def start_exporter(source: "CollectorRegistry | LoadGenMetrics", port: int, host: str = "127.0.0.1") -> Exporter:
    """Serve a registry (or a LoadGenMetrics, through its fast render) on http://host:port/metrics from a
    daemon thread (a greenlet under Locust's gevent). Port 0 picks a free port: read it from the Exporter."""
    if isinstance(source, CollectorRegistry):
        server, thread = start_http_server(port, addr=host, registry=source)
        return Exporter(server, thread)

    def app(environ, start_response):
        body = source.render()
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST), ("Content-Length", str(len(body)))])
        return [body]

    server = make_server(host, port, app, ThreadingWSGIServer, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return Exporter(server, thread)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # one line per scrape is noise
        pass
