"""Closed-loop throughput of latlab's generator against wrk's, on the same server, the same body, side by side.

    .venv/bin/python benchmarks/closed_vs_wrk.py [--users 16] [--seconds 8] [--rounds 6] [--max-batch 1]

Serves the lab's mlp at batching off (or `--max-batch N`, waiting up to 2 ms; one ORT thread) on a free port
and, alternating the order per round, runs `wrk -t1 -cUSERS` (a POST of one JSON infer body, the first the
generator itself would send) and `latlab loadtest --mode closed --users USERS` for the same seconds (with
`--greenlet` also with LATLAB_CLOSED_LOOP=greenlet: the users sending from their greenlets, as before the loop
sender). Prints each
tool's requests/s, its own CPU (% of one core: wrk's from its process times, latlab's the busiest generator
process as the results record it), latlab's rate over wrk's per round, and their median over the rounds (this
machine's rate drifts between rounds far more than the two tools differ: only pairs side by side compare). wrk
is Debian's `wrk` (apt-get install wrk)."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import requests

from harness import batching, export_zoo, loadtest, serving, write_config

from latlab.common import procs
from latlab.loadtest.payloads import request_bodies

DEPLOYMENT = "mlp"
CLOSED_LOOP_ENV = "LATLAB_CLOSED_LOOP"
"""loadtest/users.py's switch (not imported: it would patch this process with gevent)."""


def wrk_rate(url: str, body: bytes, users: int, seconds: float, work: Path) -> tuple[float, float]:
    """wrk's requests/s and its CPU (% of one core) over the run."""
    script = work / "post.lua"
    script.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f"wrk.body = {json.dumps(body.decode())}\n"
    )
    args = ["wrk", "-t1", f"-c{users}", f"-d{seconds:g}s", "-s", str(script), f"{url}/v2/models/{DEPLOYMENT}/infer"]
    began = time.monotonic()
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watched = psutil.Process(process.pid)
    cpu = 0.0
    while process.poll() is None:
        try:
            times = watched.cpu_times()
            cpu = times.user + times.system
        except psutil.NoSuchProcess:
            break
        time.sleep(0.2)
    out = process.communicate()[0]
    elapsed = time.monotonic() - began
    found = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not found or "Non-2xx" in out:
        raise RuntimeError(f"wrk did not measure: {out}")
    return float(found.group(1)), 100.0 * cpu / elapsed


def latlab_rate(url: str, users: int, seconds: float, out: Path) -> tuple[float, float]:
    (curve,) = loadtest(
        url,
        [DEPLOYMENT],
        out,
        "--mode",
        "closed",
        "--users",
        str(users),
        "--step-seconds",
        f"{seconds:g}",
        "--warmup-seconds",
        "1",
        "--max-windows",
        "3",
    )
    step = curve.steps[-1]
    return step.achieved_rps, step.generator_cpu_percent or 0.0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--max-batch", type=int, default=1, help="the batcher's max batch size (its wait: 2 ms above 1)"
    )
    parser.add_argument(
        "--greenlet", action="store_true", help="also latlab's closed loop sending from its greenlets (the old way)"
    )
    parser.add_argument("--models-dir", type=Path, default=Path("models/bench"))
    parser.add_argument("--out", type=Path, default=Path("runs") / f"closed-vs-wrk-{time.strftime('%Y%m%d-%H%M%S')}")
    args = parser.parse_args(argv)
    if not shutil.which("wrk"):
        sys.exit("wrk is not installed: apt-get install wrk")
    work = args.out.resolve()
    work.mkdir(parents=True, exist_ok=True)
    mlp = export_zoo(args.models_dir.resolve(), "mlp")
    port = procs.free_port()
    config = write_config(
        work / "mlp.toml", port, {DEPLOYMENT: (mlp, batching(args.max_batch, 2.0 if args.max_batch > 1 else 0.0))}
    )
    rows = []
    with serving(config, port, work / "server.log") as served:
        metadata = requests.get(f"{served.url}/v2/models/{DEPLOYMENT}", timeout=10).json()
        body = request_bodies(metadata, seed=0)[0].data
        print("round  tool              req/s  own CPU %  CPU per request")
        for k in range(args.rounds):
            measured = {}
            tools = ["wrk", "latlab", *(["latlab-greenlet"] if args.greenlet else [])]
            for tool in tools if k % 2 == 0 else tools[::-1]:
                if tool == "wrk":
                    measured[tool] = wrk_rate(served.url, body, args.users, args.seconds, work)
                else:
                    os.environ[CLOSED_LOOP_ENV] = "greenlet" if tool == "latlab-greenlet" else "callbacks"
                    measured[tool] = latlab_rate(served.url, args.users, args.seconds, work / f"{tool}-{k}")
                rps, cpu = measured[tool]
                print(f"{k:5d}  {tool:15s} {rps:7.0f}  {cpu:9.0f}  {cpu / 100 / rps * 1e6:6.0f} µs", flush=True)
            ratio = measured["latlab"][0] / measured["wrk"][0]
            print(f"{k:5d}  latlab / wrk: {ratio:.3f}", flush=True)
            figures = {tool: {"rps": rps, "cpu_percent": cpu} for tool, (rps, cpu) in measured.items()}
            rows.append({"round": k, "users": args.users, **figures, "ratio": ratio})
    ratios = sorted(row["ratio"] for row in rows)
    print(
        f"latlab / wrk over {len(rows)} rounds: median {ratios[len(ratios) // 2]:.3f}, "
        f"range {ratios[0]:.3f}-{ratios[-1]:.3f}"
    )
    (work / "closed_vs_wrk.json").write_text(json.dumps(rows, indent=1))
    print(f"written: {work / 'closed_vs_wrk.json'}")


if __name__ == "__main__":
    main()
