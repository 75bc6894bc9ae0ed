"""A fleet's proxy measured on real processes: the latency HAProxy adds, the tails of roundrobin, leastconn and
random(2) under mixed request sizes, a storm's goodput with the proxy's rate limit and without, and the replicas'
imbalance under keep-alive clients.

- latency: one replica of the tiny model; `latlab loadtest` at the same open-loop rate straight to the replica and
  through the proxy, alternating (direct, proxy, direct, proxy, ...); p50 and p99 of each and their differences.
- balance: two replicas of the zoo's minilm (batching off, one ORT thread each), loaded through the proxy with
  log-normal request lengths (`--dim seq=lognormal:P50:P99`) at one rate per round for every algorithm in turn;
  each one's p50, p99 and the imbalance its steps recorded (`--fleet`): the lean client's keep-alive connections.
- storm: one replica of the slow model (~10 ms a run, queue bound 64, as benchmarks/experiments/overload_goodput.py);
  the capacity first (a polite client: 4 keep-alive connections from 127.0.0.2), then wrk's storm (300 connections
  from 127.0.0.1, each sending again at once, ignoring Retry-After) with the polite client beside it. Goodput = 200s
  per second during the storm over the capacity, all clients together and the polite one alone; without the proxy's
  rate limit, then with it (per client IP, --rate-limit).

    .venv/bin/python -m benchmarks.fleet_proxy [--parts latency,balance,storm] [--rounds 2] [--out f.json]

(from the repository root: the test suite's models come from tests/). Needs haproxy and wrk (Debian packages).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

from benchmarks.experiments.overload_goodput import WRK_SCRIPT, wrk
from latlab.common import procs
from latlab.fleet.build import build_fleet
from latlab.fleet.run import Fleet
from latlab.fleet.spec import BALANCES
from latlab.loadtest.results import Step, read_results
from latlab.server.config import save_config
from tests.conftest import build_tiny_model
from tests.reliability.crowd import BODY
from tests.reliability.test_overload import build_slow_model

MINILM = Path("models/minilm/model.onnx")
POLITE_SOURCE = "127.0.0.2"
"""The polite client's address: the proxy's rate limit counts per client IP, and the storm comes from 127.0.0.1."""


@contextlib.contextmanager
def running_fleet(config: Path, folder: Path, replicas: int, **options: object) -> Iterator[Fleet]:
    cores = replicas  # one each: every deployment here names its one ORT thread anyway
    fleet = build_fleet(
        config, folder, cores, replicas=replicas, port=procs.free_port(), stats_port=procs.free_port(), **options
    )
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.stop()


def loadtest(host: str, deployment: str, rate: float, step_s: float, out: Path, *more: str) -> Step:
    """One open-loop step of `latlab loadtest` at `rate`, its windows `step_s` together; the measured step."""
    command = [sys.executable, "-m", "latlab.cli", "loadtest", "--host", host, "--deployment", deployment]
    command += ["--rates", f"{rate:g}", "--warmup-seconds", "1", "--step-seconds", f"{step_s:g}"]
    command += ["--max-windows", "3"]
    command += ["--calibrate-seconds", "0", "--out", str(out), *more]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(result.stdout[-2000:] + result.stderr[-2000:])
    (run,) = read_results(out / "results.json")
    return run.deployments[0].steps[0]


def ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:7.2f}" if seconds is not None else "      -"


def latency(folder: Path, rounds: int, rate: float, step_s: float) -> dict:
    model = build_tiny_model(folder / "tiny" / "model.onnx")
    config = save_config({"deployments": [{"name": "tiny", "model_path": model}]}, folder / "tiny.toml")
    rows: list[dict] = []
    with running_fleet(config, folder / "latency", 1) as fleet:
        hosts = {"direct": fleet.spec.replicas[0].port, "proxy": fleet.spec.port}
        for k in range(rounds):
            for way, port in hosts.items():
                step = loadtest(f"http://127.0.0.1:{port}", "tiny", rate, step_s, folder / f"latency-{k}-{way}")
                rows.append({"round": k, "way": way, "p50_s": step.p50_s, "p99_s": step.p99_s, "errors": step.errors})
                print(f"latency round {k + 1} {way:>6}: p50 {ms(step.p50_s)} ms  p99 {ms(step.p99_s)} ms", flush=True)
    added = {q: statistics.median(p[q] - d[q] for d, p in zip(rows[::2], rows[1::2])) for q in ("p50_s", "p99_s")}
    ratio = {q: statistics.median(p[q] / d[q] for d, p in zip(rows[::2], rows[1::2])) for q in ("p50_s", "p99_s")}
    print(
        f"latency at {rate:g} req/s: the proxy adds p50 {ms(added['p50_s'])} ms (x{ratio['p50_s']:.2f}), "
        f"p99 {ms(added['p99_s'])} ms (x{ratio['p99_s']:.2f}); median over {rounds} rounds",
        flush=True,
    )
    return {"rate": rate, "rows": rows, "added": added, "ratio": ratio}


def balance(folder: Path, rounds: int, rate: float, step_s: float, sizes: str) -> dict:
    if not MINILM.is_file():
        raise SystemExit(f"{MINILM} is missing: `latlab export minilm` first")
    deployment = {
        "name": "minilm",
        "model_path": MINILM.resolve(),
        "cpu": {"intra_op_threads": 1, "allow_spinning": False},
        "batcher": {"max_batch_size": 1},
    }
    config = save_config({"deployments": [deployment]}, folder / "minilm.toml")
    rows = []
    for k in range(rounds):
        for algorithm in BALANCES:
            name = algorithm.replace("(", "").replace(")", "")
            with running_fleet(config, folder / f"balance-{name}-{k}", 2, balance=algorithm) as fleet:
                host = f"http://127.0.0.1:{fleet.spec.port}"
                extra = ["--dim", f"seq={sizes}", "--fleet", str(fleet.targets)]
                step = loadtest(host, "minilm", rate, step_s, folder / f"balance-{name}-{k}-run", *extra)
            row = {"round": k, "balance": algorithm, "p50_s": step.p50_s, "p99_s": step.p99_s, "fleet": step.fleet}
            row |= {"errors": step.errors, "achieved_rps": step.achieved_rps}
            rows.append(row)
            print(
                f"balance round {k + 1} {algorithm:>10}: p50 {ms(step.p50_s)} ms  p99 {ms(step.p99_s)} ms  "
                f"achieved {step.achieved_rps:5.1f}/s  imbalance {step.fleet['imbalance']:.3f}  "
                f"per replica {step.fleet['replicas']}",
                flush=True,
            )
    summary = {}
    for algorithm in BALANCES:
        mine = [r for r in rows if r["balance"] == algorithm]
        summary[algorithm] = {
            "p99_s": statistics.median(r["p99_s"] for r in mine),
            "p50_s": statistics.median(r["p50_s"] for r in mine),
            "imbalance": statistics.median(r["fleet"]["imbalance"] for r in mine),
        }
    base = summary["roundrobin"]["p99_s"]
    for algorithm, s in summary.items():
        print(
            f"balance at {rate:g} req/s, sizes {sizes}: {algorithm:>10} p99 {ms(s['p99_s'])} ms "
            f"(x{s['p99_s'] / base:.2f} of roundrobin's), p50 {ms(s['p50_s'])} ms, imbalance {s['imbalance']:.3f}",
            flush=True,
        )
    return {"rate": rate, "sizes": sizes, "rows": rows, "summary": summary}


class Polite:
    """`connections` keep-alive clients from POLITE_SOURCE, each sending again once answered: their answers."""

    def __init__(self, port: int, connections: int = 4) -> None:
        self.port, self.ok, self.other = port, 0, 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(connections)]

    def __enter__(self) -> Polite:
        self.started = time.monotonic()
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        self.seconds = time.monotonic() - self.started

    def _client(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30, source_address=(POLITE_SOURCE, 0))
        while not self._stop.is_set():
            try:
                connection.request("POST", "/v2/models/slow/infer", BODY, {"Content-Type": "application/json"})
                response = connection.getresponse()
                response.read()
                status = response.status
                if response.getheader("Connection", "").lower() == "close":
                    connection.close()
            except (OSError, http.client.HTTPException):
                connection.close()
                status = 0
            with self._lock:
                if status == 200:
                    self.ok += 1
                else:
                    self.other += 1
        connection.close()


def storm(folder: Path, rounds: int, seconds: float, connections: int) -> dict:
    model = build_slow_model(folder / "slow" / "model.onnx", layers=80)
    deployment = {
        "name": "slow",
        "model_path": model,
        "cpu": {"intra_op_threads": 1, "allow_spinning": False},
        "batcher": {"max_batch_size": 1, "max_queue_size": 64},
    }
    config = save_config({"deployments": [deployment]}, folder / "slow.toml")
    lua = folder / "post.lua"
    lua.write_text(WRK_SCRIPT.format(body=BODY.decode()))
    rows = []
    for k in range(rounds):
        for limited in (False, True):
            rows.append(storm_round(config, folder / f"storm-{k}-{int(limited)}", lua, limited, seconds, connections))
            r = rows[-1]
            print(
                f"storm round {k + 1} {'rate limit' if limited else 'no limit':>10}: capacity {r['capacity']:6.1f}/s; "
                f"storm: all 200s {r['ok_rps']:6.1f}/s (goodput {r['goodput']:.2f}), polite {r['polite_rps']:6.1f}/s "
                f"({r['polite_goodput']:.2f}), wrk refused {r['wrk_refused_rps']:7.0f}/s",
                flush=True,
            )
    summary = {
        name: {
            key: statistics.median(r[key] for r in rows if r["rate_limit"] == bool(limited))
            for key in ("goodput", "polite_goodput")
        }
        for name, limited in (("without", 0), ("with", 1))
    }
    print(
        f"storm goodput (all 200s / capacity): without the limit {summary['without']['goodput']:.2f}, with it "
        f"{summary['with']['goodput']:.2f}; the polite client's: {summary['without']['polite_goodput']:.2f} -> "
        f"{summary['with']['polite_goodput']:.2f}",
        flush=True,
    )
    return {"rows": rows, "summary": summary}


def storm_round(config: Path, folder: Path, lua: Path, limited: bool, seconds: float, connections: int) -> dict:
    """One fleet of one replica: the polite client's capacity, then the storm with the polite client beside it."""
    # the limit sits well above what the polite client can send, far below the storm's rate
    options = {"rate_limit": 200} if limited else {}
    with running_fleet(config, folder, 1, **options) as fleet:
        url = f"http://127.0.0.1:{fleet.spec.port}"
        with Polite(fleet.spec.port):  # warm-up
            time.sleep(1.0)
        with Polite(fleet.spec.port) as alone:
            time.sleep(seconds)
        capacity = alone.ok / alone.seconds
        with Polite(fleet.spec.port) as polite:
            answered, refused, elapsed, _ = wrk(url, lua, connections, seconds)
    wrk_ok = (answered - refused) / elapsed
    polite_rps = polite.ok / polite.seconds
    return {
        "rate_limit": limited,
        "capacity": capacity,
        "ok_rps": wrk_ok + polite_rps,
        "polite_rps": polite_rps,
        "wrk_ok_rps": wrk_ok,
        "wrk_refused_rps": refused / elapsed,
        "goodput": (wrk_ok + polite_rps) / capacity,
        "polite_goodput": polite_rps / capacity,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="latency,balance,storm")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--latency-rate", type=float, default=100.0)
    parser.add_argument("--balance-rate", type=float, default=40.0)
    parser.add_argument("--sizes", default="lognormal:16:128", help="--dim seq=SPEC of the balance part")
    parser.add_argument("--storm-seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=300)
    parser.add_argument("--step-seconds", type=float, default=4.0, help="each load test's step (three windows)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    parts = args.parts.split(",")
    found = {}
    with tempfile.TemporaryDirectory(prefix="fleet-proxy-") as tmp:
        folder = Path(tmp)
        if "latency" in parts:
            found["latency"] = latency(folder, args.rounds, args.latency_rate, args.step_seconds)
        if "balance" in parts:
            found["balance"] = balance(folder, args.rounds, args.balance_rate, args.step_seconds, args.sizes)
        if "storm" in parts:
            found["storm"] = storm(folder, args.rounds, args.storm_seconds, args.connections)
    if args.out:
        args.out.write_text(json.dumps(found, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
