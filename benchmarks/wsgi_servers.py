"""Compare WSGI servers on the same latlab app, side by side in one run: requests/s and p50.

    make bench-wsgi        (installs gunicorn and waitress into .venv first)

Each server runs the real app (one deployment of a tiny ONNX model) in one process; a closed-loop
client with CONCURRENCY connections hits a no-op route and the infer route for SECONDS each: wrk
(C, one thread) when installed, else Python threads, which saturate first and mute the differences.
Absolute numbers depend on the machine (client and server share its cores); the ratios are the result.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import orjson
import requests

from latlab.common import procs
from latlab.doctor import tiny_model
from latlab.server.config import save_config

CONCURRENCY = 8
SECONDS = 4.0
THREADS = 64
BIN = Path(sys.executable).parent


def commands(port: int) -> dict[str, list[str]]:
    return {
        "granian (Rust, WSGI)": [
            str(BIN / "granian"),
            "--interface",
            "wsgi",
            "--factory",
            "--no-access-log",
            "--port",
            str(port),
            "--blocking-threads",
            str(THREADS),
            "latlab.server.processes.wsgi:app_from_env",
        ],
        "gunicorn gthread": [
            str(BIN / "gunicorn"),
            "-w",
            "1",
            "-k",
            "gthread",
            "--threads",
            str(THREADS),
            "-b",
            f"127.0.0.1:{port}",
            "latlab.server.processes.wsgi:app_from_env()",
        ],
        "waitress": [
            str(BIN / "waitress-serve"),
            "--threads",
            str(THREADS),
            "--listen",
            f"127.0.0.1:{port}",
            "--call",
            "latlab.server.processes.wsgi:app_from_env",
        ],
    }


def load(url: str, body: bytes | None) -> tuple[float, float]:
    """Closed loop for SECONDS: (requests/s, p50 seconds)."""
    return load_wrk(url, body) if shutil.which("wrk") else load_python(url, body)


def load_wrk(url: str, body: bytes | None) -> tuple[float, float]:
    script = Path(tempfile.mkdtemp()) / "post.lua"
    args = ["wrk", "-t1", f"-c{CONCURRENCY}", f"-d{SECONDS:g}s", "--latency", url]
    if body:
        script.write_text(
            f'wrk.method = "POST"\nwrk.body = {orjson.dumps(body.decode()).decode()}\n'
            'wrk.headers["Content-Type"] = "application/json"\n'
        )
        args[1:1] = ["-s", str(script)]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    value, unit = re.search(r"50%\s+([\d.]+)(us|ms|s)", out).groups()
    if "Non-2xx" in out:
        raise RuntimeError(f"{url}: server answered errors:\n{out}")
    return rps, float(value) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[unit]


def load_python(url: str, body: bytes | None) -> tuple[float, float]:
    latencies: list[float] = []
    stop = time.perf_counter() + SECONDS

    def client() -> None:
        session = requests.Session()
        mine = []
        while time.perf_counter() < stop:
            started = time.perf_counter()
            response = session.post(url, data=body) if body else session.get(url)
            response.raise_for_status()
            mine.append(time.perf_counter() - started)
        latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(CONCURRENCY)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return len(latencies) / SECONDS, float(np.median(latencies))


def main() -> None:
    work = Path(tempfile.mkdtemp())
    model = tiny_model(work / "tiny.onnx")
    config = save_config(
        {
            "deployments": [
                {"name": "tiny", "model_path": model, "cpu": {"intra_op_threads": 1, "allow_spinning": False}}
            ]
        },
        work / "bench.toml",
    )
    body = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
    rows = []
    for name in commands(0):
        port = procs.free_port()
        command, host = commands(port)[name], f"http://127.0.0.1:{port}"
        if not Path(command[0]).exists():
            print(f"{name}: not installed, skipped (make bench-wsgi installs it)")
            continue
        process = procs.start(command, log_path=work / f"{name.split()[0]}.log", env={"LATLAB_CONFIG": str(config)})
        try:
            procs.wait_ready(f"{host}/v2/health/ready", process, timeout_s=60)
            load(f"{host}/v2/models/tiny/infer", body)  # warm-up
            live = load(f"{host}/v2/health/live", None)
            infer = load(f"{host}/v2/models/tiny/infer", body)
        finally:
            procs.stop(process)
        rows.append((name, live, infer))
    base = rows[0]
    client = "wrk" if shutil.which("wrk") else "python threads"
    print(
        f"\n{client}: {CONCURRENCY} closed-loop connections, {SECONDS:g} s per route, "
        f"{os.cpu_count()} cores shared with the client"
    )
    print(
        f"{'server':<22} {'no-op req/s':>12} {'p50 ms':>7} {'ratio':>6}   "
        f"{'infer req/s':>12} {'p50 ms':>7} {'ratio':>6}"
    )
    for name, (live_rps, live_p50), (infer_rps, infer_p50) in rows:
        print(
            f"{name:<22} {live_rps:12.0f} {live_p50 * 1e3:7.2f} {live_rps / base[1][0]:6.2f}   "
            f"{infer_rps:12.0f} {infer_p50 * 1e3:7.2f} {infer_rps / base[2][0]:6.2f}"
        )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
