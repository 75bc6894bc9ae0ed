"""`latlab bench` end to end, and one-line errors (exit 2) for what the user can get wrong."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from latlab.cli import main

TINY = ["--batches", "1,2,4", "--d-model", "16", "--n-layers", "2", "--threads", "1", "--min-time", "0"]


def test_bench_command_writes_a_run_folder(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "latlab.cli",
            "bench",
            "--experiments",
            "batch_size,n_layers",
            "--layers",
            "1,2",
            *TINY,
            "--cache-dir",
            str(tmp_path / "cache"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert f"results: {out / 'bench.json'}" in result.stdout
    doc = json.loads((out / "bench.json").read_text())
    assert [e["name"] for e in doc["experiments"]] == ["batch_size", "n_layers"]
    batch = doc["experiments"][0]
    assert sorted({p["batch_size"] for p in batch["points"]}) == [1, 2, 4]
    assert {p["backend"] for p in batch["points"]} == {"ort-cpu", "torch-cpu"}
    assert (out / "batch_size.png").is_file() and (out / "n_layers.png").is_file()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--backends", "ort-tpu"], "unknown backend 'ort-tpu'"),
        (["--experiments", "width"], "unknown experiment 'width'"),
        (["--models", "gpt5"], "unknown model 'gpt5'"),
        (["--batches", "1,two"], "--batches: cannot read '1,two'"),
        (["--d-models", "0"], "--d-models needs positive integers"),
        (["--experiments", "zoo_batch"], "needs --models"),
        (["--threads", "-1"], "--threads and --max-params must be >= 0"),
        (["--fixed-params", "0"], "needs positive integers"),
        (["--min-time", "-1"], "--min-time must be a finite number >= 0"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["bench", *args, "--out", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("latlab: error: ") and message in err
    assert err.count("\n") == 1
    assert not (tmp_path / "run").exists()  # rejected before anything ran


def _settings(*argv: str):
    import argparse

    from latlab.cli.bench import add_arguments, settings_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return settings_from_args(parser.parse_args(list(argv)))


def test_quick_is_a_small_cpu_grid_plus_the_models_asked() -> None:
    settings = _settings("--quick", "--models", "mlp,cnn")
    assert settings.experiments == ["batch_size", "zoo_batch"]
    assert settings.batches == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert settings.zoo_batches == [1, 2, 4, 8, 16, 32, 64]
    assert settings.backends == ["ort-cpu", "torch-cpu"] and settings.models == ["mlp", "cnn"]
    assert settings.max_run_s == 1.0  # a slow model's sweep stops early instead of blowing the lab's budget


def test_default_grids_are_the_seeds() -> None:
    settings = _settings("--fixed-params", str(2**27))
    assert settings.experiments == ["batch_size", "d_model", "n_layers", "fixed_params"]
    assert settings.batches == [2**k for k in range(12)]
    assert settings.d_models == [64, 128, 256, 512, 1024, 2048, 4096]
    assert settings.layers == [128, 640, 1152, 1664, 2176, 2688, 3200, 3712]
    assert settings.fixed_layers == [2**k for k in range(13)]
    full = _settings("--full", "--fixed-params", str(2**27))
    assert full.layers == list(range(128, 3841, 128))
    assert full.fixed_layers[-1] == 2**14


def test_the_labs_bench_runs_as_a_child_from_its_plan_where_the_report_finds_it(tmp_path: Path) -> None:
    from latlab.bench.plan import PLAN_FILE, BenchOptions, run_child
    from latlab.report.write import read_bench

    options = BenchOptions(
        experiments="batch_size",
        batches="1,2",
        d_model=16,
        n_layers=2,
        threads=1,
        min_time=0.0,
        backends="ort-cpu",
        cache_dir=tmp_path / "cache",
    )
    run_child(options, tmp_path / "run" / "bench")
    assert BenchOptions.from_json((tmp_path / "run" / "bench" / PLAN_FILE).read_text()) == options
    [doc] = read_bench(tmp_path / "run")
    [experiment] = doc["experiments"]
    assert experiment["name"] == "batch_size"
    assert sorted(p["batch_size"] for p in experiment["points"]) == [1, 2]


def test_a_bench_child_that_cannot_read_its_plan_fails_the_lab_with_its_status(tmp_path: Path) -> None:
    from latlab.bench.plan import BenchOptions, run_child

    with pytest.raises(RuntimeError, match="bench failed with status 2"):
        run_child(BenchOptions(batches="1,x", cache_dir=tmp_path / "cache"), tmp_path / "bench")
