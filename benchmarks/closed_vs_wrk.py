"""Closed-loop throughput of latlab's generator against wrk's, on the same server, the same body, side by side.

    .venv/bin/python benchmarks/closed_vs_wrk.py [--users 16] [--seconds 8] [--rounds 6] [--max-batch 1]
        [--python-loop] [--greenlet] [--bare] [--other /tmp/before/pkg]

Serves the lab's mlp at batching off (or `--max-batch N`, waiting up to 2 ms; one ORT thread) on a free port and,
alternating the order per round, runs `wrk -t1 -cUSERS` (a POST of one JSON infer body, the first the generator
itself would send) and `latlab loadtest --mode closed --users USERS` for the same seconds (its default sender, the
native closed loop: native_loop.py); with `--python-loop` also with LATLAB_CLOSED_LOOP=python (the Python loop
sender, loop_sender.py); with `--bare` also latlab's Python and native loop senders alone, without Locust or the
recorder (bare_sender.py: what each costs here at the least); with `--greenlet` also with
LATLAB_CLOSED_LOOP=greenlet (the users sending from their greenlets, as before the loop sender); with `--other`
also another version of latlab's code (a folder holding its `latlab` package, put first on PYTHONPATH). Prints each
tool's requests/s, its own CPU (% of one core: wrk's and the bare sender's from their process times, latlab's the
busiest generator process as the results record it) and CPU per request, each latlab's rate over wrk's per round,
and per tool the median and range over the rounds and the ratio's mean with its 95% interval (this machine's rate
drifts between rounds far more than the tools differ: only runs side by side compare). wrk is Debian's `wrk`
(apt-get install wrk)."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil
import requests
import scipy.stats

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


def bare_rate(url: str, users: int, seconds: float, native: bool) -> tuple[float, float]:
    """A closed-loop sender alone (bare_sender.py): its requests/s and CPU (% of one core)."""
    script = Path(__file__).with_name("bare_sender.py")
    args = [sys.executable, str(script), url, DEPLOYMENT, "--users", str(users), "--seconds", f"{seconds:g}"]
    args += ["--native"] * native
    done = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 120)
    if done.returncode:
        raise RuntimeError(f"the bare sender failed: {done.stderr[-2000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    if figures["failed"]:
        raise RuntimeError(f"the bare sender had {figures['failed']} requests fail")
    return figures["rps"], figures["cpu_percent"]


def latlab_rate_of(tool: str, other: str, url: str, users: int, seconds: float, out: Path) -> tuple[float, float]:
    """latlab_rate of one of the latlab tools: this checkout's native, Python loop or greenlet sender, or the other
    version's code (its default sender)."""
    os.environ[CLOSED_LOOP_ENV] = {"latlab-greenlet": "greenlet", "latlab-python": "python"}.get(tool, "native")
    saved = os.environ.get("PYTHONPATH")
    if tool == "latlab-other":
        os.environ["PYTHONPATH"] = other
    try:
        return latlab_rate(url, users, seconds, out)
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def _mean_interval(values: list[float]) -> str:
    """The mean and its 95% confidence interval (Student's t over the rounds): what a bar such as "within 5% of
    wrk" is read against, where single rounds drift by tens of percent."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"mean {mean:.3f}"
    half = scipy.stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
    return f"mean {mean:.3f} (95% interval {mean - half:.3f}-{mean + half:.3f})"


def _spread(values: list[float], spec: str) -> str:
    return f"{format(statistics.median(values), spec)} ({format(min(values), spec)}-{format(max(values), spec)})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--max-batch", type=int, default=1, help="the batcher's max batch size (its wait: 2 ms above 1)"
    )
    parser.add_argument(
        "--python-loop", action="store_true", help="also latlab's closed loop on its Python loop sender"
    )
    parser.add_argument(
        "--greenlet", action="store_true", help="also latlab's closed loop sending from its greenlets (the old way)"
    )
    parser.add_argument("--other", default="", help="a folder holding another version's `latlab` package")
    parser.add_argument(
        "--bare", action="store_true", help="also latlab's loop sender alone, without Locust (bare_sender.py)"
    )
    parser.add_argument("--models-dir", type=Path, default=Path("models/bench"))
    parser.add_argument("--out", type=Path, default=Path("runs") / f"closed-vs-wrk-{time.strftime('%Y%m%d-%H%M%S')}")
    args = parser.parse_args(argv)
    if not shutil.which("wrk"):
        sys.exit("wrk is not installed: apt-get install wrk")
    work = args.out.resolve()
    work.mkdir(parents=True, exist_ok=True)
    mlp = export_zoo(args.models_dir.resolve(), "mlp")
    os.chdir(work)  # the load tests' `python -m latlab.loadtest` must find the version asked for, not ./latlab
    port = procs.free_port()
    config = write_config(
        work / "mlp.toml", port, {DEPLOYMENT: (mlp, batching(args.max_batch, 2.0 if args.max_batch > 1 else 0.0))}
    )
    rows = []
    with serving(config, port, work / "server.log") as served:
        metadata = requests.get(f"{served.url}/v2/models/{DEPLOYMENT}", timeout=10).json()
        body = request_bodies(metadata, seed=0)[0].data
        print("round  tool              req/s  own CPU %  CPU per request")
        tools = [
            "wrk",
            "latlab",
            *(["latlab-python"] if args.python_loop else []),
            *(["latlab-greenlet"] if args.greenlet else []),
            *(["latlab-other"] * bool(args.other)),
            *(["python-alone", "native-alone"] if args.bare else []),
        ]
        for k in range(args.rounds):
            measured = {}
            for tool in tools if k % 2 == 0 else tools[::-1]:
                if tool == "wrk":
                    measured[tool] = wrk_rate(served.url, body, args.users, args.seconds, work)
                elif tool.endswith("-alone"):
                    measured[tool] = bare_rate(served.url, args.users, args.seconds, tool == "native-alone")
                else:
                    measured[tool] = latlab_rate_of(
                        tool, args.other, served.url, args.users, args.seconds, work / f"{tool}-{k}"
                    )
                rps, cpu = measured[tool]
                print(f"{k:5d}  {tool:15s} {rps:7.0f}  {cpu:9.0f}  {cpu / 100 / rps * 1e6:6.0f} µs", flush=True)
            figures = {tool: {"rps": rps, "cpu_percent": cpu} for tool, (rps, cpu) in measured.items()}
            ratios = {tool: rps / measured["wrk"][0] for tool, (rps, _) in measured.items() if tool != "wrk"}
            print(f"{k:5d}  " + ", ".join(f"{tool} / wrk {ratio:.3f}" for tool, ratio in ratios.items()), flush=True)
            rows.append({"round": k, "users": args.users, **figures, "ratio": ratios["latlab"], "ratios": ratios})
    print(f"over {len(rows)} rounds, median (range):")
    for tool in tools:
        cost = [row[tool]["cpu_percent"] / 100 / row[tool]["rps"] * 1e6 for row in rows]
        line = f"  {tool:15s} CPU per request {_spread(cost, '.0f')} µs"
        if tool != "wrk":
            ratios = [row["ratios"][tool] for row in rows]
            line += f", {tool} / wrk {_spread(ratios, '.3f')}, {_mean_interval(ratios)}"
        print(line)
    (work / "closed_vs_wrk.json").write_text(json.dumps(rows, indent=1))
    print(f"written: {work / 'closed_vs_wrk.json'}")


if __name__ == "__main__":
    main()
