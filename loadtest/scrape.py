"""Reads the server's /metrics to learn what its batcher did during a measurement window."""

from __future__ import annotations

import requests
from prometheus_client.parser import text_string_to_metric_families

BATCH_SIZE = "latlab_batcher_batch_size"


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


def average_batch(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    """Average batch size between two scrapes; None when no batch ran."""
    batches = after[1] - before[1]
    return (after[0] - before[0]) / batches if batches > 0 else None


def scrape_batches(host: str, deployment: str, timeout: float = 5.0) -> tuple[float, float]:
    response = requests.get(f"{host.rstrip('/')}/metrics", timeout=timeout)
    response.raise_for_status()
    return batch_totals(response.text, deployment)
