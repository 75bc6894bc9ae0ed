"""Where a batch-1 request's time goes: in-process ORT vs the batcher vs the HTTP server, one run.

    .venv/bin/python -m benchmarks.experiments.server_overhead [models/ffn/model.onnx]

One sequential keep-alive client (no queueing), so the differences are pure overhead per layer. The
batcher's rows are also taken 2 ms apart, where threads sleep between requests as they do at low load.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson
import requests

from latlab.common import procs
from latlab.server.batching.batcher import DynamicBatcher
from latlab.server.command import serve_command
from latlab.server.config import load_config, save_config
from latlab.server.runtime.model import OnnxModel

N = 2000


def p50(fn) -> float:
    for _ in range(200):
        fn()
    times = []
    for _ in range(N):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def paced(fn, gap_s: float = 0.002, n: int = 500) -> float:
    """p50 of calls made `gap_s` apart: between them every thread sleeps, as at low load."""
    times = []
    for _ in range(n):
        time.sleep(gap_s)
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def main(model: Path) -> None:
    work = Path(tempfile.mkdtemp())
    port = procs.free_port()
    config_path = save_config(
        {
            "server": {"port": port},
            "deployments": [
                {"name": "m", "model_path": model.resolve(), "cpu": {"intra_op_threads": 1, "allow_spinning": False}}
            ],
        },
        work / "overhead.toml",
    )
    deployment = load_config(config_path).deployments[0]
    onnx_model = OnnxModel(deployment)
    spec = onnx_model.inputs[0]
    x = np.random.default_rng(0).standard_normal([1, *spec.shape[1:]]).astype(spec.dtype)
    batcher = DynamicBatcher(onnx_model.run, deployment.batcher)
    rows = [
        ("ORT session.run, in process", p50(lambda: onnx_model.run({spec.name: x}))),
        ("batcher.infer (a lone request runs on its caller)", p50(lambda: batcher.infer({spec.name: x}, 1))),
        ("batcher.submit + result (a worker runs it)", p50(lambda: batcher.submit({spec.name: x}, 1).result())),
        ("  2 ms apart: ORT session.run", paced(lambda: onnx_model.run({spec.name: x}))),
        ("  2 ms apart: batcher.infer (on the caller)", paced(lambda: batcher.infer({spec.name: x}, 1))),
        ("  2 ms apart: batcher.submit + result (worker)", paced(lambda: batcher.submit({spec.name: x}, 1).result())),
    ]
    batcher.close()
    body = orjson.dumps(
        {"inputs": [{"name": spec.name, "shape": list(x.shape), "datatype": spec.datatype, "data": x.reshape(-1)}]},
        option=orjson.OPT_SERIALIZE_NUMPY,
    )
    server = procs.start(serve_command(config_path), log_path=work / "server.log")
    try:
        host = f"http://127.0.0.1:{port}"
        procs.wait_ready(f"{host}/v2/health/ready", server)
        session = requests.Session()
        rows.append(("HTTP no-op route (client + server)", p50(lambda: session.get(f"{host}/v2/health/live"))))
        rows.append(("HTTP infer, end to end", p50(lambda: session.post(f"{host}/v2/models/m/infer", data=body))))
    finally:
        procs.stop(server)
    base = rows[0][1]
    print(f"{model}: batch 1, p50 of {N} sequential calls")
    for name, seconds in rows:
        print(f"  {name:<50} {seconds * 1e3:7.3f} ms  ({seconds / base:5.1f}x ORT)")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "models/ffn/model.onnx"))
