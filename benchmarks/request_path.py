"""What a lone request costs the interpreter: a no-op model through the in-process WSGI app (fast path,
batcher, ORT, metrics; no HTTP, no sockets), with batching off and with adaptive batching.

    .venv/bin/python benchmarks/request_path.py [--profile] [--instructions [--ablate]]
    PYTHONPATH=/tmp/old/pkg .venv/bin/python benchmarks/request_path.py   # the same for other code

Prints per mode the best per-call time of a hot loop and the median of calls made 7.7 ms apart (as at
~130 req/s, where an idle machine's caches go cold between requests). To compare two versions of the code, run
this once per version, alternating (a `git archive` of the other version laid out as the `latlab` package
and put first on PYTHONPATH). `--profile` adds cProfile's count of Python calls per request and the
share of the profiled time each part of the path takes; `--instructions` the CPU instructions a request
executes (`perf stat`), the steadiest figure on a shared machine whose speed drifts, and `--ablate` what each part
of the path adds to it (the count with that part stubbed out). Last, how many garbage
collections the calls set off and what a full one costs here."""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import random
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

import numpy as np

from harness import batching, build_cheap_model, in_process_infer, json_infer_body, write_config

from latlab.server.http import fastpath
from latlab.server.http.app import create_app
from latlab.server.config import load_config
from latlab.server.protocol import decode_request

GAP_S = 0.0077
# Where the path's time goes: (file, function) roots whose cumulative time each part reports.
PARTS = {
    ("fastpath.py", "_decode"): "body read and JSON decode",
    ("runtime.py", "validate"): "input validation",
    ("protocol.py", "encode_response"): "JSON encode",
    ("metrics.py", "batch_done"): "metrics",
    ("metrics.py", "answered"): "metrics",
    ("metrics.py", "queue_depth"): "metrics",
    ("runtime.py", "run_timed"): "ONNX Runtime call",
}
# Inside the batcher's infer, the parts above that are not its own work.
NOT_BATCHER = [("runtime.py", "run_timed"), ("metrics.py", "batch_done"), ("metrics.py", "queue_depth")]


def profile(call, n: int = 3000) -> str:
    profiler = cProfile.Profile()
    profiler.runcall(lambda: [call() for _ in range(n)])
    stats = pstats.Stats(profiler).stats
    calls = sum(nc for _, nc, _, _, _ in stats.values()) / n
    total = max(ct for _, _, _, ct, _ in stats.values())
    share = {(Path(f).name, fn): ct / total for (f, _, fn), (_, _, _, ct, _) in stats.items()}
    shares: dict[str, float] = {}
    for key, part in PARTS.items():
        shares[part] = shares.get(part, 0.0) + share.get(key, 0.0)
    # The in-flight gauge, moved by the route itself: prometheus_client's inc/dec called from fastpath.py.
    shares["metrics"] += sum(
        ct / total
        for (f, _, fn), (_, _, _, _, callers) in stats.items()
        if fn in ("inc", "dec") and "prometheus_client" in f
        for (caller, _, _), (_, _, _, ct) in callers.items()
        if Path(caller).name == "fastpath.py"
    )
    shares["batcher"] = share.get(("batcher.py", "infer"), 0.0) - sum(share.get(key, 0.0) for key in NOT_BATCHER)
    listed = ", ".join(f"{part} {value:.0%}" for part, value in sorted(shares.items(), key=lambda kv: -kv[1]))
    return f"{calls:.0f} Python calls per request; of the profiled time: {listed}"


