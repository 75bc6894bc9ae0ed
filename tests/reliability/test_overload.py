"""Overload against the real server process: 3x its capacity for 60 s through latlab's own load generator.

The model is a stack of MatMuls (~6 ms a run on one ORT thread) behind a batcher that does not batch, so the
capacity is modest (~150 req/s here). The generator runs WORKERS Locust workers, so that it can push harder
than the server and its own CPU is measured per worker (a saturated generator fails the first test).
More connections than request threads, once the door's failure, and its fix: test_door.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import psutil
import pytest
import requests
from onnx import TensorProto, helper, numpy_helper

from latlab.common import procs

pytestmark = pytest.mark.e2e
CLI = [sys.executable, "-m", "latlab.cli"]
QUEUE_BOUND = 32
TIMEOUT_MS = 1000
WORKERS = 3
TIMEOUT_SLACK_RUNS = 20


def build_slow_model(path: Path, layers: int = 40, rows: int = 128, width: int = 256) -> Path:
    """y = mean(tanh(... tanh(ones[rows,1] @ (x W_in) @ W) ... @ W)) W_out: x FP32 [batch, 4] -> y [batch, 3].
    One weight matrix shared by every layer stays in cache, so the run time is compute, not memory."""
    rng = np.random.default_rng(0)
    weights = {
        "w_in": rng.standard_normal((4, width)) / 2,
        "w": rng.standard_normal((width, width)) / np.sqrt(width),
        "w_out": rng.standard_normal((width, 3)) / np.sqrt(width),
        "ones": np.ones((rows, 1)),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w_in"], ["h"]),
        helper.make_node("Unsqueeze", ["h", "axis"], ["hu"]),
        helper.make_node("MatMul", ["ones", "hu"], ["a0"]),
    ]
    for i in range(layers):
        nodes += [
            helper.make_node("MatMul", [f"a{i}", "w"], [f"m{i}"]),
            helper.make_node("Tanh", [f"m{i}"], [f"a{i + 1}"]),
        ]
    nodes += [
        helper.make_node("ReduceMean", [f"a{layers}", "axis"], ["r"], keepdims=0),
        helper.make_node("MatMul", ["r", "w_out"], ["y"]),
    ]
    initializers = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()]
    initializers.append(numpy_helper.from_array(np.array([1], np.int64), "axis"))
    graph = helper.make_graph(
        nodes,
        "slow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def write_config(path: Path, model: Path, port: int) -> Path:
    path.write_text(f"""
