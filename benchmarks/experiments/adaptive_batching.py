"""Adaptive vs fixed-delay batching, in process: DynamicBatcher over a real ORT session of the ffn.

    .venv/bin/python -m benchmarks.experiments.adaptive_batching [models/ffn/model.onnx] [--rate 1000] [--rounds 5]

Lone requests (one every ~10 ms: how long each waits) and open-loop Poisson arrivals at --rate (mean
batch size, median latency from the scheduled arrival); the cases run in interleaved rounds so a noisy
machine affects them alike.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import numpy as np
import onnxruntime as ort

from latlab.server.batching.batcher import DynamicBatcher
from latlab.server.config import BatcherSettings

CASES = (("adaptive (max 2 ms)", True, 2.0), ("fixed 2 ms", False, 2.0), ("fixed 0 ms", False, 0.0))


class BatchSizes:
    """A batch observer that keeps only the batch sizes."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def queue_depth(self, depth: int) -> None: ...
    def rejected(self, reason: str) -> None: ...

    def batch_done(self, size: int, queue_s, compute_s: float, ok: bool) -> None:
        self.sizes.append(size)


def model_runner(path: str) -> Callable[[dict], dict]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    width = session.get_inputs()[0].shape[1]
    run = lambda inputs: {"y": session.run(["y"], inputs)[0]}  # noqa: E731
    for n in (1, 2, 4, 8, 16, 32, 64):  # ORT's first run at a new batch size is slow
        run({"x": np.zeros((n, width), np.float32)})
    return run


def settings(adaptive: bool, delay_ms: float) -> BatcherSettings:
    return BatcherSettings(max_batch_size=64, max_queue_delay_ms=delay_ms, max_queue_size=100_000, adaptive=adaptive)


def lone_requests(run: Callable, x: np.ndarray, adaptive: bool, delay_ms: float, count: int = 100) -> float:
    """Median latency (ms) of requests sent one at a time, 10 ms apart."""
    batcher = DynamicBatcher(run, settings(adaptive, delay_ms))
    latencies = []
    for _ in range(count):
        started = time.perf_counter()
        batcher.infer({"x": x}, 1)
        latencies.append(time.perf_counter() - started)
        time.sleep(0.01)
    batcher.close()
    return statistics.median(latencies) * 1e3


def poisson_load(
    run: Callable, x: np.ndarray, adaptive: bool, delay_ms: float, rate: float, seconds: float = 2.0
) -> tuple[float, float]:
    """(mean batch size, median latency in ms from the scheduled arrival) under open-loop Poisson arrivals."""
    sizes = BatchSizes()
    batcher = DynamicBatcher(run, settings(adaptive, delay_ms), sizes)
    rng = np.random.default_rng(1)
    latencies: list[float] = []
    futures = []
    start = due = time.perf_counter()
    while due - start < seconds:
        due += rng.exponential(1 / rate)
        pause = due - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        future = batcher.submit({"x": x}, 1)
        future.add_done_callback(lambda _, due=due: latencies.append(time.perf_counter() - due))
        futures.append(future)
    for future in futures:
        future.result(30)
    batcher.close()
    return float(np.mean(sizes.sizes)), statistics.median(latencies) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="models/ffn/model.onnx")
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    run = model_runner(args.model)
    x = np.random.default_rng(0).standard_normal((1, 128)).astype(np.float32)
    lone = {name: [] for name, _, _ in CASES}
    loaded = {name: [] for name, _, _ in CASES}
    for _ in range(args.rounds):
        for name, adaptive, delay in CASES:
            lone[name].append(lone_requests(run, x, adaptive, delay))
            loaded[name].append(poisson_load(run, x, adaptive, delay, args.rate))
    print(f"{'case':22s} {'lone p50 ms':>12s} {'batch @rate':>12s} {'p50 ms @rate':>13s}   ({args.rate:g}/s Poisson)")
    for name, _, _ in CASES:
        batch = statistics.median(b for b, _ in loaded[name])
        latency = statistics.median(t for _, t in loaded[name])
        print(f"{name:22s} {statistics.median(lone[name]):12.3f} {batch:12.2f} {latency:13.2f}")


if __name__ == "__main__":
    main()
