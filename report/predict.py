"""Predict a deployment's SLO-bounded max rate from bench batch timings and a dynamic-batcher queueing model."""

from __future__ import annotations

import math
from dataclasses import dataclass

from latlab.common.machine import key as machine_key
from latlab.common.machine import same as same_machine
from latlab.common.settings import BatcherSettings
from latlab.loadtest.results import Curve

# Printed in the report beside every prediction: what the numbers below take for granted.
ASSUMPTIONS = (
    "Batch time t(n) = a + b·n, fitted by least squares (relative errors) to the in-process bench of the same "
    "model name, backend and machine (the bench's model settings are shown beside each fit).",
    "Each request also costs c of serving work (HTTP, decoding, the batcher, encoding) that does not overlap the "
    "model run: one server process's interpreter lock, and the load generator, share the machine's cores. c is "
    "calibrated per machine on the batching-off deployment of the cheapest model: c = 1 / its highest achieved "
    "rate − t(1), i.e. the HTTP ceiling. A batch of n then takes t(n) + c·n.",
    "Poisson arrivals of one sample each; a batch holds max(1 + λ·D, λ·t(n)/k) requests, at most B "
    "(the oldest waits the queue delay D or until an instance frees up).",
    "The k instances act as one server k times as fast; the wait for an instance has Kingman's exponential "
    "tail with deterministic batch time: P(wait > x) = ρ·exp(-x·2k(1-ρ)/t(n)).",
    "p99 latency = the oldest request's fill wait min(D, (B-1)/λ) + the p99 wait for an instance + t(n); "
    "the predicted max rate is the highest λ whose p99 meets the SLO.",
)
BACKENDS = {"cpu": "ort-cpu", "cuda": "ort-cuda"}
"""The bench backend whose batch timings describe a server provider."""


class FitError(ValueError):
    """The bench points cannot determine a line (fewer than two batch sizes, or bad times)."""


@dataclass(frozen=True)
class BatchTimeFit:
    """Batch compute time t(n) = a + b·n, the fixed cost per run and the cost per sample."""

    a_s: float
    """Fixed cost of one model run (launch, transfer, framework overhead), seconds."""
    b_s: float
    """Added cost per sample in the batch, seconds (never negative)."""
    points: int
    """How many bench points the fit rests on."""
    max_batch: int
    """Largest batch size measured: beyond it the line is an extrapolation."""

    @classmethod
    def from_points(cls, points: list[tuple[float, float]]) -> BatchTimeFit:
        """Least squares over (batch size, seconds) pairs, weighted by 1/t² so that batch 1 counts as much as
        batch 1024 (relative errors); a negative slope (noise) becomes a flat line at the weighted mean."""
        points = [(float(n), float(t)) for n, t in points]
        if any(not (n >= 1 and t > 0 and math.isfinite(t)) for n, t in points):
            raise FitError("bench points need batch sizes >= 1 and positive, finite times")
        if len({n for n, _ in points}) < 2:
            raise FitError("a batch-time line needs at least two different batch sizes")
        weights = [1 / t**2 for _, t in points]
        total = sum(weights)
        mean_n = sum(w * n for w, (n, _) in zip(weights, points)) / total
        mean_t = sum(w * t for w, (_, t) in zip(weights, points)) / total
        slope = sum(w * (n - mean_n) * (t - mean_t) for w, (n, t) in zip(weights, points)) / sum(
            w * (n - mean_n) ** 2 for w, (n, _) in zip(weights, points)
        )
        largest = int(max(n for n, _ in points))
        if slope < 0:
            return cls(mean_t, 0.0, len(points), largest)
        return cls(max(mean_t - slope * mean_n, 0.0), slope, len(points), largest)

    def time_s(self, n: float) -> float:
        """Predicted compute time of one batch of n samples."""
        return self.a_s + self.b_s * n


def bench_fits(bench_docs: list[dict]) -> list[dict]:
    """Every (machine, model, backend) batch-size sweep in the bench files, fitted."""
    fits = []
    for doc in bench_docs:
        for experiment in doc.get("experiments", []):
            if experiment.get("vary") != "batch_size":
                continue
            by_backend: dict[str, list[tuple[float, float]]] = {}
            for point in experiment.get("points", []):
                if point.get("median_s") is not None and point.get("batch_size") is not None:
                    by_backend.setdefault(point["backend"], []).append((point["batch_size"], point["median_s"]))
            for backend, points in sorted(by_backend.items()):
                try:
                    fit = BatchTimeFit.from_points(points)
                except FitError:
                    continue
                fits.append(
                    {
                        "machine": doc.get("machine", {}),
                        "model": experiment.get("model"),
                        "backend": backend,
                        "fit": fit,
                        "fixed": experiment.get("fixed") or {},
                    }
                )
    return fits


