"""The plan's cold start: what the lab measured from `latlab serve` start to ready where the run recorded it, the
assumption where it did not (older results, the H100 reference), --cold-start over both; each kind's replicas
start in its own."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from latlab.cli import main
from latlab.loadtest.results import read_results, write_results
from latlab.report.fleetplan.autoscale import DEFAULT_COLD_START_S, Autoscaler
from latlab.report.fleetplan.fleet import FleetSpec, ReplicaKind, Sizing, Slo, plan_fleets
from latlab.report.fleetplan.plan import make_plan
from latlab.report.fleetplan.replica import ReplicaModel
from latlab.report.fleetplan.traffic import DayTraffic, parse_profile
from latlab.report.fleetplan.validate import validation_rows

SLO = Slo.parse("p99:100ms")
PRICES = {"cpu": 0.10, "gpu": 2.50}


@pytest.fixture(scope="module")
def rows(ffn_run: Path) -> list[dict]:
    """The committed run's validation, made once: the runs below differ only in their recorded cold start."""
    return validation_rows(ffn_run)


@pytest.fixture
def measured_run(ffn_run: Path, tmp_path: Path) -> Path:
    """The committed ffn run as if the lab had recorded its server's start to ready."""
    folder = tmp_path / "measured"
    shutil.copytree(ffn_run, folder)
    (run,) = read_results(folder / "results-ffn.json")
    run.cold_start_s = 3.25
    write_results(folder / "results-ffn.json", run)
    return folder


def plan(run_dir: Path, rows: list[dict], cold_start_s: float | None = None):
    traffic = parse_profile("diurnal:40:5")
    return make_plan(run_dir, traffic, SLO, PRICES, use_off=True, budget_s=0.2, rows=rows, cold_start_s=cold_start_s)


def test_results_from_before_read_as_not_measured_and_the_plan_assumes_its_default(ffn_run: Path, rows):
    assert all(run.cold_start_s is None for run in read_results(ffn_run))
    made = plan(ffn_run, rows)
    assert {k.name: k.cold_start_text for k in made.kinds} == {"cpu": "assumed 60 s", "gpu": "assumed 60 s"}
    assert "cpu replica cold start assumed 60 s, an assumption: the run measured none" in made.notes


def test_the_measured_cold_start_is_used_for_the_measured_deployment_not_the_reference(measured_run: Path, rows):
    made = plan(measured_run, rows)
    cpu, gpu = made.kinds
    assert (cpu.cold_start_s, cpu.cold_start_text) == (3.25, "measured 3.2 s (lab)")
    assert gpu.source == "H100 reference bench" and gpu.cold_start_s == DEFAULT_COLD_START_S  # no measurement of it
    assert any(n.startswith("cpu replica cold start measured 3.2 s (lab)") for n in made.notes)


def test_cold_start_given_overrides_the_measured_one_and_the_assumption(measured_run: Path, rows, capsys):
    assert {k.cold_start_text for k in plan(measured_run, rows, cold_start_s=12).kinds} == {"given 12 s"}
    argv = ["plan", str(measured_run), "--traffic", "diurnal:40:5", "--slo", "p99:100ms", "--use-off"]
    assert main([*argv, "--price", "cpu=0.1", "--price", "gpu=2.5", "--sim-seconds", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "cold start measured 3.2 s (lab)" in out and "cold start assumed 60 s" in out
    assert main([*argv, "--cold-start", "-1"]) == 2  # refused before any work, in one line
    err = capsys.readouterr().err
    assert err.startswith("latlab: error: ") and "cold start must be >= 0" in err and err.count("\n") == 1


def test_each_kind_starts_in_its_own_cold_start_not_the_autoscalers():
    """Load rises past one replica: replicas whose own cold start is short serve, though the autoscaler's is
    endless; a kind without its own starts in the autoscaler's."""
    traffic = DayTraffic(np.array([100.0] * 60 + [600.0] * 60), 1.0, "test")
    sizing = {"cpu": Sizing(200.0, 150.0)}
    scaler = Autoscaler(upscale_delay_s=30, downscale_delay_s=600, cold_start_s=1e6)
    quick = ReplicaKind("cpu", ReplicaModel(0.004, 0.0), 0.10, "test", cold_start_s=20.0, cold_start_from="lab")
    unsaid = ReplicaKind("cpu", ReplicaModel(0.004, 0.0), 0.10, "test")
    days, _ = plan_fleets([FleetSpec("quick", quick), FleetSpec("unsaid", unsaid)], traffic, SLO, sizing, scaler)
    ready = {d.spec.name: d.timelines["cpu"].ready for d in days}
    assert ready["quick"].max() == 4 and ready["unsaid"].max() == 1
    started = int(np.argmax(days[0].timelines["cpu"].billed == 4))
    assert ready["quick"][started + 1] == 1 and ready["quick"][started + 2] == 4  # ready 20 s (2 ticks) after