[server]
port = {port}
[[deployments]]
name = "slow"
model_path = "{model}"
[deployments.cpu]
intra_op_threads = 1
allow_spinning = false
[deployments.batcher]
max_batch_size = 1
max_queue_size = {QUEUE_BOUND}
timeout_ms = {TIMEOUT_MS}
""")
    return path


class RssSampler:
    """Samples the resident memory of the server's worker process (Granian's child) in a thread."""

    def __init__(self, process: psutil.Process, interval_s: float = 0.5) -> None:
        self.process = process
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True)
        self._thread.start()

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.samples.append((time.time(), self.process.memory_info().rss))
            except psutil.Error:
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def between(self, start: float, end: float) -> list[int]:
        return [rss for t, rss in self.samples if start <= t <= end]


def server_side_refusals(metrics_text: str) -> dict:
    """The server's own view from /metrics: 503s counted by the queue check, and an upper bound on their p99.
    The request histogram has no outcome label, but every accepted request takes at least one model run
    (~6 ms), so below that the histogram holds only refusals: the first bucket bound holding 99% of them
    bounds their p99 from above (as long as that bound is under the model's run time)."""
    refused, buckets, compute_sum, compute_count = 0.0, [], 0.0, 0.0
    for line in metrics_text.splitlines():
        if 'deployment="slow"' not in line or line.startswith("#"):
            continue
        value = float(line.rsplit(" ", 1)[1])
        if line.startswith("latlab_batcher_rejections_total{") and 'reason="queue_full"' in line:
            refused = value
        elif line.startswith("latlab_server_request_duration_seconds_bucket{"):
            bound = line.split('le="')[1].split('"')[0]
            buckets.append((float("inf") if bound == "+Inf" else float(bound), value))
        elif line.startswith("latlab_batcher_compute_duration_seconds_sum{"):
            compute_sum = value
        elif line.startswith("latlab_batcher_compute_duration_seconds_count{"):
            compute_count = value
    bound = next((b for b, count in sorted(buckets) if count >= 0.99 * refused), None)
    return {
        "server_refused": refused,
        "server_refusal_p99_at_most_s": bound,
        "compute_mean_s": compute_sum / compute_count if compute_count else None,
    }


def worker_of(server: subprocess.Popen) -> psutil.Process:
    """The process holding the model of a server that answers already: its largest child (Granian's worker, or an
    engine), or the server itself where it serves in its own process (the native interface)."""
    children = psutil.Process(server.pid).children(recursive=True)
    if children:
        return max(children, key=lambda c: c.memory_info().rss)
    return psutil.Process(server.pid)


@pytest.fixture(scope="module")
def overload(tmp_path_factory) -> dict:
    """One run for the whole module: serve the slow model, then `latlab loadtest --overload 3` against it
    (capacity measured, baseline at 40% of it, 60 s at 3x, recovery at 40%) while sampling the worker's RSS.
    Returns the run's overload figures plus RSS and liveness, also written to overload.json."""
    tmp = tmp_path_factory.mktemp("overload")
    config = write_config(tmp / "overload.toml", build_slow_model(tmp / "slow" / "model.onnx"), procs.free_port())
    host = f"http://127.0.0.1:{config.read_text().split('port = ')[1].split()[0]}"
    log = tmp / "server.log"
    started = time.monotonic()
    server = procs.start([*CLI, "serve", "--config", str(config)], log_path=log)
    sampler = None
    try:
        procs.wait_ready(f"{host}/v2/health/ready", server, timeout_s=60, log_path=log)
        worker = worker_of(server)
        sampler = RssSampler(worker)
        result = subprocess.run(
            [
                *CLI,
                "loadtest",
                "--host",
                host,
                "--deployment",
                "slow",
                "--overload",
                "3",
                "--burst-seconds",
                "60",
                "--rates",
                "250",
                "--step-seconds",
                "3",
                "--workers",
                str(WORKERS),
                # This VM's speed drifts by up to 2x within minutes (capacity measured 70 to
                # 169 req/s in one hour): at 60% of a capacity measured a minute earlier the
                # "normal" load can exceed what the server does by then. 40% leaves room.
                "--recovery-load",
                "0.4",
                "--out",
                str(tmp / "run"),
            ],
            capture_output=True,
            text=True,
            timeout=170,
        )
        sampler.stop()
        alive = (
            server.poll() is None
            and worker.is_running()
            and (worker.pid == server.pid or worker in psutil.Process(server.pid).children(True))
        )
        server_side = server_side_refusals(requests.get(f"{host}/metrics", timeout=10).text)
    finally:
        if sampler:
            sampler.stop()
        procs.stop(server)
    print(result.stdout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (deployment,) = json.loads((tmp / "run" / "results.json").read_text())["deployments"]
    burst = next(s for s in deployment["steps"] if s["phase"] == "burst")
    rss = [r / 2**20 for r in sampler.between(burst["start_time"], burst["end_time"])]
    figures = {
        **deployment["overload"],
        **server_side,
        "rss_start_mib": rss[0],
        "rss_end_mib": rss[-1],
        "rss_min_mib": min(rss),
        "rss_max_mib": max(rss),
        "process_alive": alive,
        "worker_pid": worker.pid,
        "cpu_count": os.cpu_count(),
        "test_seconds": time.monotonic() - started,
    }
    figures["readme"] = (
        f"{figures['summary']}; server RSS {figures['rss_start_mib']:.0f} -> "
        f"{figures['rss_end_mib']:.0f} MiB (max {figures['rss_max_mib']:.0f}); "
        f"process {'alive' if alive else 'DEAD'}"
    )
    (tmp / "overload.json").write_text(json.dumps(figures, indent=2))
    print(f"{tmp / 'overload.json'}:\n{(tmp / 'overload.json').read_text()}")
    return figures


def test_the_generator_really_offered_3x(overload):
    """Otherwise the other figures say nothing about 3x."""
    assert not overload["generator_bound"], "the load generator's CPU saturated"
    assert overload["offered_rps"] >= 2.7 * overload["capacity_rps"]
    assert overload["rejected"] > overload["accepted"], "about 2/3 of the offered load must be turned away"


def test_the_server_process_stays_up(overload):
    assert overload["process_alive"], "the server (or its Granian worker) died or was replaced under overload"


def test_the_queue_stays_within_its_bound(overload):
    assert overload["queue_capacity"] == QUEUE_BOUND
    assert overload["queue_depth_max"] is not None and overload["queue_depth_max"] <= QUEUE_BOUND


def test_rejections_are_immediate_with_retry_after(overload):
    assert overload["rejected_without_retry_after"] == 0
    # The server refused them at its queue check (fastpath.py: before the body is read), and each
    # refusal took less time in the server than one model run.
    assert overload["server_refused"] >= overload["rejected"]
    assert overload["server_refusal_p99_at_most_s"] < overload["compute_mean_s"]
    # Never queued: seen from the client, a typical rejection takes a fraction of the time a typical accepted
    # request waits in the queue (the tail of either is this 2-core machine's scheduling as much as the server's:
    # with other work on the cores, 503s took 110 ms at p99 from the actual send against 117 ms of queueing).
    assert overload["rejected_response_p50_s"] < 0.25 * overload["accepted_p50_s"]
    # The target "p99 of a 503 under 5 ms" is an absolute time, which a test on a shared 2-core box must
    # not assert; the figures are printed and recorded in the README instead.
    print(
        f"503 p99: server-side <= {overload['server_refusal_p99_at_most_s'] * 1e3:g} ms (histogram bucket), "
        f"client-side {overload['rejected_response_p99_s'] * 1e3:.1f} ms from the actual send "
        f"(target: 5 ms); one model run {overload['compute_mean_s'] * 1e3:.1f} ms"
    )


def test_accepted_requests_meet_their_timeout_and_none_hang(overload):
    # From the actual send: the timeout counts from the queue, and an admitted request may finish the run it is in;
    # the rest of the slack (model runs' worth, not seconds) is the HTTP path of a busy 2-core machine.
    slack = TIMEOUT_SLACK_RUNS * overload["compute_mean_s"]
    assert overload["accepted_response_max_s"] <= TIMEOUT_MS / 1000 + slack, "an accepted request outlived its timeout"
    assert overload["unanswered"] == 0, "requests without an HTTP answer"
    assert overload["hanging"] == 0, "requests still unanswered 10 s after the load stopped"
    assert not overload["other_statuses"], overload["other_statuses"]


def test_memory_stays_flat(overload):
    assert overload["rss_end_mib"] - overload["rss_start_mib"] < 30
    assert overload["rss_max_mib"] - overload["rss_min_mib"] < 50


def test_service_is_normal_again_soon_after_the_backlog_drains(overload):
    """As in test_door.py: within twice the admitted backlog's drain time at the measured capacity, plus two
    recovery windows (the judgement's resolution; docs/overload.md says how recovery is judged)."""
    bound = 2 * overload["drain_s"] + 2 * overload["recovery_window_s"]
    assert overload["recovery_s"] is not None, overload["summary"]
    assert overload["recovery_s"] <= bound, (overload["recovery_s"], bound)


def test_goodput_is_measured(overload):
    assert overload["goodput_source"] == "server" and 0 < overload["goodput_fraction"]
    print(
        f"goodput {overload['goodput_fraction']:.2f} of capacity; model busy {overload['busy_share']:.2f} of the "
        f"burst, a run {overload['compute_slowdown']:.2f}x its baseline time"
    )
