"""The typed results format: a committed lab run of the first format reads field for field, a run written and read
back is equal, and a file of this version that does not fit is refused with the field named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from latlab.common.settings import BatcherSettings, CpuOptions
from latlab.loadtest.results import (
    RESULTS_FILE,
    SCHEMA,
    Curve,
    Run,
    Step,
    from_dict,
    read_results,
    to_dict,
    write_results,
)
from tests.lab_v1 import MODELS, unpack_lab_v1


def test_a_first_format_run_reads_field_for_field(tmp_path):
    folder = unpack_lab_v1(tmp_path / "run")
    runs = read_results(folder)
    assert [Path(r.path).parent.name for r in runs] == list(MODELS)
    for run in runs:
        raw = json.loads(Path(run.path).read_text())
        assert raw["schema"] == "latlab.results/1" and run.run_id == raw["run_id"] == "20261125-163853"
        assert [d.name for d in run.deployments] == [d["name"] for d in raw["deployments"]]
        for deployment, raw_deployment in zip(run.deployments, raw["deployments"]):
            assert deployment.machine == raw["machine"] and deployment.run_id == run.run_id  # filled from the run
            assert deployment.batcher.as_dict() == raw_deployment["batcher"]
            assert deployment.cpu.as_dict() == raw_deployment["cpu"] and deployment.padding is None
            assert deployment.slo_brackets == raw_deployment["slo_brackets"]
            assert len(deployment.steps) == len(raw_deployment["steps"]) > 0
            for step, raw_step in zip(deployment.steps, raw_deployment["steps"]):
                assert isinstance(step, Step)
                assert {k: getattr(step, k) for k in raw_step} == raw_step  # every field, unchanged


def test_a_run_written_and_read_back_is_equal(tmp_path):
    (run,) = read_results(unpack_lab_v1(tmp_path / "run") / "mlp")
    write_results(tmp_path / "v2" / RESULTS_FILE, run)
    raw = json.loads((tmp_path / "v2" / RESULTS_FILE).read_text())
    assert raw["schema"] == SCHEMA
    assert not {"run_id", "reference", "by_server", "machine"} & set(raw["deployments"][0])  # context, not data
    (back,) = read_results(tmp_path / "v2")
    assert back == run and to_dict(back) == to_dict(run)
    assert back.deployments[0].machine == run.machine


def test_a_deployment_measured_elsewhere_keeps_its_machine(tmp_path):
    here, there = {"cpu": "A", "cores": 2}, {"cpu": "B", "cores": 16}
    step = Step(target=10.0, achieved_rps=10.0, offered_rps=10.0, errors=0, p50_s=0.001, p90_s=0.002, p99_s=0.003,
                max_s=0.004)  # fmt: skip
    run = Run(run_id="r", machine=here, deployments=[Curve("a", [step]), Curve("b", [step], machine=there)])
    write_results(tmp_path / RESULTS_FILE, run)
    (back,) = read_results(tmp_path)
    assert [d.machine for d in back.deployments] == [here, there]


def document(**step_changes: object) -> dict:
    step = {"target": 5, "achieved_rps": 5.0, "offered_rps": 5.0, "errors": 0, "p50_s": 0.1, "p90_s": 0.1,
            "p99_s": 0.2, "max_s": 0.3, **step_changes}  # fmt: skip
    return {"schema": SCHEMA, "run_id": "r", "machine": {}, "deployments": [{"name": "d", "steps": [step]}]}


def test_a_file_of_this_version_that_does_not_fit_is_refused_with_the_field_named(tmp_path):
    with pytest.raises(ValueError, match="step 0 of deployment 'd' has fields this version does not know: p98_s"):
        from_dict(document(p98_s=0.1))
    broken = document()
    del broken["deployments"][0]["steps"][0]["achieved_rps"]
    with pytest.raises(ValueError, match="step 0 of deployment 'd' lacks achieved_rps"):
        from_dict(broken)
    (tmp_path / RESULTS_FILE).write_text(json.dumps({**document(), "schema": "latlab.results/9"}))
    with pytest.raises(ValueError, match=r"results.json: not a latlab results file \(schema 'latlab.results/9'\)"):
        read_results(tmp_path)


def test_a_first_format_file_drops_what_it_no_longer_knows_and_names_its_load():
    old = document(note="written by an early version")
    old["schema"] = "latlab.results/1"
    step = old["deployments"][0]["steps"][0]
    del step["target"]
    step["target_rps"] = 5.0  # early files named only the rate
    (read,) = from_dict(old).deployments[0].steps
    assert read.target == 5.0 and not hasattr(read, "note")


def test_a_curve_s_settings_are_typed_and_written_back_with_the_keys_they_had():
    """Whatever a record's settings say (all of latlab's, a few of Triton's, none, a newer server's extra key) is
    what the curve's typed settings say, and what a file written from them holds, in the same order."""
    said = {
        "batcher": {"max_batch_size": 32, "max_queue_delay_ms": 2, "instances": 1, "a_newer_setting": [1]},
        "cpu": {},
        "padding": {"axis": 1, "values": {"input_ids": 0}, "bucket": 8},
    }
    doc = document()
    doc["deployments"][0].update(said)
    curve = from_dict(doc).deployments[0]
    assert isinstance(curve.batcher, BatcherSettings) and curve.batcher.max_batch_size == 32
    assert curve.batcher.says("instances") and not curve.batcher.says("max_queue_size")
    assert isinstance(curve.cpu, CpuOptions) and not curve.cpu.says("intra_op_threads") and curve.cuda is None
    assert curve.padding.values == {"input_ids": 0}
    written = to_dict(curve)
    assert {key: written[key] for key in said} == said
    assert list(written["batcher"]) == list(said["batcher"])
