"""The real server as its own process for the reliability tests: configs, start/stop, valid traffic alongside."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections import Counter
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import onnx
import orjson
import psutil
import pytest
import requests
from onnx import TensorProto, helper, numpy_helper

from latlab.common import procs

from tests.conftest import build_tiny_model, tiny_weights

CLI = [sys.executable, "-m", "latlab.cli"]
MAX_BODY = 64 * 1024
"""The shared server's max_body_bytes: small, so over-limit bodies are cheap to send."""
MAX_BATCH = 8
POISON = 99
"""An index the poison model's Gather cannot take: ONNX Runtime raises inside the batch run."""


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


def write_config(path: Path, deployments: list[dict], **server: object) -> Path:
    """A TOML server config: [server] keys and [[deployments]] with optional tables ([batcher], [tokenizer])."""
    lines = ["[server]", *(f"{k} = {toml_value(v)}" for k, v in server.items())]
    for deployment in deployments:
        tables = {k: v for k, v in deployment.items() if isinstance(v, dict)}
        lines += ["[[deployments]]", *(f"{k} = {toml_value(v)}" for k, v in deployment.items() if k not in tables)]
        for key, table in tables.items():
            lines += [f"[deployments.{key}]", *(f"{k} = {toml_value(v)}" for k, v in table.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class Server:
    """A running `latlab serve` process."""

    url: str
    process: subprocess.Popen
    log: Path
    session: requests.Session = field(default_factory=requests.Session)
    in_process: bool = False
    """Serving in `latlab serve`'s own process, with no worker under it (the native interface): seen at start."""

    def worker(self) -> psutil.Process:
        """The process holding the models: Granian's one worker, the engine of a server with several front
        ends (LATLAB_FRONTENDS=2 runs these tests so), or the server itself under the native interface."""
        children = psutil.Process(self.process.pid).children()
        engines = [c for c in children if "latlab.server.processes.engine" in " ".join(c.cmdline())]
        if engines:
            return engines[0]
        if self.in_process:
            return psutil.Process(self.process.pid)
        (child,) = children
        return child

    def alive(self) -> bool:
        """The server and every process under it run."""
        if self.process.poll() is not None:
            return False
        children = psutil.Process(self.process.pid).children()
        if not children:
            return self.in_process
        return all(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children)

    def infer(self, body: bytes, model: str = "tiny", headers: dict | None = None) -> requests.Response:
        return self.session.post(
            f"{self.url}/v2/models/{model}/infer",
            data=body,
            headers={"Content-Type": "application/json", **(headers or {})},
            timeout=15,
        )

    def metric(self, name: str, **labels: str) -> float:
        """One sample from /metrics (0 when absent)."""
        label_text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        prefix = f"{name}{{{label_text}}} " if labels else f"{name} "
        for line in self.session.get(f"{self.url}/metrics", timeout=10).text.splitlines():
            if line.startswith(prefix):
                return float(line.split()[-1])
        return 0.0


@contextlib.contextmanager
def running_server(
    folder: Path, deployments: list[dict], env: dict | None = None, **server: object
) -> Iterator[Server]:
    """Start `latlab serve` on a free 127.0.0.1 port, wait until ready, and always stop it."""
    port = procs.free_port()
    config = write_config(folder / "server.toml", deployments, port=port, **server)
    log = folder / "server.log"
    process = procs.start([*CLI, "serve", "--config", str(config)], log_path=log, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_live(url, process, log)
        yield Server(url, process, log, in_process=not psutil.Process(process.pid).children())
    finally:
        procs.stop(process)


def wait_live(url: str, process, log: Path, timeout_s: float = 60.0) -> None:
    """Wait for /v2/health/live (ready may rightly stay 400 when a deployment failed to load)."""
    procs.wait_ready(f"{url}/v2/health/live", process, timeout_s=timeout_s, log_path=log)


def tiny_body(x: np.ndarray, **extra: object) -> bytes:
    tensor = {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.reshape(-1).tolist()}
    return orjson.dumps({"inputs": [tensor], **extra})


def tiny_y(x: np.ndarray) -> np.ndarray:
    w, b = tiny_weights()
    return x @ w + b


def output_of(response: requests.Response, shape: tuple[int, ...]) -> np.ndarray:
    return np.array(response.json()["outputs"][0]["data"], np.float32).reshape(shape)


def assert_error(response: requests.Response, status: int, *fragments: str) -> str:
    """A 4xx/5xx whose body is exactly {"error": "..."} containing every fragment."""
    assert response.status_code == status, (response.status_code, response.content[:300])
    assert response.headers["Content-Type"].startswith("application/json")
    doc = response.json()
    assert set(doc) == {"error"} and isinstance(doc["error"], str) and doc["error"]
    for fragment in fragments:
        assert fragment in doc["error"], (fragment, doc["error"])
    return doc["error"]


class ValidTraffic:
    """Valid requests sent one after another on a thread while a test misbehaves; each answer is checked."""

    def __init__(self, server: Server) -> None:
        self._server = server
        self._stop = threading.Event()
        self.sent = 0
        self.correct = 0
        self.failures: list[str] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        session = requests.Session()
        rng = np.random.default_rng(0)
        while not self._stop.is_set():
            x = rng.standard_normal((int(rng.integers(1, MAX_BATCH + 1)), 4)).astype(np.float32)
            self.sent += 1
            try:
                response = session.post(
                    f"{self._server.url}/v2/models/tiny/infer",
                    data=tiny_body(x),
                    headers={"Content-Type": "application/json"},
                    timeout=15,
                )
                if response.status_code == 200 and np.allclose(
                    output_of(response, (len(x), 3)), tiny_y(x), rtol=1e-4, atol=1e-5
                ):
                    self.correct += 1
                else:
                    self.failures.append(f"{response.status_code} {response.content[:200]!r}")
            except (requests.RequestException, ValueError) as exc:
                self.failures.append(repr(exc))

    def __enter__(self) -> "ValidTraffic":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        deadline = time.monotonic() + 10
        while self.sent < 2 and time.monotonic() < deadline:  # at least two overlapped the test's requests
            time.sleep(0.01)
        self._stop.set()
        self._thread.join(20)


@pytest.fixture
def valid_traffic(shared_server: Server) -> Iterator[ValidTraffic]:
    """Valid traffic during the test; the test fails if any valid request was not answered correctly."""
    with ValidTraffic(shared_server) as traffic:
        yield traffic
    COUNTS["valid requests alongside"] += traffic.sent
    COUNTS["valid requests answered correctly"] += traffic.correct
    assert not traffic.failures, traffic.failures[:3]
    assert traffic.correct == traffic.sent >= 2


COUNTS: Counter = Counter()
"""What the reliability tests threw at real servers, printed at the end of the run (the README's figures)."""


def pytest_terminal_summary(terminalreporter) -> None:
    if COUNTS:
        terminalreporter.write_line("reliability: " + ", ".join(f"{k} {v}" for k, v in sorted(COUNTS.items())))


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One tiny-model server for the bad-input, body-limit and property tests (64 KiB bodies, batches of 8)."""
    folder = tmp_path_factory.mktemp("shared-server")
    model = build_tiny_model(folder / "tiny" / "model.onnx")
    deployments = [
        {"name": "tiny", "model_path": str(model), "batcher": {"max_batch_size": MAX_BATCH, "max_queue_delay_ms": 1}}
    ]
    with running_server(folder, deployments, max_body_bytes=MAX_BODY) as server:
        procs.wait_ready(f"{server.url}/v2/health/ready", server.process, timeout_s=30, log_path=server.log)
        yield server
        assert server.alive(), "the shared server died"


def build_poison_model(path: Path) -> Path:
    """y = x + table[i]: x FP32 [batch, 4], i INT64 [batch]; an index past the table's 8 rows (POISON) makes
    ONNX Runtime's Gather raise at run time, where no validation before the queue can see it."""
    table = np.arange(32, dtype=np.float32).reshape(8, 4)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "i"], ["row"], axis=0), helper.make_node("Add", ["x", "row"], ["y"])],
        "poison",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("i", TensorProto.INT64, ["batch"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[numpy_helper.from_array(table, "table")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path
