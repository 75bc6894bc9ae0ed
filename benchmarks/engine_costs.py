"""Where a server's CPU goes under batched load, by thread; and what one batch costs the batcher's worker.

    .venv/bin/python benchmarks/engine_costs.py [--threads] [--batcher] [--seconds 6] [--frontends 2]
                                                [--interface native] [--models-dir DIR]

--threads: mlp (batching <= 64 / 2 ms, one ORT thread) behind --frontends front ends of --interface (with 1: one
process), `wrk` with 16 connections for --seconds: every thread's CPU time (/proc/PID/task/*/stat) of every server
process divided by the requests answered, and the mean batch the engine ran (latlab_batcher_batch_size from
/metrics).
--batcher: the deployment's batcher in this process (the same mlp and settings, metrics in multiprocess mode as in
an engine), fed --stacks stacks of --rows one-row requests a batch with submit_many, as the engine feeds it: the
worker's CPU a batch, split into waiting for the batch and being woken (`_next_batch`), the model's run
(`Deployment._run_batch`: ORT and its metrics) and the rest of the batch (merging, splitting, answering the slots,
the batch's metrics). CPU times are thread times (time.thread_time); the machine's speed drifts, so compare runs
side by side.
Without --threads or --batcher both run.
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import requests

from harness import export_zoo, json_infer_body
from server_cpu import WRK_SCRIPT, started, wrk

from latlab.common import procs


def thread_times(pid: int) -> dict[tuple[str, str], float]:
    """CPU seconds of each thread of a process, by (thread id, name)."""
    times = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except FileNotFoundError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        times[(tid, name)] = (int(fields[11]) + int(fields[12])) / tick
    return times


def batch_sizes(observer: str) -> tuple[float, float]:
    """Samples run and batches run so far by the engine (or the one process), from its /metrics."""
    found = {"latlab_batcher_batch_size_sum": 0.0, "latlab_batcher_batch_size_count": 0.0}
    for line in requests.get(f"{observer}/metrics", timeout=10).text.splitlines():
        for name in found:
            if line.startswith(name + "{"):
                found[name] += float(line.rsplit(" ", 1)[1])
    return found["latlab_batcher_batch_size_sum"], found["latlab_batcher_batch_size_count"]


def by_thread(folder: Path, model: Path, args: argparse.Namespace) -> None:
    body = folder / "body.json"
    body.write_bytes(json_infer_body(np.ones((1, 4), dtype=np.float32)))
    script = folder / "post.lua"
    script.write_text(WRK_SCRIPT.format(body=body))
    port = procs.free_port()
    server = started(folder, model, args.frontends, (None, args.interface), port)
    url = f"http://127.0.0.1:{port}/v2/models/mlp/infer"
    try:
        wrk(url, script, 1.0)  # warm
        root = psutil.Process(server.pid)
        processes = {p.pid: " ".join(p.cmdline()) for p in [root, *root.children(recursive=True)]}
        before = {pid: thread_times(pid) for pid in processes}
        observer = f"http://127.0.0.1:{port + 1}"
        samples_before, batches_before = batch_sizes(observer)
        answered = wrk(url, script, args.seconds)
        after = {pid: thread_times(pid) for pid in processes}
        samples, batches = batch_sizes(observer)
        mean = (samples - samples_before) / max(batches - batches_before, 1)
        print(f"{answered} requests in {args.seconds:g} s, {mean:.1f} requests a batch")
        for pid, line in processes.items():
            kind = "engine" if "processes.engine" in line else "front end" if pid != root.pid else "serving process"
            spent = {key: t - before[pid].get(key, 0.0) for key, t in after[pid].items()}
            shown = [(key, t) for key, t in spent.items() if t > 0]
            if not shown:
                continue
            print(f"{kind} {pid}: {sum(t for _, t in shown) / answered * 1e6:.1f} µs a request in all")
            for (tid, name), t in sorted(shown, key=lambda item: -item[1]):
                print(f"    thread {tid} {name:16s} {t / answered * 1e6:6.1f} µs a request")
    finally:
        server.send_signal(signal.SIGTERM)
        procs.stop(server)


def batcher_cycle(folder: Path, model: Path, args: argparse.Namespace) -> None:
    from prometheus_client import CollectorRegistry

    from latlab.server.batching import batcher as batcher_module
    from latlab.server.config import save_config, served_config
    from latlab.server.metrics import ServerMetrics, use_multiprocess_values
    from latlab.server.runtime.deployment import Deployment

    (folder / "metrics").mkdir()
    use_multiprocess_values(str(folder / "metrics"))
    deployment_table = {
        "name": "mlp",
        "model_path": model,
        "cpu": {"intra_op_threads": 1, "allow_spinning": False},
        "batcher": {"max_batch_size": 64, "max_queue_delay_ms": 2.0},
    }
    config = served_config(save_config({"server": {"port": 9}, "deployments": [deployment_table]}, folder / "c.toml"))
    deployment = Deployment(config.deployments[0], ServerMetrics(CollectorRegistry(), process=False))
    deployment.wait_ready(30)
    spent = {"waiting and woken": 0.0, "the run (ORT and its metrics)": 0.0, "the rest of the batch": 0.0}
    cls = batcher_module.DynamicBatcher
    next_batch, run = cls._next_batch, cls._run

    def timed_next(self):
        started_at = time.thread_time()
        try:
            return next_batch(self)
        finally:
            spent["waiting and woken"] += time.thread_time() - started_at

    def timed_run(self, batch):
        started_at = time.thread_time()
        try:
            return run(self, batch)
        finally:
            spent["the rest of the batch"] += time.thread_time() - started_at

    model_run = deployment.batcher._run_batch

    def timed_model(*arguments):
        started_at = time.thread_time()
        try:
            return model_run(*arguments)
        finally:
            spent["the run (ORT and its metrics)"] += time.thread_time() - started_at

    cls._next_batch, cls._run = timed_next, timed_run
    deployment.batcher._run_batch = timed_model
    x = np.ones((args.rows, 4), np.float32)
    try:
        for _ in range(args.batches):
            calls = [(*deployment.queued({"x": x}, None, {}, set()), args.rows) for _ in range(args.stacks)]
            for slot in deployment.batcher.submit_many(calls):
                slot.result(10)
    finally:
        cls._next_batch, cls._run = next_batch, run
        deployment.close()
    spent["the rest of the batch"] -= spent["the run (ORT and its metrics)"]
    rows = args.stacks * args.rows
    print(f"the batcher's worker, {args.stacks} stacks of {args.rows} a batch ({rows} rows), {args.batches} batches:")
    for part, seconds in spent.items():
        print(f"    {part:32s} {seconds / args.batches * 1e6:6.1f} µs a batch")
    print(f"    {'in all':32s} {sum(spent.values()) / args.batches * 1e6:6.1f} µs a batch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", action="store_true", help="the server's CPU by thread under wrk's load")
    parser.add_argument("--batcher", action="store_true", help="one batch's cost to the batcher's worker")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--frontends", type=int, default=2)
    parser.add_argument("--interface", choices=("wsgi", "native"), default="native")
    parser.add_argument("--stacks", type=int, default=3, help="--batcher: stacks a batch")
    parser.add_argument("--rows", type=int, default=5, help="--batcher: requests (rows) a stack")
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--models-dir", type=Path, default=None)
    args = parser.parse_args()
    both = not (args.threads or args.batcher)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        model = export_zoo(args.models_dir or folder / "models", "mlp")
        if args.threads or both:
            by_thread(folder, model, args)
        if args.batcher or both:
            batcher_cycle(folder, model, args)


if __name__ == "__main__":
    main()
