"""CPU time of each stage of a batched request, timed alone in this process: what benchmarks/server_cpu.py's total
per request is made of, apart from the HTTP server and the thread hand-overs (perf and py-spy see those).

    .venv/bin/python benchmarks/request_stages.py [--batch 16] [--n 20000] [--multiprocess]

A no-op model with mlp's input (x: [n, 4] FP32, Identity), batching on, one ORT thread. Per request: JSON decode
and validation, the request's metric writes, a Slot answered and read on one thread, JSON encode; per batch (divided
by --batch): merge, the ORT run, split and the batch's metric writes. One hand-over: a thread woken by a lock another
thread releases, and back. --multiprocess: the metrics write prometheus_client's file-backed values, as every process
of a multi-front-end server does.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

from harness import build_cheap_model, json_infer_body, write_config

from latlab.server.batching.batch_queue import Slot
from latlab.server.batching.tensors import merge, split
from latlab.server.protocol import decode_request, encode_response


def cpu_us(call: Callable[[], object], n: int) -> float:
    """CPU µs per call of `call`, best of three runs of n."""
    best = float("inf")
    for _ in range(3):
        started = time.thread_time()
        for _ in range(n):
            call()
        best = min(best, (time.thread_time() - started) / n * 1e6)
    return best


def handover_us(n: int) -> float:
    """CPU µs (both threads) of one wake-up of a thread blocked on a lock, and back."""
    ping, pong = threading.Lock(), threading.Lock()
    ping.acquire()
    pong.acquire()

    def other() -> None:
        for _ in range(n):
            ping.acquire()
            pong.release()

    thread = threading.Thread(target=other)
    started = time.process_time()
    thread.start()
    for _ in range(n):
        ping.release()
        pong.acquire()
    thread.join()
    return (time.process_time() - started) / n / 2 * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--multiprocess", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        if args.multiprocess:
            from latlab.server.metrics import use_multiprocess_values

            use_multiprocess_values(scratch)
        from latlab.server.http.app import create_app  # after the value class is chosen: metrics made here use it

        model = build_cheap_model(Path(scratch) / "mlp.onnx", [4], reduce=False)
        config = write_config(Path(scratch) / "c.toml", 18999, {"mlp": (model, {"max_batch_size": 64})})
        from latlab.server.config import served_config

        app = create_app(served_config(config))
        deployment = app.extensions["latlab"].get("mlp")
        body = json_infer_body(np.ones((1, 4), dtype=np.float32))
        request = decode_request(body)
        inputs = [dict(request.inputs) for _ in range(args.batch)]
        merged = merge(inputs)
        outputs = deployment._run_batch(merged)
        parts = split(outputs, [1] * args.batch, [0] * args.batch)
        metrics = deployment.metrics
        n, b = args.n, args.batch

        def request_metrics() -> None:
            metrics.inflight.inc()
            metrics.queue_depth(3)
            metrics.queue_depth(2)
            metrics.inflight.dec()
            metrics.answered("ok", 0.0021)

        def slot() -> None:
            done = Slot()
            done.set_running_or_notify_cancel()
            done.set_result(parts[0])
            done.result(1.0)

        stages = {
            "JSON decode (decode_request)": cpu_us(lambda: decode_request(body), n),
            "validation (Deployment.queued)": cpu_us(
                lambda: deployment.queued(request.inputs, None, request.parameters, request.finite), n
            ),
            "metric writes per request": cpu_us(request_metrics, n),
            "Slot answered and read (no wake-up)": cpu_us(slot, n),
            "merge (per request)": cpu_us(lambda: merge(inputs), n // b) / b,
            "ORT run (per request)": cpu_us(lambda: deployment.model.run_timed(merged, None), n // b) / b,
            "split (per request)": cpu_us(lambda: split(outputs, [1] * b, [0] * b), n // b) / b,
            "metric writes per batch (per request)": cpu_us(
                lambda: (metrics.batch_done(b, [0.001] * b, 0.0002, True), metrics.rows_run(b, b)), n // b
            )
            / b,
            "JSON encode (encode_response)": cpu_us(lambda: encode_response("mlp", "1", request, parts[0]), n),
            "one thread hand-over (wake-up and back, per wake)": handover_us(n),
        }
        app.extensions["latlab"].close()
    mode = "multiprocess" if args.multiprocess else "one process"
    print(f"stage CPU µs ({mode} metrics, batch {b})")
    for name, us in stages.items():
        print(f"  {name:52s} {us:7.2f}")


if __name__ == "__main__":
    main()
