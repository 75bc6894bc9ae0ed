"""latlab's server, MLServer and Triton serving one ONNX file, swept by the same `latlab loadtest`, in one sitting.

    .venv/bin/python benchmarks/other_servers.py --triton-python /tmp/tritonvenv/bin/python \
        [--model models/ffn/model.onnx] [--out docs/other-servers/runs] [--servers latlab,mlserver,triton]

Each server in turn, alone on the machine with the load generator: started on free ports of 127.0.0.1, waited for
until ready, swept with docs/other-servers.md's command (`--rates 100,300,1000 --max-rate 4000 --step-seconds 3
--warmup-seconds 1`, `--provider cpu` where the server does not say, Triton's metrics read with `--server-metrics`)
plus `--slos` brackets, then stopped. Every server runs the model on ONNX Runtime's CPU provider with one intra-op
thread, batching <= 64 with a 2 ms wait. The raw results stay in `--out/<server>/` (commit them beside the figures),
and the merged report's answer is printed with a table of each server's rate per SLO.

Triton is the real C++ `tritonserver` bundled in the `nvidia-pytriton` wheel, with its Python backend: it needs
numpy < 2, so it runs from a virtual environment of its own (`--triton-python`; docs/other-servers.md says how to
make it). On Python 3.11 builds whose backend stub embeds an older 3.11, the stub cannot start
(`'_thread.RLock' object has no attribute '_recursion_count'`); `--patch-pytriton` applies docs/other-servers.md's
two-line fix to that environment's `pytriton/proxy/model.py` (once; it says so)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import onnx
import requests

from latlab.common import procs
from latlab.loadtest.results import read_results
from latlab.report.rates import max_rate_under

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "latlab.cli"]
SWEEP = ["--rates", "100,300,1000", "--max-rate", "4000", "--step-seconds", "3", "--warmup-seconds", "1"]
SLOS = (0.010, 0.025, 0.050, 0.100)
START_S = 120.0
MLSERVER_RUNTIME = Path(__file__).with_name("mlserver_runtime.py")
"""MLServer's runtime for an ONNX file, copied into each model folder as runtime.py."""
TRITON_SERVER = """\
import sys

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

model, name, x, y, width_in, width_out, http, grpc, metrics = sys.argv[1:]
options = ort.SessionOptions()
options.intra_op_num_threads = 1
session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


@batch
def infer(**inputs):
    return {y: session.run(None, {x: inputs[x]})[0]}


config = TritonConfig(http_address="127.0.0.1", http_port=int(http), grpc_address="127.0.0.1",
                      grpc_port=int(grpc), metrics_port=int(metrics))
with Triton(config=config) as triton:
    triton.bind(model_name=name, infer_func=infer,
                inputs=[Tensor(name=x, dtype=np.float32, shape=(int(width_in),))],
                outputs=[Tensor(name=y, dtype=np.float32, shape=(int(width_out),))],
                config=ModelConfig(max_batch_size=64, batcher=DynamicBatcher(max_queue_delay_microseconds=2000)))
    triton.serve()
"""
PYTRITON_FIX = """
from multiprocessing import resource_tracker as _resource_tracker
import threading as _threading

if not hasattr(_resource_tracker._resource_tracker._lock, "_recursion_count"):
    _resource_tracker._resource_tracker._lock = _threading._PyRLock()
"""


def io_of(model: Path) -> tuple[str, str, int, int]:
    """The model's one input and one output name and their widths (a [batch, width] FP32 model, as ffn and mlp)."""
    graph = onnx.load(str(model), load_external_data=False).graph
    (x,), (y,) = graph.input, graph.output
    width = [d.dim_value for d in x.type.tensor_type.shape.dim][-1]
    width_out = [d.dim_value for d in y.type.tensor_type.shape.dim][-1]
    return x.name, y.name, width, width_out


def start(command: list[str], folder: Path, ready: str, env: dict | None = None) -> subprocess.Popen:
    """A server process (a session of its own, its output in folder/server.log), once `ready` answers 200."""
    log = folder / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, cwd=folder, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{command[0]} exited ({process.returncode}): see {log}")
        try:
            if requests.get(ready, timeout=2).status_code == 200:
                return process
        except requests.RequestException:
            pass
        time.sleep(0.5)
    procs.stop(process)
    raise SystemExit(f"{ready} not ready after {START_S:.0f} s: see {log}")


def latlab_server(folder: Path, model: Path, name: str) -> tuple[subprocess.Popen, str, list[str]]:
    port, observer = procs.free_port(), procs.free_port()
    config = folder / "latlab.toml"
    config.write_text(
        f'[server]\nhost = "127.0.0.1"\nport = {port}\nmetrics_port = {observer}\n'
        f'[[deployments]]\nname = "{name}"\nmodel_path = "{model}"\nprovider = "cpu"\n'
        "[deployments.cpu]\nintra_op_threads = 1\n"
        "[deployments.batcher]\nmax_batch_size = 64\nmax_queue_delay_ms = 2\n"
    )
    host = f"http://127.0.0.1:{port}"
    return start([*CLI, "serve", "--config", str(config)], folder, f"{host}/v2/health/ready"), host, []


