"""Reads the server's /metrics, from its observer port when it has one: what its batcher did during a measurement
window, how full its queue got, where a request's time went; and fetches its other routes for describe.py (a
deployment's settings). A server restarting must not crash the load test: requests are retried briefly, then fail
with one readable line (or give None where a figure can be missing).

Any Open Inference Protocol v2 server will do: latlab's extras (GET /v2's metrics_port, latlab_* series) are used
where the server has them; elsewhere the server's figures come from Triton's standard nv_inference_* counters where
a metrics URL exports them, else there are none (the report then shows the client side only)."""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from typing import Callable
from urllib.parse import urlsplit

import gevent
import requests
from prometheus_client.parser import text_string_to_metric_families

BATCH_SIZE = "latlab_batcher_batch_size"
QUEUE_DEPTH = "latlab_batcher_queue_depth"
QUEUE_CAPACITY = "latlab_batcher_queue_capacity"
TRITON_INFERENCES = "nv_inference_count"
"""Triton's counters of one model (labels model, version): inferences (batch elements) and model executions
(batches); inferences / executions between two scrapes is the average batch size."""
TRITON_EXECUTIONS = "nv_inference_exec_count"


def batch_totals(metrics_text: str, deployment: str) -> tuple[float, float]:
    """(samples, batches) so far for one deployment, from the batch-size histogram's _sum and _count (latlab), or
    from Triton's inference and execution counters of the model of that name."""
    samples = batches = 0.0
    for family in text_string_to_metric_families(metrics_text):
        if family.name in (TRITON_INFERENCES, TRITON_EXECUTIONS):
            total = sum(
                s.value
                for s in family.samples
                if s.labels.get("model") == deployment and s.name in (family.name, family.name + "_total")
            )
            if family.name == TRITON_INFERENCES:
                samples += total
            else:
                batches += total
            continue
        if family.name != BATCH_SIZE:
            continue
        for sample in family.samples:
            if sample.labels.get("deployment") != deployment:
                continue
            if sample.name == BATCH_SIZE + "_sum":
                samples += sample.value
            elif sample.name == BATCH_SIZE + "_count":
                batches += sample.value
    return samples, batches


def average_batch(before: tuple[float, float] | None, after: tuple[float, float] | None) -> float | None:
    """Average batch size between two scrapes; None when no batch ran or a scrape failed."""
    if before is None or after is None:
        return None
    batches = after[1] - before[1]
    return (after[0] - before[0]) / batches if batches > 0 else None


def queue_gauges(metrics_text: str, deployment: str) -> tuple[float | None, float | None]:
    """(queue depth, queue capacity) of one deployment; None for a gauge the server does not export.
    A line scan, not the full parser: it runs several times a second inside the load generator."""
    found: dict[str, float] = {}
    label = f'deployment="{deployment}"'
    for line in metrics_text.splitlines():
        if line.startswith((QUEUE_DEPTH + "{", QUEUE_CAPACITY + "{")) and label in line:
            name = line.split("{", 1)[0]
            found[name] = float(line.rsplit(" ", 1)[1])
    return found.get(QUEUE_DEPTH), found.get(QUEUE_CAPACITY)


_OBSERVERS: dict[str, str] = {}
"""Server URL -> its observer's URL, found once per process (the server's address does not change mid-run)."""
_SERVERS: dict[str, dict] = {}
"""Server URL -> its GET /v2 document (name, version, extensions; latlab's also metrics_port)."""


def server_info(host: str, timeout: float = 5.0) -> dict | None:
    """The server's GET /v2 document, asked once per host; None when it cannot be read (asked again next time)."""
    host = host.rstrip("/")
    if host not in _SERVERS:
        try:
            doc = requests.get(f"{host}/v2", timeout=timeout).json()
        except (requests.RequestException, ValueError):
            return None
        _SERVERS[host] = doc if isinstance(doc, dict) else {}
    return _SERVERS[host]


def observer(host: str, timeout: float = 5.0) -> str:
    """Where the server answers /metrics, health and config on threads of their own (its observer port, from
    GET /v2's metrics_port), so a scrape never waits behind the load it measures; `host` itself for a server
    without one. Asked once per host, before any load: an unreachable server is asked again next time."""
    host = host.rstrip("/")
    if host not in _OBSERVERS:
        info = server_info(host, timeout)
        if info is None:
            return host
        port = info.get("metrics_port")
        parts = urlsplit(host)
        _OBSERVERS[host] = f"{parts.scheme}://{_host_name(parts.hostname or '')}:{port}" if port else host
    return _OBSERVERS[host]


