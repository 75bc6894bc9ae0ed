"""What a lone request costs the interpreter: a no-op model through the in-process WSGI app (fast path,
batcher, ORT, metrics; no HTTP, no sockets), with batching off and with adaptive batching.

    .venv/bin/python benchmarks/request_path.py [--profile]
    PYTHONPATH=/tmp/old/pkg .venv/bin/python benchmarks/request_path.py   # the same for other code

Prints per mode the best per-call time of a hot loop and the median of calls made 7.7 ms apart (as at
~130 req/s, where an idle VM's caches go cold between requests). To compare two versions of the code, run
this once per version, alternating (a `git archive` of the other version laid out as the `latlab` package
and put first on PYTHONPATH). `--profile` adds cProfile's count of Python calls per request and the
share of the profiled time each part of the path takes. Last, how many garbage collections the calls set
off and what a full one costs here."""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import random
import sys
import tempfile
import time
import timeit
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import batching, build_cheap_model, write_config  # noqa: E402

from latlab.server.app import create_app  # noqa: E402
from latlab.server.config import load_config  # noqa: E402

GAP_S = 0.0077
# Where each function of the path belongs; the cumulative time of these roots is what the shares report.
PARTS = {"_decode": "body read and JSON decode", "validate": "input validation", "encode_response": "JSON encode",
         "batch_done": "metrics", "answered": "metrics", "queue_depth": "metrics", "inc": "metrics", "dec": "metrics",
         "run_timed": "ONNX Runtime call"}


def caller(app, name: str, body: bytes):
    def call() -> bytes:
        environ = {"REQUEST_METHOD": "POST", "PATH_INFO": f"/v2/models/{name}/infer",
                   "CONTENT_LENGTH": str(len(body)), "CONTENT_TYPE": "application/json",
                   "wsgi.input": io.BytesIO(body)}
        return b"".join(app.wsgi_app(environ, lambda status, headers: None))
    return call


def profile(call, n: int = 3000) -> str:
    profiler = cProfile.Profile()
    profiler.runcall(lambda: [call() for _ in range(n)])
    stats = pstats.Stats(profiler).stats
    calls = sum(nc for (_, _, _), (_, nc, _, _, _) in stats.items()) / n
    total = max(ct for (_, _, _), (_, _, _, ct, _) in stats.items())
    shares: dict[str, float] = {}
    cumulative_of = {(Path(f).name, fn): ct / total for (f, _, fn), (_, _, _, ct, _) in stats.items()}
    # The batcher's own work: its infer without the model run and the metrics it reports.
    shares["batcher"] = cumulative_of.get(("batcher.py", "infer"), 0.0) - sum(
        cumulative_of.get(key, 0.0) for key in (("runtime.py", "run_timed"), ("metrics.py", "batch_done"),
                                                ("metrics.py", "queue_depth")))
    for (filename, _, function), (_, _, _, cumulative, _) in stats.items():
        part = PARTS.get(function)
        if part == "metrics" and "metrics" not in filename:
            continue  # prometheus_client's own inc/dec are inside ours; count latlab's observer methods only
        if part:
            shares[part] = shares.get(part, 0.0) + cumulative / total
    listed = ", ".join(f"{part} {share:.0%}" for part, share in sorted(shares.items(), key=lambda kv: -kv[1]))
    return f"{calls:.0f} Python calls per request; of the profiled time: {listed}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp())
    noop = build_cheap_model(work / "noop" / "model.onnx", [128], reduce=False)
    deployments = {"b1": (noop, batching(1, 0.0)), "adaptive": (noop, batching(64, 2.0, adaptive=True))}
    app = create_app(load_config(write_config(work / "noop.toml", 1, deployments)))
    x = np.random.default_rng(0).standard_normal([1, 128]).astype(np.float32)
    body = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 128], "datatype": "FP32", "data": x.reshape(-1)}]},
                        option=orjson.OPT_SERIALIZE_NUMPY)
    collections = []
    gc.callbacks.append(lambda phase, info: collections.append(info["generation"]) if phase == "start" else None)
    for name in deployments:
        call = caller(app, name, body)
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
    calls = len(deployments) * (300 + 5 * 2000 + 600 + (3000 if args.profile else 0))
    during = sorted(collections)
    started = time.perf_counter()
    gc.collect()
    print(f"garbage collections during {calls} calls: {len(during)} (generations {during}); a full collection of this process's "
          f"{len(gc.get_objects())} objects takes {(time.perf_counter() - started) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
