"""A real short sweep against the real server process records the server's own figures per step, and the
report built from it shows where the time goes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from latlab.common import procs
from latlab.loadtest.results import read_results
from latlab.report.write import write_report

from .test_report_browser import first_screen_problems, probe

pytestmark = pytest.mark.e2e
CLI = [sys.executable, "-m", "latlab.cli"]


@pytest.fixture
def host(tmp_path: Path, tiny_model: Path):
    port = procs.free_port()
    config = tmp_path / "lab.toml"
    config.write_text(
        f'[server]\nport = {port}\n[[deployments]]\nname = "tiny"\nmodel_path = "{tiny_model}"\n'
        "[deployments.batcher]\nmax_batch_size = 4\nmax_queue_delay_ms = 2\n"
    )
    log = tmp_path / "server.log"
    process = procs.start([*CLI, "serve", "--config", str(config)], log_path=log)
    try:
        procs.wait_ready(f"http://127.0.0.1:{port}/v2/health/ready", process, timeout_s=60, log_path=log)
        yield f"http://127.0.0.1:{port}"
    finally:
        procs.stop(process)


def test_a_real_sweep_records_server_figures_and_the_report_breaks_the_time_down(host: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = subprocess.run(
        [
            *CLI,
            "loadtest",
            "--host",
            host,
            "--deployment",
            "tiny",
            "--rates",
            "60",
            "--step-seconds",
            "2",
            "--warmup-seconds",
            "0.5",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = read_results(out)
    (step,) = run.deployments[0].steps
    figures = step.server
    assert figures["seconds"] > 0 and figures["request_count"] > 0
    assert 0 < figures["queue_s"] <= figures["request_s"] and 0 < figures["compute_s"] < figures["request_s"]
    assert 0 < figures["busy_share"] < 1
    assert 0 < figures["process_cpu_cores"] < 2.5  # the server's own process (2 cores here, a little slack)
    assert "input_transfer_s" not in figures  # on CPU ORT reads the arrays in place: no transfer observed
    report = write_report(out, [0.5])  # an SLO this run surely meets
    page = report.read_text()
    assert "tiny: where the time goes" in page and "No server figures" not in page
    assert (out / "time-tiny.png").is_file()
    # What `make lab` gives on a CPU box, in a real browser: the answer on the first screen, every image loaded.
    assert first_screen_problems(probe(report, tmp_path / "profile")) == []
