"""Real ORT sessions and PyTorch on tiny grids: points, skips, the ONNX cache, bench.json and the figures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from latlab.bench import backends as bb
from latlab.bench.experiments import SCHEMA, run_bench, run_seed_experiment, run_zoo_experiment, write_run
from latlab.report.bench_plot import plot_bench

POINT_KEYS = {"backend", "batch_size", "params", "median_s", "min_s", "max_s", "repeats"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_ffn_onnx_file_computes_what_the_module_computes(tmp_path: Path) -> None:
    point = bb.ffn_model(16, 3, tmp_path)
    bb.ensure_onnx(point)
    x = torch.randn(5, 16)
    with torch.no_grad():
        want = point.module(x).numpy()
    session = ort.InferenceSession(str(point.onnx_path), providers=["CPUExecutionProvider"])
    (got,) = session.run(["y"], {"x": x.numpy()})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_point_inputs_repeat_the_row_keeping_dtype(tmp_path: Path) -> None:
    point = bb.PointModel(
        torch.nn.Identity(),
        {"ids": torch.tensor([[5, 7, 9]]), "mask": torch.ones(1, 3)},
        ["y"],
        tmp_path / "m.onnx",
        {},
    )
    inputs = point.inputs(4)
    assert inputs["ids"].shape == (4, 3) and inputs["ids"].dtype == torch.int64
    assert inputs["ids"].tolist() == [[5, 7, 9]] * 4


def test_batch_sweep_measures_every_backend_and_batch(tiny) -> None:
    doc = run_seed_experiment("batch_size", tiny(), log=lambda line: None)
    assert (doc["name"], doc["model"], doc["vary"]) == ("batch_size", "ffn", "batch_size")
    assert doc["fixed"] == {"d_model": 16, "n_layers": 2}
    got = sorted((p["backend"], p["batch_size"]) for p in doc["points"])
    assert got == sorted((b, n) for b in ("ort-cpu", "torch-cpu") for n in (1, 2, 4))
    for point in doc["points"]:
        assert POINT_KEYS | {"d_model", "n_layers"} <= set(point)
        assert (point["d_model"], point["n_layers"], point["params"]) == (16, 2, 512)
        assert 0 < point["min_s"] <= point["median_s"] <= point["max_s"]
        assert point["repeats"] >= 3
    assert doc["skipped"] == []


def test_points_over_the_parameter_budget_are_skipped_with_a_reason(tiny) -> None:
    settings = tiny(d_models=[8, 16, 64], max_params=600)  # 64*64*2 = 8192 parameters > 600
    doc = run_seed_experiment("d_model", settings, log=lambda line: None)
    assert sorted({p["d_model"] for p in doc["points"]}) == [8, 16]
    assert len(doc["skipped"]) == 2
    for skip in doc["skipped"]:
        assert skip["point"] == {"batch_size": 1, "d_model": 64, "n_layers": 2, "params": 8192}
        assert skip["backend"] in ("ort-cpu", "torch-cpu")
        assert "8,192 parameters" in skip["reason"] and "budget of 600" in skip["reason"]


def test_onnx_files_are_cached_between_runs(tiny) -> None:
    settings = tiny(backends=["ort-cpu"], batches=[1])
    run_seed_experiment("batch_size", settings, log=lambda line: None)
    path = settings.cache_dir / "ffn-d16-L2" / "model.onnx"
    first = path.stat().st_mtime_ns
    run_seed_experiment("batch_size", settings, log=lambda line: None)
    assert path.stat().st_mtime_ns == first


def test_a_point_that_fails_is_recorded_and_the_sweep_goes_on(tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    real = bb.make_runner

    def out_of_memory_at_batch_4(backend: str, point: bb.PointModel, threads: int) -> bb.Prepare:
        prepare = real(backend, point, threads)

        def fail_at_4(batch: int) -> bb.Runner:
            if batch == 4:
                raise MemoryError("out of memory allocating the batch")
            return prepare(batch)

        return fail_at_4

    monkeypatch.setattr(bb, "make_runner", out_of_memory_at_batch_4)
    doc = run_seed_experiment("batch_size", tiny(backends=["ort-cpu"]), log=lambda line: None)
    assert sorted(p["batch_size"] for p in doc["points"]) == [1, 2]
    assert [(s["point"]["batch_size"], s["reason"]) for s in doc["skipped"]] == [
        (4, "failed: out of memory allocating the batch")
    ]


def test_cuda_backend_is_measured_or_skipped_never_faked(tiny) -> None:
    doc = run_seed_experiment("batch_size", tiny(backends=["ort-cuda"], batches=[1]), log=lambda line: None)
    try:
        bb.ort_cuda_session(bb.ensure_onnx(bb.ffn_model(16, 2, tiny().cache_dir)), 1)
        cuda_loads = True
    except bb.BackendUnavailable:
        cuda_loads = False
    if cuda_loads:
        assert [p["backend"] for p in doc["points"]] == ["ort-cuda"]
    else:
        assert doc["points"] == []
        assert [s["backend"] for s in doc["skipped"]] == ["ort-cuda"]
        assert "CUDA" in doc["skipped"][0]["reason"]


def test_zoo_batch_sweep_carries_the_models_config(tiny, zoo_cache: Path) -> None:
    doc = run_zoo_experiment("mlp", tiny(cache_dir=zoo_cache), log=lambda line: None)
    assert (doc["name"], doc["model"], doc["vary"]) == ("zoo_batch", "mlp", "batch_size")
    assert sorted((p["backend"], p["batch_size"]) for p in doc["points"]) == sorted(
        (b, n) for b in ("ort-cpu", "torch-cpu") for n in (1, 2)
    )
    for point in doc["points"]:
        assert POINT_KEYS | {"in_features", "hidden", "out_features"} <= set(point)
        assert point["params"] == 4 * 100 + 100 + 100 + 1


def test_run_bench_writes_the_schema_and_one_figure_per_experiment(tiny, tmp_path: Path, zoo_cache: Path) -> None:
    settings = tiny(
        experiments=["batch_size", "d_model", "n_layers", "fixed_params", "zoo_batch"],
        models=["mlp"],
        batches=[1, 2],
        backends=["torch-cpu", "ort-cpu"],
        cache_dir=zoo_cache,
    )
    threads_before = torch.get_num_threads()
    doc = run_bench(settings, log=lambda line: None)
    written = write_run(doc, tmp_path / "run")
    loaded = json.loads((tmp_path / "run" / "bench.json").read_text())
    assert loaded["schema"] == SCHEMA
    assert {"cpu", "cores", "gpu", "ort_version", "torch_version", "threads"} <= set(loaded["machine"])
    assert loaded["machine"]["threads"] == 1 and loaded["created"]
    assert loaded["machine"]["torch_threads"] == 1  # both runtimes ran on --threads
    assert torch.get_num_threads() == threads_before  # and PyTorch's setting came back afterwards
    names = [e["name"] for e in loaded["experiments"]]
    assert names == ["batch_size", "d_model", "n_layers", "fixed_params", "zoo_batch"]
    for experiment in loaded["experiments"]:
        assert {"name", "model", "vary", "fixed", "points", "skipped"} <= set(experiment)
        assert experiment["points"], experiment["name"]
    fixed = next(e for e in loaded["experiments"] if e["name"] == "fixed_params")
    assert sorted((p["n_layers"], p["d_model"]) for p in fixed["points"] if p["backend"] == "ort-cpu") == [
        (1, 32),
        (4, 16),
    ]
    pngs = sorted(p.name for p in written if p.suffix == ".png")
    assert pngs == ["batch_size.png", "d_model.png", "fixed_params.png", "n_layers.png", "zoo_batch.png"]
    assert all(p.read_bytes().startswith(PNG_MAGIC) for p in written if p.suffix == ".png")


def test_plot_bench_renders_from_a_document_alone() -> None:
    point = {
        "backend": "ort-cpu",
        "batch_size": 1,
        "d_model": 8,
        "n_layers": 2,
        "params": 128,
        "median_s": 2e-3,
        "min_s": 1e-3,
        "max_s": 3e-3,
        "repeats": 5,
    }
    doc = {
        "schema": SCHEMA,
        "machine": {},
        "experiments": [
            {"name": "n_layers", "model": "ffn", "vary": "n_layers", "fixed": {}, "points": [point], "skipped": []},
            {"name": "d_model", "model": "ffn", "vary": "d_model", "fixed": {}, "points": [], "skipped": []},
        ],
    }
    figures = plot_bench(doc)
    assert list(figures) == ["n_layers.png"]  # an experiment with nothing measured draws nothing
    assert figures["n_layers.png"].startswith(PNG_MAGIC)


@pytest.mark.gpu
def test_ort_cuda_and_torch_cuda_are_timed_on_the_device(tiny) -> None:
    try:
        bb.ort_cuda_session(bb.ensure_onnx(bb.ffn_model(16, 2, tiny().cache_dir)), 1)
    except bb.BackendUnavailable as exc:
        pytest.skip(f"CUDA is absent: {exc}")
    backends = ["ort-cuda"] + (["torch-cuda"] if torch.cuda.is_available() else [])
    doc = run_seed_experiment("batch_size", tiny(backends=backends), log=lambda line: None)
    assert doc["skipped"] == []
    assert sorted({p["backend"] for p in doc["points"]}) == sorted(backends)
    assert all(p["median_s"] > 0 for p in doc["points"])
