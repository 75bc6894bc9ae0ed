"""`latlab plan` end to end on a committed lab run, and the validation of its deployments' replica models."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from latlab.cli import main
from latlab.report.fleetplan.validate import OFF_BY, validation_rows

TRACE = Path(__file__).resolve().parents[2] / "traces" / "AzureLLMInferenceTrace_conv.csv"


@pytest.fixture
def short_trace(tmp_path) -> Path:
    """The shared Azure trace's first 600 requests (Azure Public Dataset, CC-BY 4.0: traces/README.md)."""
    lines = TRACE.read_text().splitlines()[:601]
    path = tmp_path / "short.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_validation_compares_each_deployment_with_what_was_measured(ffn_run):
    rows = validation_rows(ffn_run)
    assert sorted(r["deployment"] for r in rows) == ["ffn-b1", "ffn-batch"]
    for row in rows:
        assert [s["slo_s"] for s in row["slos"]] == [0.01, 0.025, 0.05, 0.1]
        for slo in row["slos"]:
            if slo["measured_rps"] > 0:
                assert slo["error"] == pytest.approx((slo["predicted_rps"] - slo["measured_rps"]) / slo["measured_rps"])
            assert slo["off"] == (not abs(slo["error"]) <= OFF_BY)
        assert row["off"] == any(s["off"] for s in row["slos"])
        assert all(s["predicted_p99_s"] > 0 and s["measured_p99_s"] > 0 for s in row["steps"])
        predicted = [s["predicted_rps"] for s in row["slos"]]
        assert predicted == sorted(predicted) and math.isfinite(predicted[-1])  # a looser SLO never allows less


def test_plan_answers_with_each_fleet_and_the_cheapest(ffn_run, short_trace, capsys):
    argv = ["plan", str(ffn_run), "--traffic", f"trace:{short_trace}", "--trace-rate", "40", "--slo", "p99:100ms"]
    options = ["--price", "cpu=0.10", "--price", "gpu=2.50", "--use-off", "--cold-start", "30", "--sim-seconds", "0.5"]
    code = main([*argv, *options])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "busiest minute scaled to 40 req/s" in out
    assert "H100 reference" in out  # the run has no GPU deployment
    for fleet in ("CPU only", "GPU only", "GPU base + CPU for peaks", "CPU base + GPU for peaks"):
        assert fleet in out
    assert "The cheapest fleet that serves this day with 99% of requests within 100 ms is CPU only" in out


def test_plan_leaves_out_replica_models_that_are_off(ffn_run, short_trace, capsys):
    argv = ["plan", str(ffn_run), "--traffic", f"trace:{short_trace}", "--trace-rate", "40", "--model", "ffn"]
    code = main([*argv, "--price", "cpu=0.10", "--price", "gpu=2.50", "--sim-seconds", "0.2"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "every cpu deployment's model is off by more than 20% of a measured rate: not used" in out
    assert "GPU only" in out and "CPU only" not in out and "cpu replica" not in out


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--traffic", "diurnal:10"], "diurnal:PEAK:TROUGH"),
        (["--traffic", "trace:x.csv"], "--trace-rate"),
        (["--traffic", "diurnal:100:10", "--slo", "p99"], "--slo"),
        (["--traffic", "diurnal:100:10", "--target", "inflight:-1"], "--target"),
        (["--traffic", "diurnal:100:10", "--price", "cpu"], "--price"),
        (["--traffic", "diurnal:100:10", "--sim-seconds", "0"], "--sim-seconds"),
    ],
)
def test_bad_specs_are_one_clear_error_line(ffn_run, extra, match, capsys):
    code = main(["plan", str(ffn_run), *extra])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("latlab: error: ") and match in err and err.count("\n") == 1