def mlserver(folder: Path, model: Path, name: str) -> tuple[subprocess.Popen, str, list[str]]:
    x, y, width, width_out = io_of(model)
    http, grpc, metrics = (procs.free_port() for _ in range(3))
    (folder / "runtime.py").write_text(MLSERVER_RUNTIME.read_text())
    settings = {"host": "127.0.0.1", "http_port": http, "grpc_port": grpc, "metrics_port": metrics}
    (folder / "settings.json").write_text(json.dumps({**settings, "parallel_workers": 0}))
    model_settings = {
        "name": name,
        "implementation": "runtime.OnnxModel",
        "parameters": {"uri": str(model)},
        "max_batch_size": 64,
        "max_batch_time": 0.002,
        "inputs": [{"name": x, "datatype": "FP32", "shape": [-1, width]}],
        "outputs": [{"name": y, "datatype": "FP32", "shape": [-1, width_out]}],
    }
    (folder / "model-settings.json").write_text(json.dumps(model_settings))
    script = str(Path(sys.executable).parent / "mlserver")
    env = {**os.environ, "PYTHONPATH": str(folder)}
    host = f"http://127.0.0.1:{http}"
    process = start([script, "start", str(folder)], folder, f"{host}/v2/models/{name}/ready", env)
    return process, host, ["--provider", "cpu"]


def triton(folder: Path, model: Path, name: str, python: str) -> tuple[subprocess.Popen, str, list[str]]:
    x, y, width, width_out = io_of(model)
    http, grpc, metrics = (procs.free_port() for _ in range(3))
    (folder / "serve_triton.py").write_text(TRITON_SERVER)
    command = [python, "serve_triton.py", str(model), name, x, y, str(width), str(width_out)]
    command += [str(http), str(grpc), str(metrics)]
    host = f"http://127.0.0.1:{http}"
    extra = ["--provider", "cpu", "--server-metrics", f"http://127.0.0.1:{metrics}/metrics"]
    return start(command, folder, f"{host}/v2/models/{name}/ready"), host, extra


def patch_pytriton(python: str) -> None:
    found = subprocess.run(
        [python, "-c", "import importlib.util as u; print(u.find_spec('pytriton').submodule_search_locations[0])"],
        capture_output=True,
        text=True,
        check=True,
    )
    target = Path(found.stdout.strip()) / "proxy" / "model.py"
    text = target.read_text()
    if "_recursion_count" not in text:
        target.write_text(PYTRITON_FIX + text)
        print(f"patched {target} (docs/other-servers.md's resource-tracker lock fix)")


def sweep(server: str, host: str, extra: list[str], name: str, out: Path, slos: str, rates: list[str]) -> None:
    command = [*CLI, "loadtest", "--host", host, "--deployment", name, *rates, *extra, "--out", str(out)]
    command += ["--slos", slos] if slos else []
    began = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True)
    (out / "loadtest.log").write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        raise SystemExit(f"{server}: latlab loadtest failed: {(result.stdout + result.stderr)[-1500:]}")
    print(f"{server}: swept in {time.monotonic() - began:.0f} s")


def table(out: Path, servers: list[str]) -> str:
    head = "| server | p50 / p99 at ~100 req/s | " + " | ".join(f"p99 ≤ {s * 1e3:g} ms" for s in SLOS)
    rows = [head + " | saturated at (achieved) |", "|---" * (len(SLOS) + 3) + "|"]
    for server in servers:
        (run,) = read_results(out / server / "results.json")
        (curve,) = run.deployments
        low = min(curve.steps, key=lambda s: abs(s.target - 100))
        met = [max_rate_under(curve.steps, slo) for slo in SLOS]
        cells = [f"{m.achieved_rps:.0f}" if m else "not met" for m in met]
        top = max(curve.steps, key=lambda s: s.achieved_rps)
        lone = f"{low.p50_s * 1e3:.1f} / {low.p99_s * 1e3:.1f} ms"
        rows.append(f"| {server} | {lone} | " + " | ".join(cells) + f" | {top.achieved_rps:.0f} of {top.target:.0f} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "ffn" / "model.onnx")
    parser.add_argument("--name", default="ffn")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "other-servers" / "runs")
    parser.add_argument("--servers", default="latlab,mlserver,triton")
    parser.add_argument("--triton-python", default="", help="the Python of a venv with nvidia-pytriton, numpy<2")
    parser.add_argument("--patch-pytriton", action="store_true")
    parser.add_argument("--slos", default="10ms,25ms,50ms,100ms", help="'' for the plain sweep")
    parser.add_argument("--sweep", default=" ".join(SWEEP), help="the load test's rate options (a smoke test: fewer)")
    args = parser.parse_args()
    servers = args.servers.split(",")
    if "triton" in servers and not args.triton_python:
        parser.error("--triton-python is needed for triton")
    if args.patch_pytriton:
        patch_pytriton(args.triton_python)
    model, args.out = args.model.resolve(), args.out.resolve()  # each server starts in its own folder
    for server in servers:
        folder = args.out / server
        folder.mkdir(parents=True, exist_ok=True)
        if server == "triton":
            process, host, extra = triton(folder, model, args.name, args.triton_python)
        else:
            process, host, extra = {"latlab": latlab_server, "mlserver": mlserver}[server](folder, model, args.name)
        try:
            sweep(server, host, extra, args.name, folder, args.slos, args.sweep.split())
        finally:
            procs.stop(process)
    print(table(args.out, servers))
    report = subprocess.run(
        [*CLI, "report", *(str(args.out / s) for s in servers), "--slo", "10ms,25ms,50ms,100ms"]
        + ["--out", str(args.out / "merged")],
        capture_output=True,
        text=True,
    )
    print(report.stdout[-3000:] or report.stderr[-3000:])


if __name__ == "__main__":
    main()
