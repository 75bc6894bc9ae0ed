"""What the serving benchmarks share: models built without torch, a served config, loadtest runs, /metrics."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import onnx
import orjson
import psutil
import requests
from onnx import TensorProto, helper

from latlab.common import procs
from latlab.loadtest import child
from latlab.loadtest.plan import SweepPlan
from latlab.loadtest.results import RESULTS_FILE, Curve, read_results
from latlab.server.config import BatcherSettings, load_config, save_config
from latlab.server.command import serve_command
from latlab.server.runtime.model import OnnxModel

CLI = [sys.executable, "-m", "latlab.cli"]
"""`latlab` as a user runs it: export_zoo exports in a process of its own (torch stays out of the benchmark's), and
serve_version serves whichever version of the code is on PYTHONPATH."""


def build_cheap_model(path: Path, trailing: list[int], reduce: bool) -> Path:
    """An almost free model with a given input: Identity (output = input), or a global mean per channel
    (output [N, C]), for an image input whose compute should not hide the protocol's cost."""
    if path.exists():
        return path
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", *trailing])
    if reduce:
        nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]), helper.make_node("Flatten", ["p"], ["y"])]
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", trailing[0]])
    else:
        nodes = [helper.make_node("Identity", ["x"], ["y"])]
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", *trailing])
    model = helper.make_model(
        helper.make_graph(nodes, "cheap", [x], [y]), opset_imports=[helper.make_opsetid("", 18)], ir_version=9
    )
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def export_zoo(models_dir: Path, name: str, *args: str) -> Path | None:
    """`latlab export NAME` once into models_dir (reused on later runs); None when the zoo lacks it."""
    path = models_dir / name / "model.onnx"
    if not path.exists():
        done = subprocess.run(
            [*CLI, "export", name, "--models-dir", str(models_dir), *args], capture_output=True, text=True
        )
        if done.returncode:
            print(f"(no {name}: {(done.stderr or done.stdout).strip().splitlines()[-1:]})")
            return None
    return path


def batching(max_batch_size: int, delay_ms: float, adaptive: bool = False) -> dict:
    """Batcher settings; adaptive waiting only where asked and this version of the batcher has it."""
    settings = {"max_batch_size": max_batch_size, "max_queue_delay_ms": delay_ms}
    if adaptive and "adaptive" in {f.name for f in dataclasses.fields(BatcherSettings)}:
        settings["adaptive"] = True
    return settings


def write_config(path: Path, port: int, deployments: dict[str, tuple[Path, dict]]) -> Path:
    """One server, several deployments (name -> model, batcher): ratios between them share the process."""
    cpu = {"intra_op_threads": 1, "allow_spinning": False}
    return save_config(
        {
            "server": {"port": port, "max_body_bytes": 67108864},
            "deployments": [
                {"name": name, "model_path": model, "cpu": cpu, "batcher": batcher}
                for name, (model, batcher) in deployments.items()
            ],
        },
        path,
    )


@dataclasses.dataclass
class Served:
    url: str
    process: subprocess.Popen

    def worker(self) -> psutil.Process:
        """Granian's worker process, where the models and their memory live."""
        return max(psutil.Process(self.process.pid).children(recursive=True), key=lambda c: c.memory_info().rss)

    def histogram(self, name: str, deployment: str) -> dict[float, float]:
        """Cumulative bucket counts of one deployment's histogram: upper bound -> count."""
        buckets = {}
        for line in requests.get(f"{self.url}/metrics", timeout=10).text.splitlines():
            if line.startswith(f"{name}_bucket{{") and f'deployment="{deployment}"' in line:
                bound = line.split('le="')[1].split('"')[0]
                buckets[float("inf") if bound == "+Inf" else float(bound)] = float(line.split()[-1])
        return dict(sorted(buckets.items()))

    def value(self, name: str, deployment: str) -> float:
        """One sample of one deployment (a counter, or a histogram's `_sum` or `_count`); 0 before any."""
        for line in requests.get(f"{self.url}/metrics", timeout=10).text.splitlines():
            if line.startswith(f"{name}{{") and f'deployment="{deployment}"' in line:
                return float(line.split()[-1])
        return 0.0


@contextlib.contextmanager
def serving(config: Path, port: int, log: Path) -> Iterator[Served]:
    process = procs.start(serve_command(config), log_path=log)
    try:
        procs.wait_ready(f"http://127.0.0.1:{port}/v2/health/ready", process, timeout_s=120, log_path=log)
        yield Served(f"http://127.0.0.1:{port}", process)
    finally:
        procs.stop(process)


