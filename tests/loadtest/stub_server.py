"""A real HTTP server speaking just enough of the Open Inference Protocol to load-test the load tester:
it stalls on a schedule, or serves exactly K requests per second. In a thread of the test (`stub_server`),
or as its own process that can be killed and restarted on the same port (`StubProcess`):

    python -m tests.loadtest.stub_server --port 8123 [--capacity 300]

`standard_only=True`: a third-party OIP server, only the standard routes (GET /v2 without metrics_port, model
metadata, ready, infer; no /config, no /metrics); with `triton_metrics_path` too, it serves Triton's standard
counters there (the captured triton_metrics.txt, model "ffn" relabelled "m", advanced by what the stub serves).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import logging

from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access line per request drowns test output

METADATA = {
    "name": "m",
    "versions": ["1"],
    "platform": "stub",
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}],
}
DYNAMIC_METADATA = {**METADATA, "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, -1]}]}
CONFIG = {"name": "m", "model": "stub", "provider": "cpu", "batcher": {"max_batch_size": 1}}
SERVER = {"name": "stub-oip", "version": "0.1", "extensions": []}
TRITON_METRICS = Path(__file__).with_name("triton_metrics.txt")
"""A /metrics text captured from Triton 2.x (models ffn and ffn_b64), the base the stub's counters add to."""
TRITON_BATCH = 2
"""The stub's Triton counters count one model execution per this many requests (a batcher's average batch)."""


def advance(text: str, model: str, add: dict[str, float]) -> str:
    """A Prometheus text with the samples of `model` (label model="...") of each counter in `add` raised by its
    amount: the same server a while later. A counter with a `reason` label is raised only for reason="REJECTED"."""
    lines = []
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if (
            not line.startswith("#")
            and name in add
            and f'model="{model}"' in line
            and ("reason=" not in line or 'reason="REJECTED"' in line)
        ):
            head, value = line.rsplit(" ", 1)
            total = float(value) + add[name]
            line = f"{head} {int(total) if total == int(total) else total}"
        lines.append(line)
    return "\n".join(lines) + "\n"


