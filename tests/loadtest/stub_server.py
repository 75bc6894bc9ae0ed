"""A real HTTP server speaking just enough of the Open Inference Protocol to load-test the load tester:
it stalls on a schedule, or serves exactly K requests per second. In a thread of the test (`stub_server`),
or as its own process that can be killed and restarted on the same port (`StubProcess`):

    python -m tests.loadtest.stub_server --port 8123 [--capacity 300]
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

METADATA = {"name": "m", "versions": ["1"], "platform": "stub",
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]}
CONFIG = {"name": "m", "model": "stub", "provider": "cpu", "batcher": {"max_batch_size": 1}}


class StubModel:
    """stall_every/stall_for: every `stall_every` s, requests wait out a `stall_for` s stall;
    capacity: one request at a time, each taking 1/capacity s; slow_every/slow_for: every `slow_every`-th request
    takes `slow_for` s, the others none (a known tail: exactly 1/slow_every of the answers are slow)."""

    def __init__(self, stall_every: float = 0.0, stall_for: float = 0.0, capacity: float = 0.0,
                 slow_every: int = 0, slow_for: float = 0.0) -> None:
        self.stall_every, self.stall_for, self.capacity = stall_every, stall_for, capacity
        self.slow_every, self.slow_for = slow_every, slow_for
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.next_free = 0.0
        self.served = 0

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


def _app(model: StubModel):
    def app(environ, start_response):
        request = Request(environ)
        path = request.path
        if path == "/metrics":
            response = Response("", content_type="text/plain")
        elif path == "/v2/models/m":
            response = Response(json.dumps(METADATA), content_type="application/json")
        elif path == "/v2/models/m/config":
            response = Response(json.dumps(CONFIG), content_type="application/json")
        elif path == "/v2/models/m/infer" and request.method == "POST":
            request.get_data()
            model.serve()
            body = {"model_name": "m", "outputs": [{"name": "y", "datatype": "FP32", "shape": [1, 4],
                                                   "data": [0, 0, 0, 0]}]}
            response = Response(json.dumps(body), content_type="application/json")
        else:
            response = Response('{"error": "not found"}', status=404, content_type="application/json")
        return response(environ, start_response)
    return app


@contextmanager
def stub_server(model: StubModel) -> Iterator[str]:
    """Serve on a free port of 127.0.0.1 in a background thread; always shut down."""
    server = make_server("127.0.0.1", 0, _app(model), threaded=True)
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
        from latlab import procs

        root = str(Path(__file__).resolve().parents[2])  # `tests` must import in the child, wherever it runs
        path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
        self.process = procs.start([sys.executable, "-m", "tests.loadtest.stub_server", "--port", str(self.port),
                                    "--capacity", str(self.capacity)], log_path=self.log_path, env={"PYTHONPATH": path})
        procs.wait_ready(f"{self.host}/v2/models/m", self.process, timeout_s=30, log_path=self.log_path)

    def stop(self) -> None:
        from latlab import procs

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