def _host_name(name: str) -> str:
    return f"[{name}]" if ":" in name else name  # an IPv6 literal keeps its brackets in a URL


def fetch(host: str, path: str, timeout: float = 5.0, attempts: int = 3, pause_s: float = 1.0) -> requests.Response:
    """GET path from the server's observer (or `path` itself when it is a full URL), retrying connection failures
    (a restarting server) `attempts` times; then raise requests.ConnectionError with one readable line."""
    url = path if path.startswith(("http://", "https://")) else f"{observer(host)}{path}"
    for attempt in range(attempts):
        try:
            return requests.get(url, timeout=timeout)
        except requests.RequestException as exc:
            reason = _reason(exc)
        if attempt + 1 < attempts:
            time.sleep(pause_s)
    raise requests.ConnectionError(f"cannot reach the server at {url} ({attempts} tries): {reason}")


@dataclass(frozen=True)
class MetricsSource:
    """Where a run reads the server's own figures and what it found there: kind "latlab" (latlab_* series),
    "triton" (Triton's nv_inference_* counters) or None (no figures: url is None and `note` says why)."""

    url: str | None
    kind: str | None
    note: str

    def as_dict(self) -> dict:
        return asdict(self)


_SOURCES: dict[tuple[str, str], MetricsSource] = {}
_LATLAB_SERIES = re.compile(r"^(?:# (?:HELP|TYPE) )?latlab_", re.MULTILINE)
_TRITON_SERIES = re.compile(r"^(?:# (?:HELP|TYPE) )?nv_inference_", re.MULTILINE)


def metrics_source(host: str, server_metrics: str = "", timeout: float = 5.0) -> MetricsSource:
    """Where this run reads server figures: `server_metrics` when the user gave a URL, else the server's /metrics
    (on its observer port when it has one), else, for a server whose GET /v2 says it is Triton, Triton's default
    metrics port 8002. Looked at once per host and URL in a process, before the first step."""
    key = (host.rstrip("/"), server_metrics)
    if key not in _SOURCES:
        source = _look_for_metrics(server_metrics or f"{observer(host)}/metrics", timeout)
        if not server_metrics and source.kind is None and (server_info(host) or {}).get("name") == "triton":
            parts = urlsplit(host)
            default = _look_for_metrics(f"{parts.scheme}://{_host_name(parts.hostname or '')}:8002/metrics", timeout)
            source = default if default.kind is not None else source
        _SOURCES[key] = source
    return _SOURCES[key]


def _look_for_metrics(url: str, timeout: float) -> MetricsSource:
    """What figures `url` has: latlab's series, Triton's counters or none (and why)."""
    try:
        response = requests.get(url, timeout=timeout)
    except requests.RequestException as exc:
        return MetricsSource(None, None, f"cannot read {url}: {_reason(exc)}")
    if response.status_code != 200:
        return MetricsSource(None, None, f"GET {url} answered {response.status_code}")
    if _LATLAB_SERIES.search(response.text):
        return MetricsSource(url, "latlab", f"latlab's series at {url}")
    if _TRITON_SERIES.search(response.text):
        return MetricsSource(url, "triton", f"Triton's nv_inference_* counters at {url}")
    return MetricsSource(None, None, f"{url} has neither latlab_* nor Triton's nv_inference_* series")


def scrape_batches(
    host: str, deployment: str, timeout: float = 5.0, url: str | None = None
) -> tuple[float, float] | None:
    """Batch totals so far (from `url`, default the server's /metrics), or None when they cannot be read (the
    step's average is then unknown)."""
    try:
        response = fetch(host, url or "/metrics", timeout=timeout, attempts=2, pause_s=0.5)
        response.raise_for_status()
    except requests.RequestException:
        return None
    return batch_totals(response.text, deployment)


def scrape_queue(host: str, deployment: str, timeout: float = 2.0) -> tuple[float | None, float | None] | None:
    """(depth, capacity) right now, or None when /metrics cannot be read; one try, no retry."""
    try:
        response = requests.get(f"{observer(host)}/metrics", timeout=timeout)
        response.raise_for_status()
    except requests.RequestException:
        return None
    return queue_gauges(response.text, deployment)


def _reason(exc: requests.RequestException) -> str:
    """The innermost cause, e.g. 'Connection refused', instead of urllib3's nested repr."""
    text = str(exc)
    for marker in ("Connection refused", "Connection reset", "Read timed out", "timed out", "Name or service"):
        if marker in text:
            return marker.lower()
    return f"{type(exc).__name__}: {text[:160]}"


