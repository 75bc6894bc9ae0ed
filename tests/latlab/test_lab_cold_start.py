"""The lab's cold start: its server timed from `latlab serve` start to ready on every deployment, handed to each
sweep and recorded in the run (older results read as not measured)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import requests

from latlab.common import procs
from latlab.lab.children import start_serving
from latlab.lab.plan import FFN, PLANS, cpu_share
from latlab.lab.run import sweep_plan
from latlab.loadtest.plan import SweepPlan
from latlab.loadtest.results import Run, read_results, write_results
from latlab.server.config import save_config
from tests.conftest import build_tiny_model


def test_the_labs_server_is_timed_from_its_start_to_ready_on_every_deployment(tmp_path: Path):
    model = build_tiny_model(tmp_path / "tiny.onnx")
    port = procs.free_port()
    deployments = [{"name": name, "model_path": model, "cpu": {"intra_op_threads": 1}} for name in ("a", "b")]
    config = save_config({"server": {"port": port}, "deployments": deployments}, tmp_path / "lab.toml")
    before = time.monotonic()
    serving = start_serving(config, port, tmp_path, PLANS["quick"], cpu_share(2), print)
    around = time.monotonic() - before
    try:
        ready = requests.get(f"{serving.host}/v2/health/ready", timeout=5)
        each = [requests.get(f"{serving.host}/v2/models/{name}/ready", timeout=5) for name in ("a", "b")]
    finally:
        serving.stop()
    assert ready.status_code == 200 and [r.status_code for r in each] == [200, 200]
    assert 0 < serving.cold_start_s <= around  # within the call that started it, measured on the same clock


def test_each_sweep_records_the_cold_start_it_is_handed(tmp_path: Path):
    sweep = sweep_plan(tmp_path, PLANS["quick"], FFN, "http://127.0.0.1:1", 9646, cold_start_s=2.5)
    assert sweep.provenance.cold_start_s == 2.5
    assert SweepPlan.from_dict(json.loads(json.dumps(asdict(sweep)))).provenance.cold_start_s == 2.5  # the child's
    assert sweep_plan(tmp_path, PLANS["quick"], FFN, "http://127.0.0.1:1", 9646).provenance.cold_start_s is None


def test_a_run_keeps_its_cold_start_and_one_written_before_reads_as_not_measured(tmp_path: Path):
    write_results(tmp_path / "a" / "results.json", Run("a", {"cpu": "x"}, cold_start_s=1.75))
    assert read_results(tmp_path / "a")[0].cold_start_s == 1.75
    document = json.loads((tmp_path / "a" / "results.json").read_text())
    del document["cold_start_s"]
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "results.json").write_text(json.dumps(document))
    assert read_results(tmp_path / "b")[0].cold_start_s is None
