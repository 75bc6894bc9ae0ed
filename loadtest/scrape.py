"""Reads the server's /config and /metrics, from its observer port when it has one: its deployment's settings,
what its batcher did during a measurement window and how full its queue got. A server restarting must not crash
the load test: requests are retried briefly, then fail with one readable line (or give None where a figure can
be missing)."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import gevent
import requests
from prometheus_client.parser import text_string_to_metric_families

BATCH_SIZE = "latlab_batcher_batch_size"
QUEUE_DEPTH = "latlab_batcher_queue_depth"
QUEUE_CAPACITY = "latlab_batcher_queue_capacity"


def batch_totals(metrics_text: str, deployment: str) -> tuple[float, float]:
    """(samples, batches) so far for one deployment, from the batch-size histogram's _sum and _count."""
    samples = batches = 0.0
    for family in text_string_to_metric_families(metrics_text):
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


def observer(host: str, timeout: float = 5.0) -> str:
    """Where the server answers /metrics, health and config on threads of their own (its observer port, from
    GET /v2's metrics_port), so a scrape never waits behind the load it measures; `host` itself for a server
    without one. Asked once per host, before any load: an unreachable server is asked again next time."""
    host = host.rstrip("/")
    if host not in _OBSERVERS:
        try:
            port = requests.get(f"{host}/v2", timeout=timeout).json().get("metrics_port")
        except (requests.RequestException, ValueError, AttributeError):
            return host
        parts = urlsplit(host)
        _OBSERVERS[host] = f"{parts.scheme}://{_host_name(parts.hostname or '')}:{port}" if port else host
    return _OBSERVERS[host]


def _host_name(name: str) -> str:
    return f"[{name}]" if ":" in name else name  # an IPv6 literal keeps its brackets in a URL


def fetch(host: str, path: str, timeout: float = 5.0, attempts: int = 3, pause_s: float = 1.0) -> requests.Response:
    """GET path from the server's observer, retrying connection failures (a restarting server) `attempts`
    times; then raise requests.ConnectionError with one readable line."""
    url = f"{observer(host)}{path}"
    for attempt in range(attempts):
        try:
            return requests.get(url, timeout=timeout)
        except requests.RequestException as exc:
            reason = _reason(exc)
        if attempt + 1 < attempts:
            time.sleep(pause_s)
    raise requests.ConnectionError(f"cannot reach the server at {url} ({attempts} tries): {reason}")


def describe(host: str, deployment: str) -> dict:
    """The deployment's settings as the server reports them, to label the curve."""
    response = fetch(host, f"/v2/models/{deployment}/config", timeout=10)
    if response.status_code != 200:
        raise LookupError(f"server at {host} has no deployment '{deployment}': {response.text.strip()[:200]}")
    return response.json()


def scrape_batches(host: str, deployment: str, timeout: float = 5.0) -> tuple[float, float] | None:
    """Batch totals so far, or None when /metrics cannot be read (the step's average is then unknown)."""
    try:
        response = fetch(host, "/metrics", timeout=timeout, attempts=2, pause_s=0.5)
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
        return {"queue_depth_max": max(self.depths, default=None), "queue_capacity": self.capacity,
                "queue_samples": len(self.depths)}


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
REQUESTS = "latlab_server_requests_total"
"""Infer requests answered, by outcome: `ok` and `rejected` counts per step (goodput under overload)."""
OUTCOMES = ("ok", "rejected")


def metric_sums(metrics_text: str, deployment: str) -> dict[str, float]:
    """Every _sum/_count of the server histograms for one deployment, the process's CPU seconds (unlabelled, when
    the server exports it), keyed by sample name, and its answered requests per outcome ("<name>:<outcome>")."""
    wanted = {name + suffix for name in SERVER_HISTOGRAMS.values() for suffix in ("_sum", "_count")}
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == PROCESS_CPU:
                found[PROCESS_CPU] = sample.value
            elif (sample.name == REQUESTS and sample.labels.get("deployment") == deployment
                  and sample.labels.get("outcome") in OUTCOMES):
                key = f"{REQUESTS}:{sample.labels['outcome']}"
                found[key] = found.get(key, 0.0) + sample.value
            elif sample.name in wanted and sample.labels.get("deployment") == deployment:
                found[sample.name] = found.get(sample.name, 0.0) + sample.value
    return found


def server_step(before: tuple[float, str] | None, after: tuple[float, str] | None, deployment: str,
                instances: int = 1) -> dict | None:
    """Mean seconds per request of each server histogram between two (monotonic time, /metrics text)
    snapshots, the process's CPU use in cores and the share of time the deployment's instances ran batches.
    None when a snapshot is missing; a histogram the server does not export (or that saw nothing) is absent."""
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
    cpu = delta(PROCESS_CPU)
    figures["process_cpu_cores"] = cpu / seconds if cpu is not None else None
    busy = delta(SERVER_HISTOGRAMS["compute"] + "_sum")  # batches run: the device's (or ORT's) busy time
    figures["busy_s"] = busy
    figures["busy_share"] = busy / (seconds * max(1, instances)) if busy is not None else None
    return figures


def snapshot(host: str, timeout: float = 5.0) -> tuple[float, str] | None:
    """(monotonic time, /metrics text) now, or None when /metrics cannot be read."""
    try:
        response = requests.get(f"{observer(host)}/metrics", timeout=timeout)
        response.raise_for_status()
    except requests.RequestException:
        return None
    return time.monotonic(), response.text