class QueueWatch:
    """Samples the deployment's queue depth from the server's /metrics during a step (a greenlet)."""

    def __init__(self, host: str, deployment: str, interval_s: float) -> None:
        self.depths: list[float] = []
        self.capacity: float | None = None
        self.failures = 0
        self._greenlet = gevent.spawn(self._sample, host, deployment, interval_s) if interval_s > 0 else None

    def _sample(self, host: str, deployment: str, interval_s: float) -> None:
        while True:
            sample = scrape_queue(host, deployment)
            if sample is None:
                self.failures += 1
            else:
                depth, capacity = sample
                if depth is not None:
                    self.depths.append(depth)
                self.capacity = capacity if capacity is not None else self.capacity
            gevent.sleep(interval_s)

    def stop(self) -> dict:
        """Stop sampling; the step's queue figures (None where the server exports no such gauge)."""
        if self._greenlet is not None:
            self._greenlet.kill()
        return {
            "queue_depth_max": max(self.depths, default=None),
            "queue_capacity": self.capacity,
            "queue_samples": len(self.depths),
        }


# --- the server's own account of a step: where a request's time went, how busy the process and device were ---

SERVER_HISTOGRAMS = {
    "request": "latlab_server_request_duration_seconds",
    "queue": "latlab_batcher_queue_duration_seconds",
    "compute": "latlab_batcher_compute_duration_seconds",
    "input_transfer": "latlab_batcher_input_transfer_duration_seconds",
    "output_transfer": "latlab_batcher_output_transfer_duration_seconds",
    "preprocess": "latlab_server_preprocess_duration_seconds",
}
"""Step figure name -> the server's histogram (seconds). Request and queue are observed per request;
compute and the transfers per batch, which every request of that batch waits through."""
PROCESS_CPU = "process_cpu_seconds_total"
PADDING_COUNTERS = {
    "padded_position_share": ("latlab_batcher_padded_positions_total", "latlab_batcher_run_positions_total"),
    "padded_row_share": ("latlab_batcher_padded_rows_total", "latlab_batcher_run_rows_total"),
}
"""A step's padding: pad tokens over the positions its padded batches computed (mixed lengths), and rows added to
reach a batch bucket over the rows run (CUDA graphs and buckets); absent where the server exports neither."""
REQUESTS = "latlab_server_requests_total"
"""Infer requests answered, by outcome: `ok` and `rejected` counts per step (goodput under overload)."""
OUTCOMES = ("ok", "rejected")
TRITON_DURATIONS = {
    "request": "nv_inference_request_duration_us",
    "queue": "nv_inference_queue_duration_us",
    "input_transfer": "nv_inference_compute_input_duration_us",
    "infer": "nv_inference_compute_infer_duration_us",
    "output_transfer": "nv_inference_compute_output_duration_us",
}
"""Step figure name -> Triton's counter (microseconds, summed over its successful requests; a batch's compute
times count once for each request in it, as latlab's per-batch times are what each of its requests waits through).
Triton's compute input and output (tensors into and out of the backend) stand where latlab has its transfers."""
TRITON_SUCCESS = "nv_inference_request_success"
TRITON_FAILURE = "nv_inference_request_failure"
"""By `reason` in Triton 2.4x (REJECTED: a full queue refused it, latlab's `rejected`); without one before."""
TRITON_COUNTERS = (*TRITON_DURATIONS.values(), TRITON_SUCCESS, TRITON_FAILURE, TRITON_INFERENCES, TRITON_EXECUTIONS)


def metric_sums(metrics_text: str, deployment: str) -> dict[str, float]:
    """Every _sum/_count of the server histograms for one deployment, the process's CPU seconds (unlabelled, when
    the server exports it), keyed by sample name, and its answered requests per outcome ("<name>:<outcome>").
    From Triton's metrics: its nv_inference_* counters of the model named `deployment`, all versions together,
    keyed by family name (failures also per reason, "<name>:<reason>")."""
    wanted = {name + suffix for name in SERVER_HISTOGRAMS.values() for suffix in ("_sum", "_count")}
    wanted |= {name for pair in PADDING_COUNTERS.values() for name in pair}
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name in TRITON_COUNTERS:
            for sample in family.samples:
                if sample.labels.get("model") != deployment or sample.name not in (family.name, family.name + "_total"):
                    continue
                found[family.name] = found.get(family.name, 0.0) + sample.value
                if "reason" in sample.labels:
                    key = f"{family.name}:{sample.labels['reason']}"
                    found[key] = found.get(key, 0.0) + sample.value
            continue
        for sample in family.samples:
            if sample.name == PROCESS_CPU:
                found[PROCESS_CPU] = sample.value
            elif (
                sample.name == REQUESTS
                and sample.labels.get("deployment") == deployment
                and sample.labels.get("outcome") in OUTCOMES
            ):
                key = f"{REQUESTS}:{sample.labels['outcome']}"
                found[key] = found.get(key, 0.0) + sample.value
            elif sample.name in wanted and sample.labels.get("deployment") == deployment:
                found[sample.name] = found.get(sample.name, 0.0) + sample.value
    return found


