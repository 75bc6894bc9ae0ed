"""Reads the server's /config and /metrics: its deployment's settings, what its batcher did during a
measurement window and how full its queue got. A server restarting must not crash the load test:
requests are retried briefly, then fail with one readable line (or give None where a figure can be missing)."""

from __future__ import annotations

import time

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


def fetch(host: str, path: str, timeout: float = 5.0, attempts: int = 3, pause_s: float = 1.0) -> requests.Response:
    """GET host+path, retrying connection failures (a restarting server) `attempts` times; then raise
    requests.ConnectionError with one readable line."""
    url = f"{host.rstrip('/')}{path}"
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
        response = requests.get(f"{host.rstrip('/')}/metrics", timeout=timeout)
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
