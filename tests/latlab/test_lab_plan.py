"""The lab's fair CPU baseline: CPU deployments get the cores a CPU server of the machine would have, the load
generator what it needs, on machines of any size (as configuration: no many-core machine needed)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from latlab.lab.run import frontends_for, sweep_plan, write_config
from latlab.lab.plan import FFN, PLANS, cpu_share
from latlab.server.config import load_config


@pytest.mark.parametrize(
    "cores, threads, workers", [(1, 1, 0), (2, 1, 0), (4, 3, 0), (8, 6, 2), (16, 12, 4), (64, 56, 8), (192, 184, 8)]
)
def test_cpu_deployments_get_every_core_the_generator_does_not_need(cores: int, threads: int, workers: int) -> None:
    share = cpu_share(cores)
    assert (share.cpu_threads, share.load_workers) == (threads, workers)
    assert share.cpu_threads + max(1, share.load_workers) == max(cores, 2)  # no core idle, none counted twice
    assert f"{threads} ORT thread" in share.describe() and f"{cores} cores" in share.describe()
    assert "fair share" in share.describe()


def test_either_figure_may_be_set_and_the_other_follows() -> None:
    assert (cpu_share(16, cpu_threads=16).cpu_threads, cpu_share(16, cpu_threads=16).load_workers) == (16, 4)
    assert cpu_share(16, load_workers=2).cpu_threads == 14
    assert "--cpu-threads" in cpu_share(16, cpu_threads=8).describe()
    for bad in ({"cpu_threads": 0}, {"load_workers": -1}):
        with pytest.raises(ValueError, match="must be"):
            cpu_share(16, **bad)


@pytest.mark.parametrize("cores", [2, 16])
def test_the_gpu_plans_config_gives_cpu_deployments_the_share_and_cuda_ones_none(tmp_path: Path, cores: int) -> None:
    model = tmp_path / "ffn.onnx"
    model.write_bytes(b"")
    plan = replace(PLANS["gpu-quick"], models=tuple(m for m in PLANS["gpu-quick"].models if not m.text))
    share = cpu_share(cores)
    config = load_config(write_config(tmp_path, {m.name: model for m in plan.models}, 8000, plan, share))
    cpu = [d for d in config.deployments if d.provider == "cpu"]
    assert cpu and all(d.cpu.intra_op_threads == share.cpu_threads and not d.cpu.allow_spinning for d in cpu)
    assert {d.provider for d in config.deployments} == {"cpu", "cuda"}


def test_a_many_core_sweep_runs_locust_workers_and_names_the_machine(tmp_path: Path) -> None:
    plan = sweep_plan(tmp_path, PLANS["gpu"], FFN, "http://127.0.0.1:1", 9646, cpu_share(16).load_workers, "h100-box")
    assert plan.workers.local == 4 and plan.provenance.machine_name == "h100-box"
    assert plan.schedule.max_rate > max(FFN.rates)  # the sweep goes on past its listed rates
    assert plan.slo.p99_s == 0.1 and not plan.slo.search  # ... until it breaks the largest SLO
    assert plan.slo.slos.seconds == (0.01, 0.025, 0.05, 0.1) and plan.workers.metrics_port == 9646
    small = sweep_plan(tmp_path, PLANS["cpu"], FFN, "http://127.0.0.1:1", 9646, cpu_share(2).load_workers)
    assert small.workers.local == 0 and small.provenance.machine_name is None


def test_a_lab_may_run_some_of_its_plans_models_and_refuses_unknown_ones() -> None:
    assert [m.name for m in PLANS["gpu-quick"].only(["cnn", "minilm"]).models] == ["cnn", "minilm"]
    assert PLANS["cpu"].only(None) is PLANS["cpu"]
    with pytest.raises(ValueError, match="--models: resnet not in this plan; it has mlp, ffn, cnn, minilm"):
        PLANS["cpu"].only(["resnet"])


@pytest.mark.parametrize(
    "plan, cores, frontends",
    [
        ("gpu", 16, 8),
        ("gpu", 64, 8),
        ("gpu", 8, 5),
        ("gpu", 2, 1),
        ("gpu-quick", 16, 8),
        ("cpu", 16, 1),
        ("quick", 64, 1),
    ],
)
def test_gpu_plans_run_front_ends_sized_to_the_machine(tmp_path: Path, plan: str, cores: int, frontends: int) -> None:
    """Every core the generator's workers and the engine leave, up to 8, on a GPU plan of a many-core machine, as
    native front ends; one process on a CPU plan or a small machine (where the hop costs more than it frees)."""
    chosen = replace(PLANS[plan], models=tuple(m for m in PLANS[plan].models if not m.text))
    text = write_config(
        tmp_path, {m.name: tmp_path / "m.onnx" for m in chosen.models}, 8000, chosen, cpu_share(cores)
    ).read_text()
    assert (f"frontends = {frontends}" in text) == (frontends > 1)
    assert frontends_for(chosen, cpu_share(cores)) == frontends
    # front ends serve natively where the native part builds (every machine with a C compiler, as CI's)
    assert ('interface = "native"' in text) == (frontends > 1)


def test_the_zoos_requests_take_the_plans_sizes_and_a_sample_file_keeps_its_own(tmp_path: Path) -> None:
    plan = replace(PLANS["quick"], sizes="lognormal:16:160")
    (model, *_) = plan.models
    sweep = sweep_plan(tmp_path, plan, model, "http://127.0.0.1:1", metrics_port=0)
    assert sweep.workload.payload.sizes == "lognormal:16:160" and sweep.workload.payload.size_spec.varies
    sampled = replace(model, samples={"x": np.zeros((2, 4), np.float32)})
    assert sweep_plan(tmp_path, plan, sampled, "http://127.0.0.1:1", metrics_port=0).workload.payload.sizes == ""


H200_BENCH = (
    Path(__file__).parents[2] / "report" / "reference" / "h200" / "leg-1" / "lab-minilm" / "bench" / "bench.json"
)


def test_a_cuda_sweep_may_raise_the_rate_to_the_devices_in_process_ceiling(tmp_path: Path) -> None:
    """A batched CUDA deployment can still meet every SLO at the plan's cap (4 x the last listed rate): the sweep
    goes on to the ceiling the run's own bench measured for CUDA at the deployment's batch size (here a committed
    GPU bench)."""
    from latlab.lab.run import CEILING_HEADROOM
    from latlab.report.predict import bench_fits

    minilm = next(m for m in PLANS["gpu-serve"].models if m.name == "minilm")
    listed_cap = max(minilm.rates) * PLANS["gpu-serve"].raise_cap
    assert sweep_plan(tmp_path, PLANS["gpu-serve"], minilm, "http://127.0.0.1:1", 0).schedule.max_rate == listed_cap
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "bench.json").write_text(H200_BENCH.read_text())
    (fit,) = [
        f["fit"]
        for f in bench_fits([json.loads(H200_BENCH.read_text())])
        if f["model"] == "minilm" and f["backend"] == "ort-cuda"
    ]
    ceiling = 32 / fit.time_s(32)  # full batches of the plan's max_batch_size, one instance
    raised = sweep_plan(tmp_path, PLANS["gpu-serve"], minilm, "http://127.0.0.1:1", 0).schedule.max_rate
    assert raised == pytest.approx(CEILING_HEADROOM * ceiling) and raised > 4 * listed_cap
    # The CPU half of the plan keeps its listed cap: the CPU's bench says nothing of a device.
    assert sweep_plan(tmp_path, PLANS["gpu-serve-cpu"], minilm, "http://127.0.0.1:1", 0).schedule.max_rate == listed_cap
