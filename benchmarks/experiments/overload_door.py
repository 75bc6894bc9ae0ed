"""Overload at the door, as a user would try it: one deployment of ~10 ms a run, batching off, the default
max_queue_size (256), and wrk with 300 connections for 12 s (closed loop: a refused connection asks again at
once), while another process probes /metrics and /v2/health/ready every 0.1 s on the main port and, when the
server has one, on its observer port.

    .venv/bin/python -m benchmarks.experiments.overload_door [--other /tmp/old/pkg] [--setting "threads = 64"]
                                                             [--out f.json]

(from the repository root, which puts it on sys.path: the test suite's crowd and slow model come from tests/).
`--other` serves another version's code (its `latlab` package on PYTHONPATH, as for benchmarks/ab_request_path.py).
Needs wrk (Debian: `apt-get install wrk`). Prints the probes' times, what wrk got and the server's own counts.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import tempfile
import time
import tomllib
from pathlib import Path

import numpy as np
import requests

from benchmarks.harness import serve_version
from latlab.common import procs
from latlab.server.config import save_config
from tests.reliability.crowd import BODY, INFER, Probe
from tests.reliability.test_overload import build_slow_model

PROBED = ("/metrics", "/v2/health/ready")
WRK_SCRIPT = 'wrk.method = "POST"\nwrk.body = \'{body}\'\nwrk.headers["Content-Type"] = "application/json"\n'


def write_config(path: Path, model: Path, port: int, settings: list[str]) -> Path:
    """One slow deployment, batching off; `settings` are --setting's 'KEY = VALUE' lines of [server]."""
    server = {"port": port, **tomllib.loads("\n".join(settings))}
    return save_config(
        {
            "server": server,
            "deployments": [
                {
                    "name": "slow",
                    "model_path": model,
                    "cpu": {"intra_op_threads": 1, "allow_spinning": False},
                    "batcher": {"max_batch_size": 1},
                }
            ],
        },
        path,
    )


def probe_process(urls: list[str], stop, results) -> None:
    """The probes, in a process of their own: wrk and the server must not slow the clock that times them."""
    probes = [Probe(url) for url in urls]
    for probe in probes:
        probe.start()
    stop.wait()
    for probe in probes:
        probe.stopping.set()
        probe.join(35)
    results.put(
        {probe.url: [(t, s, status, queue_depth(text)) for t, s, status, text in probe.samples] for probe in probes}
    )


def queue_depth(metrics_text: str) -> float | None:
    found = re.search(r"^latlab_batcher_queue_depth\{[^}]*\} (\S+)$", metrics_text, re.M)
    return float(found.group(1)) if found else None


def capacity(url: str, n: int = 50) -> float:
    session = requests.Session()
    for _ in range(5):
        session.post(url + INFER, data=BODY, headers={"Content-Type": "application/json"}, timeout=10)
    started = time.monotonic()
    for _ in range(n):
        session.post(url + INFER, data=BODY, headers={"Content-Type": "application/json"}, timeout=10)
    return n / (time.monotonic() - started)


def server_counts(url: str) -> dict:
    counts = {}
    for line in requests.get(url + "/metrics", timeout=60).text.splitlines():
        found = re.match(r'latlab_server_requests_total\{.*outcome="(\w+)".*\} (\S+)$', line)
        if found:
            counts[found.group(1)] = float(found.group(2))
    return counts


def summarise(samples: dict, start: float, end: float) -> dict:
    """Per probed URL, the probes started while wrk ran: count, answered, p50 / p99 / max seconds."""
    out = {}
    for url, taken in samples.items():
        during = [s for s in taken if start <= s[0] <= end]
        seconds = [s[1] for s in during]
        out[url] = {
            "probes": len(during),
            "answered": sum(s[2] == 200 for s in during),
            "p50_s": float(np.percentile(seconds, 50)) if seconds else None,
            "p99_s": float(np.percentile(seconds, 99)) if seconds else None,
            "max_s": max(seconds, default=None),
            "queue_depth_max": max((s[3] for s in during if s[3] is not None), default=None),
        }
    return out


def run(args: argparse.Namespace, folder: Path) -> dict:
    model = build_slow_model(folder / "slow" / "model.onnx", layers=args.layers)
    port = procs.free_port()
    config = write_config(folder / "server.toml", model, port, args.setting)
    url = f"http://127.0.0.1:{port}"
    server = serve_version(config, port, folder, args.other)
    context = multiprocessing.get_context("spawn")
    stop, results = context.Event(), context.Queue()
    try:
        rate = capacity(url)
        metrics_port = requests.get(url + "/v2", timeout=5).json().get("metrics_port")
        bases = [url] + ([f"http://127.0.0.1:{metrics_port}"] if metrics_port else [])
        prober = context.Process(target=probe_process, args=([b + p for b in bases for p in PROBED], stop, results))
        prober.start()
        time.sleep(1.0)
        lua = folder / "post.lua"
        lua.write_text(WRK_SCRIPT.format(body=BODY.decode()))
        start = time.time()
        wrk = subprocess.run(
            [
                "wrk",
                "-t2",
                f"-c{args.connections}",
                f"-d{args.seconds}s",
                "--timeout",
                "30s",
                "-s",
                str(lua),
                url + INFER,
            ],
            capture_output=True,
            text=True,
            timeout=args.seconds + 90,
        )
        end = time.time()
        stop.set()
        samples = results.get(timeout=120)
        prober.join(10)
        counts = server_counts(bases[-1])
    finally:
        stop.set()
        procs.stop(server)
    return {
        "version": args.other or "this checkout",
        "settings": args.setting,
        "capacity_rps": rate,
        "connections": args.connections,
        "seconds": args.seconds,
        "wrk": wrk.stdout,
        "server_requests": counts,
        "probes": summarise(samples, start, end),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--other", help="PYTHONPATH holding another version's `latlab` package, served instead")
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="'KEY = VALUE'",
        help="a [server] setting (repeatable), e.g. 'threads = 64'",
    )
    parser.add_argument("--connections", type=int, default=300)
    parser.add_argument("--seconds", type=int, default=12)
    parser.add_argument("--layers", type=int, default=80, help="the slow model's depth (~10 ms a run at 80 here)")
    parser.add_argument("--out", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("overload_door.py needs wrk: apt-get install wrk")
    with tempfile.TemporaryDirectory() as tmp:
        figures = run(args, Path(tmp))
    for url, probed in figures["probes"].items():
        print(
            f"{url}: {probed['answered']}/{probed['probes']} answered, p50 {probed['p50_s'] * 1e3:.1f} ms, "
            f"p99 {probed['p99_s'] * 1e3:.1f} ms, max {probed['max_s'] * 1e3:.1f} ms, "
            f"queue depth max {probed['queue_depth_max']}"
        )
    print(f"capacity {figures['capacity_rps']:.0f} req/s one at a time; server answered {figures['server_requests']}")
    print(figures["wrk"])
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