def batch_size_at(rate: float, fit: BatchTimeFit, max_batch: int, delay_s: float, instances: int) -> float:
    """Mean batch size the batcher forms at `rate` requests/s, capped at max_batch.

    The least fixed point of n = max(1 + λ·D, λ·t(n)/k): requests that arrive while the oldest waits out
    the delay, or while the instances are busy with the batch before.
    """
    if rate * fit.b_s >= instances:  # each sample costs more than its share of time: batches fill up
        return float(max_batch)
    busy = rate * fit.a_s / (instances - rate * fit.b_s)
    return min(float(max_batch), max(1.0, 1.0 + rate * delay_s, busy))


def p99_latency_s(rate: float, fit: BatchTimeFit, max_batch: int, delay_s: float, instances: int) -> float:
    """Predicted p99 latency at `rate` requests/s; infinity when the deployment cannot keep up."""
    n = batch_size_at(rate, fit, max_batch, delay_s, instances)
    service = fit.time_s(n)
    utilisation = rate * service / (n * instances)
    if utilisation >= 1:
        return math.inf
    fill = min(delay_s, (max_batch - 1) / rate)
    wait = 0.0
    if utilisation > 0.01:  # P(wait > 0) = ρ: below 1% the p99 request does not wait at all
        wait = service / (2 * instances * (1 - utilisation)) * math.log(100 * utilisation)
    return fill + wait + service


def capacity_rps(fit: BatchTimeFit, max_batch: int, instances: int) -> float:
    """Throughput with every instance busy on full batches: the ceiling no SLO can lift."""
    return instances * max_batch / fit.time_s(max_batch)


def max_rate_under_slo(fit: BatchTimeFit, max_batch: int, delay_s: float, instances: int, slo_s: float) -> float:
    """Highest rate whose predicted p99 meets the SLO (0 when none does); scans, then bisects the edge."""
    ceiling = capacity_rps(fit, max_batch, instances)
    grid = [ceiling * 10 ** (-4 + 4 * i / 800) for i in range(800)]
    meets = [p99_latency_s(rate, fit, max_batch, delay_s, instances) <= slo_s for rate in grid]
    if not any(meets):
        return 0.0
    last = max(i for i, ok in enumerate(meets) if ok)
    low, high = grid[last], grid[last + 1] if last + 1 < len(grid) else ceiling
    for _ in range(50):
        middle = (low + high) / 2
        if p99_latency_s(middle, fit, max_batch, delay_s, instances) <= slo_s:
            low = middle
        else:
            high = middle
    return low


def request_overheads(curves: list[Curve], fits: list[dict]) -> dict[str, float]:
    """Per machine (machine.key), the serving work per request c, calibrated on the batching-off deployment
    whose model is cheapest (where c dominates): c = 1 / highest achieved rate - t(1), at least 0."""
    cheapest: dict[str, tuple[float, float]] = {}
    for curve in curves:
        fit = matching_fit(curve, fits)
        top = max((s.achieved_rps or 0.0 for s in curve.steps), default=0.0)
        if fit is None or top <= 0 or int((curve.batcher or BatcherSettings()).max_batch_size) != 1:
            continue
        host = machine_key(curve.machine or {})
        compute = fit["fit"].time_s(1)
        if host not in cheapest or compute < cheapest[host][0]:
            cheapest[host] = (compute, max(1.0 / top - compute, 0.0))
    return {host: overhead for host, (_, overhead) in cheapest.items()}


def predict_deployment(curve: Curve, fits: list[dict], slo_s: float, overhead_s: float = 0.0) -> dict | None:
    """Prediction for one measured deployment from the bench fit of its model and backend on its machine,
    with `overhead_s` of serving work per request added to every sample of a batch."""
    fit = matching_fit(curve, fits)
    if fit is None:
        return None
    if overhead_s > 0:
        bench = fit["fit"]
        fit = {**fit, "fit": BatchTimeFit(bench.a_s, bench.b_s + overhead_s, bench.points, bench.max_batch)}
    batcher = curve.batcher or BatcherSettings()  # what the record does not say: the server's defaults
    max_batch = int(batcher.max_batch_size)
    delay_s = float(batcher.max_queue_delay_ms) / 1e3
    instances = int(batcher.instances)
    rate = max_rate_under_slo(fit["fit"], max_batch, delay_s, instances, slo_s)
    batch = batch_size_at(rate, fit["fit"], max_batch, delay_s, instances) if rate > 0 else 0.0
    return {
        "rate": rate,
        "batch": batch,
        "fit": fit["fit"],
        "backend": fit["backend"],
        "fixed": fit.get("fixed"),
        "bench_threads": fit["machine"].get("threads"),
        "overhead_s": overhead_s,
    }


def matching_fit(curve: Curve, fits: list[dict]) -> dict | None:
    """The fit of the curve's model and provider from the same machine (machine.key, else CPU model)."""
    backend = BACKENDS.get(str(curve.provider or "").lower())
    machine = curve.machine or {}
    for fit in fits:
        if fit["model"] != curve.model or fit["backend"] != backend:
            continue
        same_host = same_machine(fit["machine"], machine)
        same_cpu = not fit["machine"].get("hostname") and fit["machine"].get("cpu") == machine.get("cpu")
        if same_host or same_cpu:
            return fit
    return None