def serve_version(config: Path, port: int, folder: Path, pythonpath: str | None) -> subprocess.Popen:
    """A ready server of `config` running the `latlab` package on `pythonpath` (another version of the code), or
    this checkout's without; started from `folder`, a neutral working directory, so that `-m` finds the version
    asked for and not ./latlab. The command is the user's `latlab serve`, which every version answers (an older
    one may predate `python -m latlab.server`), for this checkout too, so both sides start alike."""
    env = {**os.environ, "PYTHONPATH": pythonpath} if pythonpath else dict(os.environ)
    log = open(folder / f"server-{port}.log", "wb")
    process = subprocess.Popen(
        [*CLI, "serve", "--config", str(config)],
        cwd=folder,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    procs.wait_ready(
        f"http://127.0.0.1:{port}/v2/health/ready", process, timeout_s=120, log_path=folder / f"server-{port}.log"
    )
    return process


def loadtest(
    url: str,
    deployments: list[str],
    out: Path,
    *options: str,
    meanwhile: Callable[[subprocess.Popen], None] | None = None,
) -> list[Curve]:
    """A load test of `deployments` with these `latlab loadtest` options (read into a plan here, see
    SweepPlan.from_options) into `out`; its results' deployments (see run_plan)."""
    host = ["--host", url, *(a for d in deployments for a in ("--deployment", d))]
    return run_plan(SweepPlan.from_options([*host, *options]), out, meanwhile)


def run_plan(plan: SweepPlan, out: Path, meanwhile: Callable[[subprocess.Popen], None] | None = None) -> list[Curve]:
    """Run the load test of `plan` in a child process into `out` and return its results' deployments;
    `meanwhile(process)`, when given, runs in this process while the load test does (it should return once the
    process has ended). The child's output goes to out/loadtest.log, whose end a failure shows."""
    log = out / "loadtest.log"
    process = child.start(plan, out, log_path=log)
    try:
        if meanwhile is not None:
            meanwhile(process)
        process.wait()
    finally:
        procs.stop(process)
    if process.returncode:
        raise RuntimeError(f"the load test of {out} failed:\n{log.read_text(errors='replace')[-4000:]}")
    return read_results(out / RESULTS_FILE)[0].deployments


def quantile(cumulative: dict[float, float], q: float) -> float | None:
    """A quantile from cumulative histogram buckets, linear within a bucket (Prometheus's rule)."""
    bounds, counts = list(cumulative), list(cumulative.values())
    if not counts or counts[-1] <= 0:
        return None
    rank, lower, below = q * counts[-1], 0.0, 0.0
    for bound, count in zip(bounds, counts):
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = bound, count
    return None


def json_infer_body(x: np.ndarray, name: str = "x") -> bytes:
    """An infer request body carrying one FP32 tensor as JSON."""
    return orjson.dumps(
        {"inputs": [{"name": name, "shape": list(x.shape), "datatype": "FP32", "data": x.reshape(-1)}]},
        option=orjson.OPT_SERIALIZE_NUMPY,
    )


def in_process_infer(app, deployment: str, body: bytes) -> Callable[[], bytes]:
    """One JSON infer call through the server's WSGI app in this process (fast path, batcher, ORT, metrics; no
    HTTP, no sockets); raises when the answer is not a result, so an error path is never what gets timed."""

    def call() -> bytes:
        environ = {
            "REQUEST_METHOD": "POST",
            "PATH_INFO": f"/v2/models/{deployment}/infer",
            "wsgi.input": io.BytesIO(body),
            "CONTENT_LENGTH": str(len(body)),
            "CONTENT_TYPE": "application/json",
            "SERVER_NAME": "bench",
            "SERVER_PORT": "1",
            "wsgi.url_scheme": "http",
        }
        answer = b"".join(app.wsgi_app(environ, lambda status, headers: None))
        if b'"outputs"' not in answer:
            raise RuntimeError(answer[:300])
        return answer

    return call


def p50_in_process(run, feeds: dict[str, np.ndarray], n: int = 2000) -> float:
    for _ in range(200):
        run(feeds)
    times = []
    for _ in range(n):
        started = time.perf_counter()
        run(feeds)
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def ort_b1_model(config: Path) -> tuple[OnnxModel, dict[str, np.ndarray]]:
    """In-process ORT with the same session options as the served batch-1 deployment, and a batch-1 input."""
    deployment = next(d for d in load_config(config).deployments if d.name == "ffn-b1")
    model = OnnxModel(deployment)
    spec = model.inputs[0]
    return model, {spec.name: np.random.default_rng(0).standard_normal([1, *spec.shape[1:]]).astype(spec.dtype)}


class RssSampler:
    """The resident memory of a process, sampled every `interval_s` in a thread: (time, bytes)."""

    def __init__(self, process: psutil.Process, interval_s: float = 1.0) -> None:
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(process, interval_s), daemon=True)
        self._thread.start()

    def _run(self, process: psutil.Process, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            with contextlib.suppress(psutil.Error):
                self.samples.append((time.time(), process.memory_info().rss))

    def stop(self) -> list[tuple[float, int]]:
        self._stop.set()
        self._thread.join(5)
        return self.samples
