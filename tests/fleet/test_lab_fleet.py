"""`latlab lab --replicas 2` end to end on a real fleet: the sweeps go through the proxy, every step records both
replicas, the report's step details show the imbalance, and the fleet is stopped with the lab (whose run folder may
be too deep for HAProxy's socket)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from latlab import cli
from latlab.common import procs
from latlab.fleet.build import MAX_SOCKET_PATH, build_fleet
from latlab.fleet.haproxy import check_config
from latlab.lab.plan import PLANS
from latlab.loadtest.results import Curve, Step, read_results
from latlab.report.sections import steps_table
from latlab.server.config import save_config


@pytest.fixture
def short_quick_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--quick` in few, short steps, no raising past the listed rates and no bench: a test of the path."""
    quick = replace(PLANS["quick"], step_seconds=0.6, warmup_seconds=0.3, max_windows=3, raise_cap=1.0, bench=False)
    monkeypatch.setitem(PLANS, "quick", quick)


def test_lab_sweeps_a_fleet_of_two_and_stops_it(tmp_path: Path, tiny_model: Path, short_quick_plan: None):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    runs = tmp_path / "runs"
    options = ["lab", "--quick", "--onnx", str(tiny_model), "--name", "tiny", "--providers", "cpu"]
    options += ["--rates", "40", "--slo", "100ms", "--slo-steps", "0", "--runs-dir", str(runs)]
    options += ["--models-dir", str(tmp_path / "models"), "--replicas", "2", "--balance", "roundrobin"]
    assert cli.main(options) == 0
    left = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert not left, f"the lab left processes running: {left}"
    (run_dir,) = runs.iterdir()
    assert sorted(p.name for p in (run_dir / "fleet").glob("r*.toml")) == ["r0.toml", "r1.toml"]
    (run,) = read_results(run_dir / "tiny" / "results.json")
    assert run.fleet["balance"] == "roundrobin" and set(run.fleet["replicas"]) == {"r0", "r1"}
    for curve in run.deployments:
        assert curve.steps and all(s.errors == 0 and s.fleet for s in curve.steps)
        assert all(n > 0 for s in curve.steps for n in s.fleet["replicas"].values())
    assert "(fleet: imbalance" in (run_dir / "report.html").read_text()


def test_the_step_details_show_a_fleets_imbalance_retries_and_5xx():
    fleet = {"replicas": {"r0": 60.0, "r1": 40.0}, "imbalance": 1.2, "proxy": {"retries": 1.0, "5xx": 2.0}}
    step = Step(
        target=50,
        achieved_rps=50,
        offered_rps=50,
        errors=0,
        p50_s=0.001,
        p90_s=0.002,
        p99_s=0.003,
        max_s=0.004,
        fleet=fleet,
    )
    plain = replace(step, fleet=None)
    table = steps_table(Curve(name="tiny-b1", steps=[step, plain]))
    assert "(fleet: imbalance 1.20, proxy retries 1, proxy 5xx 2)" in table
    assert table.count("(fleet:") == 1


def test_a_folder_too_deep_for_haproxys_socket_gets_a_private_one_removed_at_stop(tmp_path: Path, tiny_model: Path):
    config = save_config({"deployments": [{"name": "tiny", "model_path": tiny_model}]}, tmp_path / "server.toml")
    deep = tmp_path / ("d" * 60) / "runs" / "fleet"
    fleet = build_fleet(config, deep, 2, port=procs.free_port(), stats_port=procs.free_port())
    socket = fleet.spec.admin_socket
    assert len(str(socket)) <= MAX_SOCKET_PATH and not socket.is_relative_to(tmp_path) and socket.parent.is_dir()
    check_config(fleet.proxy_config)  # HAProxy takes it
    fleet.stop()
    assert not socket.parent.exists()
