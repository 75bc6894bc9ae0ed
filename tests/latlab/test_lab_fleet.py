"""`latlab lab --replicas N --balance B`: the cores the generator leaves split between the fleet's replicas, the
sweep plan loading the proxy and recording the fleet, one server and no proxy by default; bad options one line
before any work."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from latlab.fleet.spec import FleetSpec, plan_replicas
from latlab.fleet.targets import write_targets
from latlab.lab.plan import FFN, PLANS, cpu_share
from latlab.lab.run import frontends_for, sweep_plan, write_config
from latlab.server.config import load_config


@pytest.mark.parametrize(
    "cores, replicas, threads", [(2, 1, 1), (2, 2, 1), (16, 1, 12), (16, 2, 6), (16, 4, 3), (16, 12, 1)]
)
def test_the_generators_leftover_cores_are_split_between_the_replicas(cores: int, replicas: int, threads: int):
    share = cpu_share(cores, replicas=replicas)
    assert share.cpu_threads == threads and share.replicas == replicas
    assert share.load_workers == cpu_share(cores).load_workers  # the generator keeps what it had
    assert (f"in each of {replicas} replicas" in share.describe()) == (replicas > 1)
    with pytest.raises(ValueError, match="replicas"):
        cpu_share(cores, replicas=0)


def test_each_replicas_config_names_its_share_and_the_front_ends_are_split_too(tmp_path: Path):
    model = tmp_path / "ffn.onnx"
    model.write_bytes(b"")
    plan = replace(PLANS["gpu-quick"], models=(FFN,), replicas=4)
    share = cpu_share(16, replicas=4)
    config = load_config(write_config(tmp_path, {"ffn": model}, 8000, plan, share))
    assert {d.cpu.intra_op_threads for d in config.deployments if d.provider == "cpu"} == {3}
    assert frontends_for(plan, share) == (16 - 4 - 1) // 4
    assert frontends_for(plan, cpu_share(16)) > frontends_for(plan, share)


def test_a_fleets_sweep_loads_the_proxy_and_records_the_fleet(tmp_path: Path):
    replicas = plan_replicas(2, [9101, 9102, 9103, 9104], cores=2)
    spec = FleetSpec(replicas, port=9100, stats_port=9105, admin_socket=tmp_path / "s", balance="random(2)")
    targets = write_targets(spec, tmp_path / "servers-fleet.json")
    plan = replace(PLANS["quick"], replicas=2, balance="random(2)")
    sweep = sweep_plan(tmp_path, plan, FFN, "http://127.0.0.1:9100", 9646, fleet=targets)
    assert sweep.workload.host == "http://127.0.0.1:9100" and sweep.provenance.fleet == str(targets)
    alone = sweep_plan(tmp_path, PLANS["quick"], FFN, "http://127.0.0.1:9100", 9646)
    assert alone.provenance.fleet == "" and PLANS["quick"].replicas == 1  # by default: one server, no proxy
    assert replace(sweep, provenance=alone.provenance) == alone  # the fleet changes nothing else of the sweep


@pytest.mark.parametrize(
    "options, said", [(["--replicas", "2", "--balance", "source"], "--balance"), (["--replicas", "0"], "replicas")]
)
def test_bad_fleet_options_are_one_line_before_the_lab_makes_anything(tmp_path: Path, options: list[str], said: str):
    command = [sys.executable, "-m", "latlab.cli", "lab", "--quick", "--runs-dir", str(tmp_path / "runs"), *options]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(lines) == 1 and said in lines[0], lines
    assert not (tmp_path / "runs").exists()
