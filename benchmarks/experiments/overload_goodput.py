"""Goodput under overload: how much of its capacity a server still serves while refusing the excess.

One deployment of ~10 ms a run, batching off, one ORT thread. Per round and per variant: the capacity (wrk,
CAPACITY_CONNECTIONS connections, fewer than the deployment admits, so nothing is refused and the model never
waits for a request), then the storm (wrk, --connections far more than it admits, each sending again as soon as
answered: a client that ignores Retry-After). Goodput = 200s per second during the storm / capacity. The CPU
seconds of the server's worker and of wrk are read from /proc around each phase, to say where the cores went.
Variants alternate within a round so that both see the same phase of a drifting VM.

    .venv/bin/python -m benchmarks.experiments.overload_goodput [--variant NAME:ENV=VALUE,...] [--rounds 3]
                                                                [--out f.json]

(from the repository root, which puts it on sys.path: the test suite's slow model comes from tests/).
Needs wrk (Debian: `apt-get install wrk`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

from latlab.common import procs
from latlab.server.command import serve_command
from latlab.server.config import save_config
from tests.reliability.crowd import BODY, INFER
from tests.reliability.test_overload import build_slow_model, worker_of

WRK_SCRIPT = (
    'wrk.method = "POST"\nwrk.body = \'{body}\'\nwrk.headers["Content-Type"] = "application/json"\n'
    "done = function(summary, latency, requests)\n"
    '  io.write(string.format("statuses %d %d\\n", summary.requests, summary.errors.status))\nend\n'
)
CAPACITY_CONNECTIONS = 4
QUEUE_BOUND = 64


def write_config(path: Path, model: Path, port: int) -> Path:
    return save_config(
        {
            "server": {"port": port},
            "deployments": [
                {
                    "name": "slow",
                    "model_path": model,
                    "cpu": {"intra_op_threads": 1, "allow_spinning": False},
                    "batcher": {"max_batch_size": 1, "max_queue_size": QUEUE_BOUND},
                }
            ],
        },
        path,
    )


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def wrk(url: str, lua: Path, connections: int, seconds: float) -> tuple[int, int, float, float]:
    """(requests answered, of them non-2xx, seconds, wrk's own CPU seconds)."""
    started = time.monotonic()
    process = psutil.Popen(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "30s", "-s", str(lua), url + INFER],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    cpu = 0.0
    while process.poll() is None:
        try:
            cpu = cpu_seconds(process)
        except psutil.Error:
            break
        time.sleep(0.2)
    out = process.stdout.read()
    found = re.search(r"^statuses (\d+) (\d+)$", out, re.M)
    if not found:
        raise RuntimeError(f"wrk said: {out}")
    return int(found.group(1)), int(found.group(2)), time.monotonic() - started, cpu


def phase(url: str, lua: Path, worker: psutil.Process, connections: int, seconds: float) -> dict:
    before = cpu_seconds(worker)
    answered, refused, elapsed, wrk_cpu = wrk(url, lua, connections, seconds)
    server_cpu = cpu_seconds(worker) - before
    return {
        "connections": connections,
        "ok_rps": (answered - refused) / elapsed,
        "refused_rps": refused / elapsed,
        "server_cpu_cores": server_cpu / elapsed,
        "wrk_cpu_cores": wrk_cpu / elapsed,
    }


def measure(variant: dict, folder: Path, model: Path, args: argparse.Namespace) -> dict:
    port = procs.free_port()
    config = write_config(folder / f"server-{port}.toml", model, port)
    log = folder / f"server-{port}.log"
    server = procs.start(serve_command(config), log_path=log, env={**os.environ, **variant["env"]})
    url = f"http://127.0.0.1:{port}"
    lua = folder / "post.lua"
    lua.write_text(WRK_SCRIPT.format(body=BODY.decode()))
    try:
        procs.wait_ready(f"{url}/v2/health/ready", server, timeout_s=60, log_path=log)
        worker = worker_of(server)
        wrk(url, lua, CAPACITY_CONNECTIONS, 2)  # warm-up
        capacity = phase(url, lua, worker, CAPACITY_CONNECTIONS, args.seconds)
        storm = phase(url, lua, worker, args.connections, args.seconds)
    finally:
        procs.stop(server)
    return {
        "variant": variant["name"],
        "capacity": capacity,
        "storm": storm,
        "goodput_fraction": storm["ok_rps"] / capacity["ok_rps"],
    }


def parse_variant(text: str) -> dict:
    name, _, assignments = text.partition(":")
    env = dict(a.split("=", 1) for a in assignments.split(",") if a)
    return {"name": name, "env": env}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--variant",
        action="append",
        type=parse_variant,
        default=[],
        help="NAME:ENV=VALUE,... (repeatable; default: one variant, this checkout as is)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--layers", type=int, default=80, help="the slow model's depth (~10 ms a run at 80 here)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("overload_goodput.py needs wrk: apt-get install wrk")
    variants = args.variant or [{"name": "default", "env": {}}]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        model = build_slow_model(Path(tmp) / "slow" / "model.onnx", layers=args.layers)
        for round_ in range(args.rounds):
            for variant in variants:
                run = measure(variant, Path(tmp), model, args)
                runs.append(run)
                c, s = run["capacity"], run["storm"]
                print(
                    f"round {round_ + 1} {run['variant']:>12}: capacity {c['ok_rps']:6.1f} req/s "
                    f"(server {c['server_cpu_cores']:.2f} cores, wrk {c['wrk_cpu_cores']:.2f}); storm "
                    f"{s['ok_rps']:6.1f} ok + {s['refused_rps']:7.0f} refused req/s (server "
                    f"{s['server_cpu_cores']:.2f} cores, wrk {s['wrk_cpu_cores']:.2f}): goodput "
                    f"{run['goodput_fraction']:.2f} of capacity",
                    flush=True,
                )
    for variant in variants:
        fractions = [r["goodput_fraction"] for r in runs if r["variant"] == variant["name"]]
        print(
            f"{variant['name']}: goodput {np.median(fractions):.2f} of capacity (median of {len(fractions)}; "
            f"{min(fractions):.2f}-{max(fractions):.2f})"
        )
    if args.out:
        args.out.write_text(json.dumps({"machine_cpus": os.cpu_count(), "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