def instructions_per_request(mode: str, stub: str = "", short: int = 2000, long: int = 12000) -> float:
    """CPU instructions one request executes, counted by `perf stat` over two runs of this script that differ
    only in how many calls they make (--calls), so start-up cancels out. Unlike time, the count barely
    moves with the machine's speed (~1% run to run), which makes it the figure to compare two versions by.
    `stub` names a part of the path (STUBS) replaced by a stand-in, so the difference is that part's cost."""
    counts = []
    for calls in (short, long):
        done = subprocess.run(
            [
                "perf",
                "stat",
                "-x,",
                "-e",
                "instructions",
                sys.executable,
                __file__,
                "--calls",
                f"{mode}={calls}",
                *(["--stub", stub] if stub else []),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        line = next(row for row in done.stderr.splitlines() if ",instructions" in row)
        counts.append(int(line.split(",")[0]))
    return (counts[1] - counts[0]) / (long - short)


def stub_out(part: str, app, mode: str, body: bytes) -> None:
    """Replace one part of the path with a stand-in that hands on what the real part would have produced."""
    deployment = app.extensions["latlab"].get(mode, None)
    request = decode_request(body)
    if part == "decode":  # the body read and JSON decode: the decoded request, ready

        def decoded(route, environ, _deployment):
            environ[fastpath._BODY_READ] = True
            return request

        fastpath.InferRoute._decode = decoded
    elif part == "batcher":  # queueing, the slot, the batch's metrics: the model called directly
        deployment.batcher.infer = lambda inputs, size, *rest: deployment.model.run(inputs)
    elif part == "ort":  # the ORT call: its outputs, computed once
        outputs = deployment.model.session.run(None, request.inputs)
        deployment.model.session.run = lambda names, feeds: outputs
    elif part == "encode":  # the response's JSON: a fixed body
        answer = fastpath.encode_response(mode, "1", request, deployment.model.run(request.inputs))
        fastpath.encode_response = lambda *args: answer
    elif part == "metrics":  # every Prometheus update of the path
        idle = NoMetrics()
        deployment.metrics = deployment.batcher._metrics = idle
    else:
        raise SystemExit(f"unknown part {part!r}; one of {', '.join(STUBS)}")


STUBS = ("decode", "batcher", "ort", "encode", "metrics")


class NoMetrics:
    """Stands in for a deployment's observer and each metric child it hands out: every call does nothing."""

    def __getattr__(self, name: str) -> "NoMetrics":
        return self

    def __call__(self, *args, **kwargs) -> None:
        return None


def served_app(work: Path) -> tuple:
    """The app with a no-op model deployed with batching off ("b1") and adaptive, and a JSON request body."""
    noop = build_cheap_model(work / "noop" / "model.onnx", [128], reduce=False)
    deployments = {"b1": (noop, batching(1, 0.0)), "adaptive": (noop, batching(64, 2.0, adaptive=True))}
    app = create_app(load_config(write_config(work / "noop.toml", 1, deployments)))
    body = json_infer_body(np.random.default_rng(0).standard_normal([1, 128]).astype(np.float32))
    for name in deployments:
        app.extensions["latlab"].get(name, None).wait_ready(60)
    return app, list(deployments), body


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="also count instructions per request with `perf stat` (Linux perf must be installed)",
    )
    parser.add_argument(
        "--ablate",
        action="store_true",
        help="with --instructions: the count again with each part of the path stubbed out",
    )
    parser.add_argument("--calls", help=argparse.SUPPRESS)  # MODE=N: make N calls and exit (for --instructions)
    parser.add_argument("--stub", help=argparse.SUPPRESS)  # with --calls: the part replaced by a stand-in
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp())
    app, deployments, body = served_app(work)
    if args.calls:
        mode, count = args.calls.split("=")
        if args.stub:
            stub_out(args.stub, app, mode, body)
        infer = in_process_infer(app, mode, body)
        for _ in range(500 + int(count)):
            infer()
        return
    collections, calls = [], 0
    gc.callbacks.append(lambda phase, info: collections.append(info["generation"]) if phase == "start" else None)
    for name in deployments:
        infer = in_process_infer(app, name, body)

        def call() -> None:
            nonlocal calls
            calls += 1
            infer()

        for _ in range(300):
            call()
        hot = min(timeit.repeat(call, number=2000, repeat=5)) / 2000
        times = []
        for _ in range(600):
            time.sleep(random.expovariate(1 / GAP_S))
            started = time.perf_counter()
            call()
            times.append(time.perf_counter() - started)
        print(f"{name:<9} hot loop {hot * 1e6:5.0f} us   {GAP_S * 1e3:.1f} ms apart {np.median(times) * 1e6:5.0f} us")
        if args.profile:
            print(f"          {profile(call)}")
        if args.instructions:
            whole = instructions_per_request(name)
            print(f"          {whole / 1e3:.0f} k instructions per request (perf stat)")
            if args.ablate:
                parts = {part: whole - instructions_per_request(name, part) for part in STUBS}
                print("          of which " + ", ".join(f"{part} {n / 1e3:.0f} k" for part, n in parts.items()))
    during = sorted(collections)
    started = time.perf_counter()
    gc.collect()
    print(
        f"garbage collections during {calls} calls: {len(during)} (generations {during}); a full collection "
        f"of this process's {len(gc.get_objects())} objects takes {(time.perf_counter() - started) * 1e3:.1f} ms"
    )


if __name__ == "__main__":
    main()
