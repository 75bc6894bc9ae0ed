"""The real thing: the server as its own process under Granian, real Locust against it, the lab end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import requests

from latlab.common import procs
from latlab.loadtest.results import read_results

from ..report.test_report_browser import first_screen_problems, probe

pytestmark = pytest.mark.e2e
CLI = [sys.executable, "-m", "latlab.cli"]


def write_config(path: Path, model: Path, port: int, max_batch_size: int = 8) -> Path:
    path.write_text(f"""
[server]
port = {port}
[[deployments]]
name = "tiny"
model_path = "{model}"
[deployments.batcher]
max_batch_size = {max_batch_size}
max_queue_delay_ms = 2
""")
    return path


@pytest.fixture
def server(tmp_path, tiny_model):
    port = procs.free_port()
    config = write_config(tmp_path / "lab.toml", tiny_model, port)
    log = tmp_path / "server.log"
    process = procs.start([*CLI, "serve", "--config", str(config)], log_path=log)
    try:
        procs.wait_ready(f"http://127.0.0.1:{port}/v2/health/ready", process, timeout_s=60, log_path=log)
        yield f"http://127.0.0.1:{port}", process
    finally:
        procs.stop(process)
    assert process.poll() is not None


def test_server_process_answers_the_protocol_and_survives_bad_input(server):
    host, process = server
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    good = {"id": "7", "inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": x.tolist()}]}
    bad_bodies = [
        b"{not json",
        b'{"inputs": []}',
        json.dumps({"inputs": [{**good["inputs"][0], "name": "z"}]}).encode(),
        json.dumps({"inputs": [{**good["inputs"][0], "datatype": "INT64", "data": [1] * 8}]}).encode(),
    ]
    for body in bad_bodies:
        response = requests.post(f"{host}/v2/models/tiny/infer", data=body, timeout=10)
        assert response.status_code == 400
        assert response.json()["error"]
    assert requests.post(f"{host}/v2/models/nope/infer", json=good, timeout=10).status_code == 404
    response = requests.post(f"{host}/v2/models/tiny/infer", json=good, timeout=10)
    assert response.status_code == 200
    body = response.json()
    assert body["id"] == "7" and body["outputs"][0]["shape"] == [2, 3]
    assert process.poll() is None


@pytest.mark.parametrize("encoding", ["json", "binary"])
def test_locust_sweep_against_the_real_server(server, tmp_path, encoding):
    host, _ = server
    out = tmp_path / "run"
    binary = ["--binary"] if encoding == "binary" else []
    result = subprocess.run(
        [
            *CLI,
            "loadtest",
            "--host",
            host,
            "--deployment",
            "tiny",
            "--rates",
            "40,120",
            "--step-seconds",
            "2",
            "--warmup-seconds",
            "0.5",
            "--out",
            str(out),
            *binary,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (doc,) = read_results(out / "results.json")
    assert doc.payload["encoding"] == encoding  # every request below was answered 200 in it
    (deployment,) = doc.deployments
    assert deployment.name == "tiny" and deployment.batcher.max_batch_size == 8
    assert [s.target_rps for s in deployment.steps] == [40, 120]
    for step in deployment.steps:
        assert step.errors == 0 and step.ok > 0
        # Offered counts requests by their intended time, so it holds the generator to its schedule; achieved
        # counts completions in the window, which after a stall of this VM include the warm-up's backlog.
        assert 0.6 * step.target_rps < step.offered_rps < 1.4 * step.target_rps
        assert step.achieved_rps > 0.6 * step.target_rps
        assert 0 < step.p50_s <= step.p90_s <= step.p99_s <= step.max_s < step.window_seconds
        assert step.avg_batch_size >= 1.0
    assert "offered" in result.stdout and "p99" in result.stdout  # the live progress lines


def test_lab_runs_end_to_end_and_stops_everything(tmp_path):
    from latlab.lab.run import run_lab
    from latlab.lab.plan import LabPlan, ModelPlan

    plan = LabPlan(
        models=(
            ModelPlan("mlp", rates=(50, 150)),
            ModelPlan("ffn", {"d_model": 16, "n_layers": 2}, rates=(50, 150), binary=True),
        ),
        step_seconds=0.5,
        warmup_seconds=0.3,
        max_windows=3,
        bench=False,
        raise_cap=1.0,
        slo_steps=0,
    )
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    report = run_lab(tmp_path / "runs", tmp_path / "models", plan)
    assert report.is_file() and "data:image/png;base64," in report.read_text()
    assert "(not saturated)" in report.read_text()  # the verdict's maxima are lower bounds, and say so
    for model in ("mlp", "ffn"):
        (doc,) = read_results(report.parent / model / "results.json")
        assert doc.run_id == report.parent.name  # one run label across the models' sweeps
        assert [d.name for d in doc.deployments] == [f"{model}-b1", f"{model}-batch"]
        assert all(len(d.steps) == 2 and not any(s.errors for s in d.steps) for d in doc.deployments)
        # the brackets are recorded for every SLO even with no step to spend on them (slo_steps 0)
        assert all(len(d.slo_brackets) == 4 and d.slo_steps == 0 for d in doc.deployments)
        # no raising past the listed rates here (raise_cap 1): 150 req/s is far below capacity, and says so
        assert all(d.saturated is False and d.rate_cap_rps == 150 for d in doc.deployments)
        assert doc.payload["encoding"] == ("binary" if model == "ffn" else "json")
    left = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert not left, f"lab left processes running: {left}"
    # The lab's own report answers on its first screen in a real browser, every picture loaded.
    assert first_screen_problems(probe(report, tmp_path / "chromium-profile")) == []


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "does not exist"),
        ("[server\nport = 1", "not valid TOML"),
        ('[[deployments]]\nname = "m"\nmodel_path = "missing.onnx"\n', "missing.onnx does not exist"),
    ],
)
def test_serve_refuses_bad_config_with_one_line(tmp_path, content, expected):
    config = tmp_path / "lab.toml"
    if content is not None:
        config.write_text(content)
    result = subprocess.run([*CLI, "serve", "--config", str(config)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert expected in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def _interruptible() -> None:
    """In the child before exec: SIGINT handled and unblocked, as from a terminal. A child inherits
    ignored and blocked signals, and the test process may have either state by the time this test runs
    in the full suite (there the lab twice never acted on the Ctrl-C, while alone it always did)."""
    import signal

    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _signal_state(pid: int) -> str:
    """The process's blocked, ignored and caught signal masks, for a failure message."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return " ".join(line for line in lines if line.startswith(("SigBlk", "SigIgn", "SigCgt")))


