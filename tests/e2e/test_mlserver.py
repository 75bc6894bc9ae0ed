"""`latlab loadtest` and `latlab report` against a real third-party Open Inference Protocol server:
MLServer (PyPI `mlserver`, pinned in the test extra) serving the tiny ONNX model through a dozen-line custom
runtime on ONNX Runtime, on free ports of 127.0.0.1. A short sweep, the report of it alone, and merged with a
latlab run of the same model: the server dimension. A server that cannot start fails the test with one line
saying why, never a skip; the server is stopped however the test ends."""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
import requests

from latlab.common.procs import free_port
from latlab.loadtest.results import read_results, write_results
from tests.conftest import TINY_IN, TINY_OUT
from tests.e2e.test_loadtest import CLI

pytestmark = pytest.mark.e2e
MLSERVER_VERSION = "1.7.1"  # as pinned in pyproject.toml's test extra
START_S = 90.0
SHORT = ["--rates", "20,50", "--step-seconds", "1.5", "--warmup-seconds", "0.3", "--max-windows", "3"]
RUNTIME = Path(__file__).parents[2] / "benchmarks" / "mlserver_runtime.py"
"""The runtime the other-servers benchmark serves with: an ONNX file through ONNX Runtime on one CPU thread."""


def distinct_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def write_repository(folder: Path, model: Path, name: str, ports: list[int]) -> None:
    """MLServer's settings (ports of 127.0.0.1; parallel_workers 0: the model runs in the server's process, which
    also avoids its worker pool's uvloop start-up failure on Python 3.11) and one model served by OnnxModel."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "runtime.py").write_text(RUNTIME.read_text())
    (folder / "model.onnx").write_bytes(model.read_bytes())
    http, grpc, metrics = ports
    (folder / "settings.json").write_text(
        json.dumps(
            {
                "host": "127.0.0.1",
                "http_port": http,
                "grpc_port": grpc,
                "metrics_port": metrics,
                "parallel_workers": 0,
                "debug": False,
                "load_models_at_startup": True,
            }
        )
    )
    (folder / "model-settings.json").write_text(
        json.dumps(
            {
                "name": name,
                "implementation": "runtime.OnnxModel",
                "parameters": {"uri": str(folder / "model.onnx")},
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, TINY_IN]}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, TINY_OUT]}],
            }
        )
    )


CAUSE = re.compile(r"^(?:[A-Za-z_]\w*\.)+[A-Z]\w*: \S|^[A-Z]\w*(?:Error|Exception): \S")
"""A traceback's last line: 'onnxruntime.capi....InvalidProtobuf: ...', 'ValueError: ...'."""
NOISE = ("CancelledError", "KeyboardInterrupt")
"""What the server's own shutdown raises after the cause."""