def server_step(
    before: tuple[float, str] | None, after: tuple[float, str] | None, deployment: str, instances: int = 1
) -> dict | None:
    """Mean seconds per request of each server histogram between two (monotonic time, /metrics text)
    snapshots, the process's CPU use in cores and the share of time the deployment's instances ran batches.
    None when a snapshot is missing; a histogram the server does not export (or that saw nothing) is absent.
    From Triton's counters instead (see triton_step): the same figures, `source` "triton"."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    seconds = after[0] - before[0]
    start, end = metric_sums(before[1], deployment), metric_sums(after[1], deployment)

    def delta(name: str) -> float | None:
        return end[name] - start.get(name, 0.0) if name in end else None

    figures: dict = {"seconds": seconds}
    for key, name in SERVER_HISTOGRAMS.items():
        total, count = delta(name + "_sum"), delta(name + "_count")
        if total is not None and count:
            figures[f"{key}_s"] = total / count
            figures[f"{key}_count"] = count
    for outcome in OUTCOMES:
        if f"{REQUESTS}:{outcome}" in end:
            figures[f"{outcome}_count"] = delta(f"{REQUESTS}:{outcome}")
    for key, (padded, run) in PADDING_COUNTERS.items():
        computed = delta(run)
        if computed:  # no padded batch in the step: no share to speak of
            figures[key] = (delta(padded) or 0.0) / computed
    cpu = delta(PROCESS_CPU)
    figures["process_cpu_cores"] = cpu / seconds if cpu is not None else None
    busy = delta(SERVER_HISTOGRAMS["compute"] + "_sum")  # batches run: the device's (or ORT's) busy time
    if TRITON_SUCCESS in end:
        figures.update(triton_step(delta))
        busy = figures.pop("busy_s", busy)
        if busy is not None:  # an upper estimate (triton_step): never more than the instances' time
            busy = min(busy, seconds * max(1, instances))
    figures["busy_s"] = busy
    figures["busy_share"] = busy / (seconds * max(1, instances)) if busy is not None else None
    return figures


def triton_step(delta: Callable[[str], float | None]) -> dict:
    """A step's figures from the differences of Triton's counters (`delta(name)`, None for one not exported):
    mean seconds per successful request of the request, its queue wait, compute input, the model's run and compute
    output (compute_s is the three together, as latlab's compute histogram times a run with its transfers), the
    requests answered and refused, and busy_s, the model's running time estimated as the mean run per request
    times the executions: exact when no two requests share a run, and above the truth when batch sizes vary
    (every request of a batch records the batch's whole run, so the per-request mean weights the bigger, longer
    runs more); server_step caps it at the step's time. Empty when no request succeeded."""
    ok = delta(TRITON_SUCCESS)
    if not ok or ok <= 0:
        return {}
    means = {key: delta(name) / ok / 1e6 for key, name in TRITON_DURATIONS.items() if delta(name) is not None}
    figures: dict = {"source": "triton", "ok_count": ok}
    for key in ("request", "queue", "input_transfer", "output_transfer"):
        if key in means:
            figures[f"{key}_s"], figures[f"{key}_count"] = means[key], ok
    if "infer" in means:
        figures["compute_s"] = means["infer"] + means.get("input_transfer", 0.0) + means.get("output_transfer", 0.0)
        figures["compute_count"] = ok
    rejected = delta(f"{TRITON_FAILURE}:REJECTED")
    if rejected is not None:
        figures["rejected_count"] = rejected
    executions = delta(TRITON_EXECUTIONS)
    if "compute_s" in figures and executions is not None:
        figures["busy_s"] = figures["compute_s"] * executions
    return figures


def snapshot(host: str, timeout: float = 5.0, url: str | None = None) -> tuple[float, str] | None:
    """(monotonic time, /metrics text) now (from `url`, default the server's /metrics), or None when it cannot
    be read."""
    try:
        response = requests.get(url or f"{observer(host)}/metrics", timeout=timeout)
        response.raise_for_status()
    except requests.RequestException:
        return None
    return time.monotonic(), response.text