@pytest.mark.parametrize("sent, status", [("SIGINT", 130), ("SIGTERM", 143)], ids=["ctrl-c", "kill"])
def test_ctrl_c_or_kill_stops_the_lab_and_everything_it_started(tmp_path, sent, status):
    import signal
    import time

    # The CLI's own interrupt handling (exit 130) around a small plan, so the test need not export the zoo.
    script = (
        "import sys; from latlab.cli import main; from latlab.lab.plan import PLANS, LabPlan, ModelPlan; "
        "PLANS['cpu'] = LabPlan(models=(ModelPlan('mlp', rates=(50,) * 40),), bench=False); "
        f"sys.exit(main(['lab', '--runs-dir', {str(tmp_path / 'runs')!r}, '--models-dir', "
        f"{str(tmp_path / 'models')!r}]))"
    )
    lab = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_interruptible,
    )
    children: list[psutil.Process] = []
    try:
        for line in lab.stdout:  # wait until the server and the load generator both run
            if "sweeping offered load" in line:
                break
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(children) < 3:  # server, its worker, load generator
            children = psutil.Process(lab.pid).children(recursive=True)
            time.sleep(0.2)
        assert len(children) >= 3, f"expected server, worker and load generator, got {children}"
        signals = _signal_state(lab.pid)
        lab.send_signal(getattr(signal, sent))
        # Keep reading: the lab and the load generator it started share this pipe, and a full pipe would
        # block them (the lab would then never exit, whatever its Ctrl-C handling does).
        rest, _ = lab.communicate(timeout=60)
        assert lab.returncode == status, f"{signals}\n{rest[-3000:]}"
        _, alive = psutil.wait_procs(children, timeout=15)
        assert not alive, f"still running after {sent}: {[p.pid for p in alive]}"
    finally:
        if lab.poll() is None:
            lab.kill()
        lab.stdout.close()
        for child in children:  # what a failing lab left behind: the test stops what it started
            if child.is_running():
                child.kill()