class StubModel:
    """stall_every/stall_for: every `stall_every` s, requests wait out a `stall_for` s stall;
    capacity: one request at a time, each taking 1/capacity s; slow_every/slow_for: every `slow_every`-th request
    takes `slow_for` s, the others none (a known tail: exactly 1/slow_every of the answers are slow);
    dynamic: its input's second axis is dynamic too, and `sizes` notes each request's size along it; max_length:
    the most it takes along it, in its metadata (as a text deployment's)."""

    def __init__(
        self,
        stall_every: float = 0.0,
        stall_for: float = 0.0,
        capacity: float = 0.0,
        slow_every: int = 0,
        slow_for: float = 0.0,
        dynamic: bool = False,
        max_length: int = 0,
    ) -> None:
        self.stall_every, self.stall_for, self.capacity = stall_every, stall_for, capacity
        self.slow_every, self.slow_for = slow_every, slow_for
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.next_free = 0.0
        self.served = 0
        self.metadata = DYNAMIC_METADATA if dynamic else METADATA
        if max_length:  # says its maximum size as a text deployment does
            self.metadata = {**self.metadata, "parameters": {"max_length": max_length}}
        self.sizes: list[int] = []
        """Each infer request's size along the dynamic axis (a dynamic stub), as the server read it."""
        self.arrived: list[float] = []
        """When each infer request reached the server (time.time()): the arrivals as the server saw them."""
        self.service_s: list[float] = []
        """Each infer request's time in the stub as it really passed, from its start to its answer encoded (a sleep
        overshoots on a busy machine; reading the body and encoding the answer take time too)."""
        self.triton = {"requests": 0, "request_us": 0, "input_us": 0, "infer_us": 0, "output_us": 0}
        """What a Triton serving this model would have counted (standard_only stub with Triton metrics)."""

    def count(self, began: float, read: float, served: float, answered: float) -> None:
        """One request's Triton-style times (perf_counter instants): input until read, infer until served,
        output until the answer was encoded; no queue (the stub never queues a request before serving it).
        Whole microseconds, as Triton counts them: the parts never add up to more than the request."""
        parts = [int((read - began) * 1e6), int((served - read) * 1e6), int((answered - served) * 1e6)]
        with self.lock:
            counts = self.triton
            counts["requests"] += 1
            counts["request_us"] += max(round((answered - began) * 1e6), sum(parts))
            for key, value in zip(("input_us", "infer_us", "output_us"), parts):
                counts[key] += value

    def triton_text(self) -> str:
        """Triton's /metrics for this model: the captured text, ffn relabelled m, plus what the stub served."""
        with self.lock:
            counts = dict(self.triton)
        n = counts["requests"]
        base = TRITON_METRICS.read_text().replace('model="ffn",', 'model="m",')
        return advance(
            base,
            "m",
            {
                "nv_inference_request_success": n,
                "nv_inference_count": n,
                "nv_inference_exec_count": -(-n // TRITON_BATCH),
                "nv_inference_request_duration_us": counts["request_us"],
                "nv_inference_queue_duration_us": 0,
                "nv_inference_compute_input_duration_us": counts["input_us"],
                "nv_inference_compute_infer_duration_us": counts["infer_us"],
                "nv_inference_compute_output_duration_us": counts["output_us"],
            },
        )

    def serve(self) -> None:
        if self.slow_every:
            with self.lock:
                self.served += 1
                slow = self.served % self.slow_every == 0
            time.sleep(self.slow_for if slow else 0.0)
            return
        if self.capacity:
            # Absolute slots, one every 1/capacity s: sleep overshoot never accumulates into lost capacity.
            with self.lock:
                self.next_free = max(time.monotonic(), self.next_free) + 1.0 / self.capacity
                slot_end = self.next_free
            time.sleep(max(0.0, slot_end - time.monotonic()))
        elif self.stall_every:
            phase = (time.monotonic() - self.started) % self.stall_every
            if phase > self.stall_every - self.stall_for:
                time.sleep(self.stall_every - phase)
        self.served += 1


def _app(model: StubModel, standard_only: bool = False, triton_metrics_path: str | None = None):
    def app(environ, start_response):
        request = Request(environ)
        path = request.path
        if triton_metrics_path and path == triton_metrics_path:
            response = Response(model.triton_text(), content_type="text/plain; version=0.0.4")
        elif path == "/metrics" and not standard_only:
            response = Response("", content_type="text/plain")
        elif path == "/v2" and standard_only:
            response = Response(json.dumps(SERVER), content_type="application/json")
        elif path in ("/v2/health/ready", "/v2/health/live", "/v2/models/m/ready"):
            response = Response("", status=200)
        elif path == "/v2/models/m":
            response = Response(json.dumps(model.metadata), content_type="application/json")
        elif path == "/v2/models/m/config" and not standard_only:
            response = Response(json.dumps(CONFIG), content_type="application/json")
        elif path == "/v2/models/m/infer" and request.method == "POST":
            model.arrived.append(time.time())
            began = time.perf_counter()
            data = request.get_data()
            if model.metadata["inputs"] is DYNAMIC_METADATA["inputs"]:
                model.sizes.append(json.loads(data)["inputs"][0]["shape"][1])
            read = time.perf_counter()
            model.serve()
            served = time.perf_counter()
            body = {
                "model_name": "m",
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [1, 4], "data": [0, 0, 0, 0]}],
            }
            response = Response(json.dumps(body), content_type="application/json")
            model.count(began, read, served, time.perf_counter())
            model.service_s.append(time.perf_counter() - began)
        else:
            response = Response('{"error": "not found"}', status=404, content_type="application/json")
        return response(environ, start_response)

    return app


@contextmanager
def stub_server(model: StubModel, standard_only: bool = False, triton_metrics_path: str | None = None) -> Iterator[str]:
    """Serve on a free port of 127.0.0.1 in a background thread; always shut down. `standard_only` and
    `triton_metrics_path`: see the module's docstring."""
    server = make_server("127.0.0.1", 0, _app(model, standard_only, triton_metrics_path), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=5)


class StubProcess:
    """The stub as a child process on a fixed port of 127.0.0.1: `stop()` it mid-run (connections reset,
    new ones refused) and `start()` it again on the same port, like a server restart."""

    def __init__(self, port: int, capacity: float = 0.0, log_path: Path | None = None) -> None:
        self.port, self.capacity, self.log_path = port, capacity, log_path
        self.host = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        from latlab.common import procs

        root = str(Path(__file__).resolve().parents[2])  # `tests` must import in the child, wherever it runs
        path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
        self.process = procs.start(
            [
                sys.executable,
                "-m",
                "tests.loadtest.stub_server",
                "--port",
                str(self.port),
                "--capacity",
                str(self.capacity),
            ],
            log_path=self.log_path,
            env={"PYTHONPATH": path},
        )
        procs.wait_ready(f"{self.host}/v2/models/m", self.process, timeout_s=30, log_path=self.log_path)

    def stop(self) -> None:
        from latlab.common import procs

        if self.process is not None:
            procs.stop(self.process)


@contextmanager
def stub_process(port: int, capacity: float = 0.0, log_path: Path | None = None) -> Iterator[StubProcess]:
    """A started StubProcess, always stopped at the end."""
    stub = StubProcess(port, capacity, log_path)
    try:
        stub.start()
        yield stub
    finally:
        stub.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the load tester's stub inference server, on 127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--capacity", type=float, default=0.0, help="requests/s served, one at a time (0: no limit)")
    args = parser.parse_args(argv)
    make_server("127.0.0.1", args.port, _app(StubModel(capacity=args.capacity)), threaded=True).serve_forever()


if __name__ == "__main__":
    main()
