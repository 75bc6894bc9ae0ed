"""The load generator under faults: a Locust worker SIGKILLed mid-run, the server restarted mid-step,
a server that is not there. The run never hangs, says what happened, and its results record it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from latlab.common import procs
from latlab.loadtest.results import Curve, read_results
from tests.loadtest.stub_server import StubModel, stub_process, stub_server

pytestmark = pytest.mark.e2e
CLI = [sys.executable, "-m", "latlab.cli"]
STEP = ["--warmup-seconds", "1", "--step-seconds", "3", "--max-windows", "3"]


def start_loadtest(host: str, out: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*CLI, "loadtest", "--host", host, "--deployment", "m", "--out", str(out), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen, lines: list[str], timeout: float = 120) -> tuple[str, str]:
    """Wait for the run (it must not hang); the stdout lines already read come first."""
    try:
        rest, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise AssertionError(f"the load test hung; its output so far: {''.join(lines)[-2000:]}") from None
    return "".join(lines) + rest, stderr


def read_until(process: subprocess.Popen, marker: str, lines: list[str], timeout_s: float = 60) -> None:
    """Read stdout lines into `lines` until one contains `marker` (the run's progress)."""
    found = threading.Event()

    def reader() -> None:
        for line in process.stdout:
            lines.append(line)
            if marker in line:
                found.set()
                return

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    assert found.wait(timeout_s), f"no {marker!r} in the output: {''.join(lines)[-2000:]}"
    thread.join(1)


def locust_workers(process: subprocess.Popen) -> list[psutil.Process]:
    return [p for p in psutil.Process(process.pid).children(recursive=True) if "--worker" in p.cmdline()]


def test_a_sigkilled_worker_is_reported_and_its_rate_goes_to_the_others(tmp_path):
    out = tmp_path / "run"
    with stub_server(StubModel()) as host:
        run = start_loadtest(host, out, "--workers", "2", "--rates", "60,60,60", "--constant", *STEP)
        lines: list[str] = []
        try:
            read_until(run, "offered", lines)  # step 0 measured: step 1 is starting
            (victim, survivor) = locust_workers(run)
            time.sleep(1.5)
            os.kill(victim.pid, signal.SIGKILL)
            stdout, stderr = finish(run, lines)
        finally:
            if run.poll() is None:
                procs.stop(run)
    assert run.returncode == 0, stderr[-3000:]
    (doc,) = read_results(out / "results.json")
    (event,) = [e for e in doc.events if e["event"] == "worker_lost"]
    assert event["pid"] == victim.pid and event["reason"] == "its process exited (killed by SIGKILL)"
    assert event["step"] == 1 and event["workers_left"] == 1 and "1 worker(s): 60 each" in event["load"]
    assert f"worker {event['worker']} (pid {victim.pid}) LOST during step 1" in stdout  # the progress names it
    steps = doc.deployments[0].steps
    assert len(steps) == 3, doc.deployments[0].stop_reason
    assert steps[1].workers_lost == [event["worker"]] and not steps[2].workers_lost
    assert len(steps[2].sent_by_worker) == 1, "only the survivor sends after the loss"
    assert 0.8 * 60 < steps[2].achieved_rps < 1.2 * 60, "the lost worker's rate went to the survivor"
    assert not psutil.wait_procs([survivor], timeout=10)[1], "the surviving worker was stopped at the end"

    report = subprocess.run([*CLI, "report", str(out)], capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr[-2000:]
    html = (out / "report.html").read_text()
    assert f"Locust worker {event['worker']} (pid {victim.pid}) lost during step 1" in html
    assert f"workers lost: {event['worker']}" in html


def sweep_through_an_outage(tmp_path: Path, restart: bool) -> tuple[str, Curve]:
    """Three 50 req/s steps against the stub, which stops inside step 1's windows (and, with
    `restart`, comes back a second later); returns the sweep's stdout and its deployment results."""
    out = tmp_path / "run"
    with stub_process(procs.free_port(), log_path=tmp_path / "stub.log") as stub:
        run = start_loadtest(stub.host, out, "--rates", "50,50,50", *STEP)
        lines: list[str] = []
        try:
            read_until(run, "offered", lines)
            time.sleep(1.8)  # inside step 1's measured windows
            stub.stop()
            if restart:
                time.sleep(1.0)
                stub.start()
            stdout, stderr = finish(run, lines)
        finally:
            if run.poll() is None:
                procs.stop(run)
    assert run.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    return stdout, read_results(out / "results.json")[0].deployments[0]


def test_a_server_restart_mid_step_is_counted_marked_and_the_sweep_goes_on(tmp_path):
    stdout, deployment = sweep_through_an_outage(tmp_path, restart=True)
    steps = deployment.steps
    assert len(steps) == 3 and deployment.stop_reason.startswith("all loads done")
    interrupted = steps[1]
    assert interrupted.server_interrupted and interrupted.errors > 0
    assert interrupted.by_status["0"]["count"] > 0  # no HTTP answer: refused or reset
    unanswered = interrupted.by_status["0"]["count"]
    assert interrupted.interruption.startswith(f"{unanswered} requests got no HTTP answer (Connection")
    assert not steps[0].server_interrupted and not steps[2].server_interrupted
    assert steps[2].errors == 0 and steps[2].ok > 0, "the load test reconnected after the restart"
    assert "[server interrupted:" in stdout and "the server answers again, going on" in stdout


def test_a_server_that_does_not_come_back_stops_the_sweep_with_its_reason(tmp_path):
    stdout, deployment = sweep_through_an_outage(tmp_path, restart=False)
    assert len(deployment.steps) == 2 and deployment.steps[1].server_interrupted
    reason = deployment.stop_reason
    assert reason.startswith("stopped at 50: the server stopped answering (") and "was not back within 10 s" in reason
    assert "connection refused" in reason
    assert f"m: {reason}" in stdout


@pytest.mark.parametrize(
    "deployment, expected",
    [
        ("m", "cannot reach the server at http://127.0.0.1:{port}/v2/models/m/config (3 tries): connection refused"),
        ("nope", "server at http://127.0.0.1:{port} has no model 'nope': GET /v2/models/nope answered 404"),
    ],
)
def test_an_unreachable_server_or_unknown_deployment_is_one_line(tmp_path, deployment, expected):
    with stub_server(StubModel()) as host:
        port = procs.free_port() if deployment == "m" else int(host.rsplit(":", 1)[1])
        result = subprocess.run(
            [
                *CLI,
                "loadtest",
                "--host",
                f"http://127.0.0.1:{port}",
                "--deployment",
                deployment,
                "--out",
                str(tmp_path / "run"),
                "--rates",
                "10",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("latlab: error: " + expected.format(port=port)), line


def test_a_silent_worker_is_missing_after_3_s_of_no_heartbeat_and_welcomed_back(tmp_path):
    """The path for remote workers (--expect-workers), whose process the master cannot watch: SIGSTOP
    a worker, Locust's heartbeats find it missing; SIGCONT it, it rejoins and gets its share again."""
    out = tmp_path / "run"
    with stub_server(StubModel()) as host:
        run = start_loadtest(host, out, "--workers", "2", "--rates", "60,60,60,60", "--constant", *STEP)
        lines: list[str] = []
        try:
            read_until(run, "offered", lines)
            (silent, _) = locust_workers(run)
            time.sleep(0.5)
            os.kill(silent.pid, signal.SIGSTOP)
            read_until(run, "LOST", lines, timeout_s=30)
            os.kill(silent.pid, signal.SIGCONT)
            stdout, stderr = finish(run, lines)
        finally:
            if psutil.pid_exists(silent.pid):
                os.kill(silent.pid, signal.SIGCONT)
            if run.poll() is None:
                procs.stop(run)
    assert run.returncode == 0, stderr[-3000:]
    (doc,) = read_results(out / "results.json")
    lost, back = doc.events
    assert (lost["event"], lost["reason"], lost["pid"]) == ("worker_lost", "no heartbeat for 3 s", silent.pid)
    assert (back["event"], back["worker"], back["workers_left"]) == ("worker_back", lost["worker"], 2)
    assert f"worker {lost['worker']} is back (heartbeat resumed); 2 workers share the load" in stdout
    last = doc.deployments[0].steps[-1]
    assert len(last.sent_by_worker) == 2, last
    assert last.achieved_rps == pytest.approx(60, rel=0.15), (out / "results.json").read_text()[-6000:]