def test_curves_rebuilt_from_prometheus_match_the_json(server, tmp_path):
    from latlab.common import prometheus

    host, _ = server
    metrics_port, prom_port = procs.free_port(), procs.free_port()
    config = prometheus.write_config(
        tmp_path / "prometheus.yml",
        {"latlab-server": [host.removeprefix("http://")], "latlab-loadgen": [f"127.0.0.1:{metrics_port}"]},
    )
    prom = prometheus.start(config, tmp_path / "tsdb", prom_port, tmp_path / "prometheus.log")
    url = prometheus.base_url(prom_port)
    try:
        prometheus.wait_ready(url, prom, log_path=tmp_path / "prometheus.log")
        run = tmp_path / "run-prom"
        result = subprocess.run(
            [
                *CLI,
                "loadtest",
                "--host",
                host,
                "--deployment",
                "tiny",
                "--rates",
                "60,150",
                "--step-seconds",
                "3",
                "--warmup-seconds",
                "0.5",
                "--max-windows",
                "3",
                "--metrics-port",
                str(metrics_port),
                "--out",
                str(run),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        rebuilt_dir = tmp_path / "rebuilt"
        report = subprocess.run(
            [*CLI, "report", str(rebuilt_dir), "--from-prometheus", url, "--run", run.name],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert report.returncode == 0, report.stderr[-3000:]
        # The server was scraped too: its histograms are in the same Prometheus.
        assert prometheus.query(url, 'latlab_batcher_batch_size_count{deployment="tiny"}')
    finally:
        procs.stop(prom)
    measured = read_results(run / "results.json")[0].deployments[0].steps
    rebuilt = read_results(rebuilt_dir / "results-prometheus.json")[0].deployments[0].steps
    assert len(rebuilt) == len(measured) == 2
    for want, got in zip(measured, rebuilt):
        for key in ("achieved_rps", "offered_rps", "p50_s", "p99_s"):
            assert getattr(got, key) == pytest.approx(getattr(want, key), rel=0.05), (key, got, want)
    assert (rebuilt_dir / "report.html").is_file()


def test_sigterm_answers_everything_accepted_then_exits_0(tmp_path, tiny_model):
    import signal
    import threading

    port = procs.free_port()
    config = tmp_path / "drain.toml"
    config.write_text(
        f'[server]\nport = {port}\n[[deployments]]\nname = "tiny"\nmodel_path = "{tiny_model}"\n'
        "[deployments.batcher]\nmax_batch_size = 64\nmax_queue_delay_ms = 800\n"
    )
    process = procs.start([*CLI, "serve", "--config", str(config)], log_path=tmp_path / "server.log")
    host = f"http://127.0.0.1:{port}"
    statuses: list = []
    try:
        procs.wait_ready(f"{host}/v2/health/ready", process, timeout_s=60)
        body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}

        def send() -> None:
            try:
                statuses.append(requests.post(f"{host}/v2/models/tiny/infer", json=body, timeout=15).status_code)
            except requests.RequestException as exc:
                statuses.append(repr(exc))

        clients = [threading.Thread(target=send) for _ in range(8)]
        for client in clients:
            client.start()
        time.sleep(0.3)  # all eight are queued, waiting for the batch delay
        os.killpg(process.pid, signal.SIGTERM)
        for client in clients:
            client.join(20)
        assert process.wait(20) == 0
    finally:
        procs.stop(process)
    assert statuses == [200] * 8, statuses
