"""The fleet plan in the report: the replica model's check per deployment (rows, errors, "off" marks) always, and
the plan's verdict, fleets table and figure when --plan-traffic asks for them; `latlab report --plan-traffic` run
as the user runs it, and a bad spec refused in one line before any work."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from latlab.report.fleetplan.autoscale import Autoscaler
from latlab.report.fleetplan.fleet import Slo
from latlab.report.fleetplan.plan import PlanRequest
from latlab.report.fleetplan.traffic import parse_profile
from latlab.report.fleetplan.validate import validation_rows
from latlab.report.plan_section import PLAN_FIGURE, validation_section, validation_summary
from latlab.report.write import write_report

ROOT = Path(__file__).resolve().parents[2]
SLOS = [0.025, 0.1]
PRICES = {"cpu": 0.10, "cuda": 2.50}
PNG_HEADER = b"\x89PNG"


@pytest.fixture(scope="module")
def rows(ffn_run: Path) -> list[dict]:
    return validation_rows(ffn_run)


def section(page: str, heading: str) -> str:
    """The text of the page from a heading to the next h2."""
    start = page.index(heading)
    end = page.find("<h2>", start + len(heading))
    return page[start : end if end > 0 else None]


def test_validation_table_has_a_row_per_deployment_and_marks_what_is_off(rows: list[dict]) -> None:
    text = validation_section(rows)
    for row in rows:
        match = re.search(rf"<tr><td>{row['deployment']}</td>(.*?)</tr>", text)
        assert match, row["deployment"]
        cells = re.findall(r"<td( class='off')?>(.*?)</td>", match.group(1))  # "model from" is a text cell
        assert len(cells) == len(row["slos"])
        for (off_class, cell), slo in zip(cells, row["slos"]):
            assert bool(off_class) == slo["off"] == ("<strong>off</strong>" in cell)
            if slo["measured_rps"]:
                assert f"{slo['predicted_rps']:.0f} vs {slo['measured_rps']:.0f} ({slo['error'] * 100:+.0f}%)" in cell


def test_summary_counts_the_slos_within_20_percent(rows: list[dict]) -> None:
    within = sum(1 for r in rows for s in r["slos"] if not s["off"])
    total = sum(len(r["slos"]) for r in rows)
    said = validation_summary(rows)
    assert f"the replica model is within 20% for {within} of {total} SLOs" in said
    for row in rows:
        assert (row["deployment"] in said.split("not planned with:")[-1]) == row["off"]


def test_each_arrival_process_gets_its_own_summary_and_table(rows: list[dict]) -> None:
    bursty = [{**r, "traffic": "gamma:3"} for r in rows]
    text = validation_section(rows + bursty)
    assert text.count("<table class='validation'>") == 2
    assert "Under poisson arrivals" in text and "Under gamma:3 arrivals" in text


def test_report_shows_the_check_after_the_cost_picture_and_no_plan_unasked(ffn_run: Path, tmp_path: Path) -> None:
    page = write_report(ffn_run, SLOS, prices=PRICES, out=tmp_path).read_text()
    assert "<h2>The replica model against this run</h2>" in page
    assert page.index("alt='cost per million inferences vs rate for ffn'") < page.index(
        "The replica model against this run"
    )
    assert "Fleet plan" not in page and not (tmp_path / PLAN_FIGURE).exists()


def test_report_with_a_plan_has_its_verdict_fleets_and_figure(ffn_run: Path, tmp_path: Path) -> None:
    request = PlanRequest(
        parse_profile("diurnal:40:5"), Slo.parse("p99:100ms"), Autoscaler(cold_start_s=30), use_off=True, budget_s=0.2
    )
    page = write_report(ffn_run, SLOS, prices=PRICES, out=tmp_path, plan=request).read_text()
    plan = section(page, "<h2>Fleet plan: a day of diurnal")
    assert "The cheapest fleet that serves this day with 99% of requests within 100 ms is" in plan
    for fleet in ("CPU only", "GPU only", "GPU base + CPU for peaks", "CPU base + GPU for peaks"):
        assert re.search(rf"<tr><td>(\d+ )?{re.escape(fleet)}</td>", plan), fleet
    assert "<img alt='replicas over the day per fleet' src='data:image/png;base64," in plan
    assert "committed H100 reference" in plan  # the run has no GPU deployment: said so
    assert "(--plan-use-off)" in plan  # the report's name of the option
    assert (tmp_path / PLAN_FIGURE).read_bytes().startswith(PNG_HEADER)
    assert page.index("The replica model against this run") < page.index("<h2>Fleet plan")


def test_a_plan_without_a_usable_model_says_why_and_the_report_stands(ffn_run: Path, tmp_path: Path) -> None:
    request = PlanRequest(parse_profile("diurnal:40:5"), Slo.parse("p99:100ms"), model="nope")
    page = write_report(ffn_run, SLOS, prices=PRICES, out=tmp_path, plan=request).read_text()
    assert "<h2>Fleet plan</h2><p class='warning'>No plan: --model &#x27;nope&#x27;" in page
    assert "<h2>Details</h2>" in page


def latlab(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "latlab.cli", *argv], capture_output=True, text=True, cwd=ROOT, timeout=300
    )


def test_latlab_report_with_plan_traffic_writes_the_section(ffn_run: Path, tmp_path: Path) -> None:
    trace = ROOT / "traces" / "AzureLLMInferenceTrace_conv.csv"
    done = latlab(
        "report", str(ffn_run), "--out", str(tmp_path), "--price", "cpu=0.10,cuda=2.50", "--slo", "25ms,100ms",
        "--plan-traffic", f"trace:{trace}", "--plan-trace-rate", "40", "--plan-slo", "p99:100ms",
        "--plan-use-off", "--plan-sim-seconds", "0.2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "report.html").read_text()
    plan = section(page, "<h2>Fleet plan: a day of AzureLLMInferenceTrace_conv.csv, busiest minute scaled to 40")
    assert "The cheapest fleet" in plan and "<table class='fleets'>" in plan
    assert (tmp_path / PLAN_FIGURE).read_bytes().startswith(PNG_HEADER)


@pytest.mark.parametrize(
    "extra, said",
    [
        (["--plan-traffic", "diurnal:10"], "--plan-traffic 'diurnal:10': not one of diurnal:PEAK:TROUGH"),
        (["--plan-traffic", "trace:x.csv"], "needs --plan-trace-rate PEAK"),
        (["--plan-traffic", "diurnal:100:10", "--plan-slo", "p99"], "--plan-slo 'p99'"),
        (["--plan-traffic", "diurnal:100:10", "--plan-target", "util:2"], "--plan-target 'util:2'"),
    ],
)
def test_bad_plan_options_are_one_line_before_any_work(extra: list[str], said: str, tmp_path: Path) -> None:
    # The run folder does not exist: the report would fail on it, so an answer about the option came first.
    done = latlab("report", str(tmp_path / "no-such-run"), *extra)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and said in done.stderr, done.stderr
    assert not (tmp_path / "no-such-run").exists()


def test_lab_refuses_a_bad_plan_traffic_before_any_work(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    done = latlab("lab", "--runs-dir", str(runs), "--models-dir", str(tmp_path / "models"), "--plan-traffic", "x:1")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "--plan-traffic 'x:1': not one of" in done.stderr, done.stderr
    assert not runs.exists()
