"""Tiny bench settings: d=16, L=2, batches 1,2,4, a few fast runs per point."""

from __future__ import annotations

from pathlib import Path

import pytest

from latlab.bench.experiments import BenchSettings, MeasureSettings


def tiny_settings(cache_dir: Path, **overrides: object) -> BenchSettings:
    """Seed grids shrunk to what runs in a second or two on a shared 2-core box."""
    values: dict = dict(
        experiments=["batch_size"],
        backends=["ort-cpu", "torch-cpu"],
        batches=[1, 2, 4],
        d_models=[8, 16],
        layers=[1, 2],
        fixed_params=1024,
        fixed_layers=[1, 4],
        zoo_batches=[1, 2],
        d_model=16,
        n_layers=2,
        threads=1,
        cache_dir=cache_dir,
        measure=MeasureSettings(warmup=1, min_repeats=3, min_time_s=0.0, max_time_s=0.05),
    )
    values.update(overrides)
    return BenchSettings(**values)


@pytest.fixture
def tiny(tmp_path: Path):
    """Factory of tiny settings whose ONNX cache lives in this test's tmp_path."""
    return lambda **overrides: tiny_settings(**{"cache_dir": tmp_path / "cache", **overrides})


@pytest.fixture(scope="module")
def zoo_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One ONNX cache per test module: a zoo export through torch.onnx takes seconds, so do it once."""
    return tmp_path_factory.mktemp("zoo-cache")
