"""`latlab loadtest` and `latlab report` against a server with only the Open Inference Protocol's standard routes:
no /config, no metrics_port in GET /v2, no latlab_* series; with and without Triton's standard
counters at a metrics URL given with --server-metrics."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.e2e.test_loadtest import CLI, loadtest_said
from tests.loadtest.stub_server import TRITON_BATCH, StubModel, stub_server

pytestmark = pytest.mark.e2e
SHORT = ["--step-seconds", "1.5", "--warmup-seconds", "0.3", "--max-windows", "3"]


def report(run: Path) -> str:
    result = subprocess.run([*CLI, "report", str(run)], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return (run / "report.html").read_text()


def test_a_standard_routes_only_server_is_swept_and_reported_client_side(tmp_path):
    with stub_server(StubModel(), standard_only=True) as host:
        doc, stdout = loadtest_said(host, tmp_path / "oip", "--rates", "50,80", *SHORT)
    said = [line for line in stdout.splitlines() if line.startswith(f"server at {host}")]
    assert len(said) == 1, stdout  # the missing extras, once for the whole run
    assert "GET /v2/models/m/config answered 404 (not a latlab server?): batcher settings unknown" in said[0]
    assert "no server figures" in said[0] and "the report shows the client side only" in said[0]
    curve = doc.deployments[0]
    assert curve.name == "m" and curve.server["name"] == "stub-oip" and curve.provider is None
    assert curve.server_metrics["kind"] is None and curve.settings_unknown
    assert [s.target for s in curve.steps] == [50, 80]
    for step in curve.steps:
        # no metrics to read is not a server that went away
        assert not step.server_interrupted and step.interruption is None, step.interruption
        assert step.errors == 0 and step.samples > 0
        assert step.server is None and step.avg_batch_size is None
    page = report(tmp_path / "oip")
    assert "m: where the time goes" in page and "the report shows the client side only" in page
    assert "batcher settings unknown" in page


def test_triton_counters_at_a_given_url_feed_where_the_time_goes(tmp_path):
    with stub_server(StubModel(), standard_only=True, triton_metrics_path="/triton/metrics") as host:
        doc, stdout = loadtest_said(
            host, tmp_path / "triton", "--rates", "50", "--server-metrics", f"{host}/triton/metrics", *SHORT
        )
    said = [line for line in stdout.splitlines() if line.startswith(f"server at {host}")]
    assert (
        len(said) == 1
        and f"server figures and batch sizes from Triton's nv_inference_* counters at {host}/triton/metrics" in said[0]
    ), stdout
    curve = doc.deployments[0]
    assert curve.server_metrics["kind"] == "triton"
    (step,) = curve.steps
    server = step.server
    assert not step.server_interrupted and server["source"] == "triton"
    assert server["ok_count"] >= step.ok > 0  # the server's count spans the warm-up's end to the last answer
    for key in ("request_s", "input_transfer_s", "compute_s", "output_transfer_s"):
        assert server[key] > 0, (key, server)
    assert server["request_s"] >= server["compute_s"]
    # the stub counts one model run per TRITON_BATCH requests: the average batch comes from Triton's counters
    assert step.avg_batch_size == pytest.approx(TRITON_BATCH, rel=0.1)
    page = report(tmp_path / "triton")
    assert "m: where the time goes" in page and "No server figures" not in page
    assert "From Triton's nv_inference_* counters" in page and "client side only" not in page
