"""What handing a lone request to a batcher worker costs: the in-process app (fast path, batcher, ORT) with
the lone request run on its caller's thread, against the same app sending it through a worker, alternating.

    .venv/bin/python benchmarks/batcher_handover.py [--rounds 2] [--requests 3000]

A no-op model (Identity on [N, 128]) and batching off, sequential calls through the WSGI app in process (no
HTTP, no sockets), so the difference is the hand-over: a worker's wake-up and the caller's wake-up back."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from harness import batching, build_cheap_model, in_process_infer, json_infer_body, write_config

from latlab.server.http.app import create_app
from latlab.server.batching.batcher import DynamicBatcher
from latlab.server.config import load_config


def via_worker(self: DynamicBatcher, inputs, size, timeout_s=None, priority=0, outputs=None):
    """DynamicBatcher.infer as it was: always through a worker thread."""
    return self.submit(inputs, size, timeout_s, priority, outputs).result(30.0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp())
    model = build_cheap_model(work / "noop" / "model.onnx", [128], reduce=False)
    app = create_app(load_config(write_config(work / "noop.toml", 1, {"noop": (model, batching(1, 0.0))})))
    app.extensions["latlab"].get("noop", None).wait_ready(60)
    call = in_process_infer(app, "noop", json_infer_body(np.random.default_rng(0).random((1, 128), dtype=np.float32)))

    direct = DynamicBatcher.infer
    results: dict[str, list[float]] = {"on the caller": [], "through a worker": []}
    for _ in range(args.rounds):
        for label, infer in (("on the caller", direct), ("through a worker", via_worker)):
            DynamicBatcher.infer = infer
            for _ in range(300):
                call()
            started = time.perf_counter()
            for _ in range(args.requests):
                call()
            results[label].append((time.perf_counter() - started) / args.requests)
    DynamicBatcher.infer = direct
    for label, times in results.items():
        print(f"{label:<18} " + ", ".join(f"{t * 1e6:.0f}" for t in times) + " us per request")
    caller, worker = (min(times) for times in results.values())
    print(f"best of {args.rounds}: on the caller / through a worker = {caller / worker:.2f}")


if __name__ == "__main__":
    main()