def why_it_ended(log: Path) -> str:
    """The first exception the server's log names (not its shutdown's), else its last line."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    causes = [line for line in lines if CAUSE.match(line) and not any(n in line for n in NOISE)]
    return (causes[:1] or lines[-1:] or ["(no output)"])[0][:300]


@contextmanager
def mlserver(folder: Path, model: Path, name: str = "tiny") -> Iterator[str]:
    """MLServer serving `model` as `name`; yields its URL. Fails the test with one line when it cannot start."""
    script = Path(sys.executable).parent / "mlserver"
    if not script.exists():
        pytest.fail(
            f"MLServer cannot start: no {script} (pip install -e '.[test]' installs the pinned mlserver)", pytrace=False
        )
    http, *rest = distinct_ports(3)
    write_repository(folder, model, name, [http, *rest])
    log = folder / "mlserver.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(script), "start", str(folder)],
            cwd=folder,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(folder)},
        )
    host = f"http://127.0.0.1:{http}"
    try:
        why = wait_ready(process, f"{host}/v2/models/{name}/ready", log)
        if why:
            pytest.fail(f"MLServer could not start on this machine: {why}", pytrace=False)
        yield host
    finally:
        stop(process)


def wait_ready(process: subprocess.Popen, url: str, log: Path) -> str:
    """'' once `url` answers 200; else why not: the process ended, or it was not ready in time."""
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return f"it exited with code {process.returncode}: {why_it_ended(log)}"
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return ""
        except requests.RequestException:
            pass
        time.sleep(0.5)
    return f"{url} not ready after {START_S:.0f} s: {why_it_ended(log)}"


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (it is a session of its own), SIGKILL after 15 s."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=15)


def run_cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    result = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def test_a_real_mlserver_is_swept_reported_and_put_beside_latlab(tmp_path: Path, tiny_model: Path) -> None:
    run = tmp_path / "mlserver-run"
    with mlserver(tmp_path / "repository", tiny_model) as host:
        assert requests.get(f"{host}/v2/models/tiny/config", timeout=5).status_code == 404  # no latlab extras
        swept = run_cli(
            "loadtest", "--host", host, "--deployment", "tiny", "--provider", "cpu", "--out", str(run), *SHORT
        )
    said = [line for line in swept.stdout.splitlines() if line.startswith(f"server at {host}")]
    assert len(said) == 1, swept.stdout  # its missing extras, said once
    assert "GET /v2/models/tiny/config answered 404" in said[0] and "no server figures" in said[0], said[0]
    (doc,) = read_results(run / "results.json")
    (curve,) = doc.deployments
    assert curve.server == {"name": "mlserver", "version": MLSERVER_VERSION}
    assert curve.provider == "cpu" and curve.provider_from == "--provider"
    assert [s.target for s in curve.steps] == [20, 50]
    for step in curve.steps:
        assert step.errors == 0 and step.ok > 0 and step.samples > 0, step
        assert not step.server_interrupted and step.server is None

    slos = ["--slo", "100ms,1s"]
    run_cli("report", str(run), *slos)
    page = (run / "report.html").read_text()
    assert "Compared: MLServer: CPU, thread count not recorded" in page  # a CPU because --provider said so
    assert "tiny (cpu, batcher settings unknown)" in page and "the report shows the client side only" in page
    assert "by server" not in page  # one server: no server dimension

    # A latlab run of the same model on the same machine (SYNTHETIC: the MLServer figures, twice the throughput),
    # merged: the answer names the best server per SLO, tables and curves name each curve's server.
    latlab = tmp_path / "SYNTHETIC-latlab-run"
    twin = copy.deepcopy(doc)
    twin.run_id = latlab.name
    for deployment in twin.deployments:
        deployment.server = {"name": "latlab", "version": "0.1.0"}
        deployment.batcher = {"max_batch_size": 32, "max_queue_delay_ms": 2.0, "instances": 1}
        deployment.settings_unknown = None
        for step in deployment.steps:
            step.achieved_rps *= 2
    write_results(latlab / "results.json", twin)
    merged = tmp_path / "merged"
    run_cli("report", str(run), str(latlab), "--out", str(merged), *slos)
    page = (merged / "report.html").read_text()
    assert "Compared: latlab vs MLServer: CPU, thread count not recorded" in page
    assert "tiny, by server: at p99 ≤ 100 ms " in page
    assert "at p99 ≤ 1000 ms latlab serves the most" in page and "MLServer " in page
    for column in ("latlab, cpu", "MLServer, cpu"):
        assert f"<th colspan='3'>{column} (CPU, thread count not recorded)</th>" in page, column
    assert "tiny (MLServer, cpu, batcher settings unknown)" in page
    assert "tiny (latlab, cpu, batch ≤ 32, wait ≤ 2 ms)" in page
    assert "tiny (MLServer) on " in page  # the steps' table says whose steps they are


def test_a_server_that_cannot_start_fails_the_test_with_one_line(tmp_path: Path) -> None:
    """What a machine where MLServer cannot start shows: one line with the server's own reason, not a skip."""
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an ONNX file")
    with pytest.raises(pytest.fail.Exception) as failed:
        with mlserver(tmp_path / "repository", broken):
            pass
    said = str(failed.value)
    assert said.startswith("MLServer could not start on this machine: it exited with code ") and "\n" not in said
    assert "INVALID_PROTOBUF" in said or "Protobuf parsing failed" in said, said
