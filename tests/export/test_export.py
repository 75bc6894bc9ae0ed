"""latlab.export: zoo modules exported to ONNX with a symbolic batch axis, checked, described and compared."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from latlab import cli
from latlab.export.onnx_export import METADATA_FILE, MAX_REL_ERROR, ParityError, check_parity, export, load_metadata
from latlab.export.zoo import ZooModel, build_ffn, build_mlp

FFN_D_MODEL, FFN_LAYERS = 16, 4
MLP_IN, MLP_HIDDEN, MLP_OUT = 4, 8, 2


def build(kind: str) -> ZooModel:
    torch.manual_seed(0)
    if kind == "ffn":
        return build_ffn(d_model=FFN_D_MODEL, n_layers=FFN_LAYERS)
    return build_mlp(MLP_IN, MLP_HIDDEN, MLP_OUT)


@pytest.fixture(scope="module", params=["ffn", "mlp"])
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[ZooModel, dict, Path]:
    """(zoo model, returned metadata, model folder) of a small model exported into a fresh folder.

    Module-scoped because an export takes about a second; the tests only read what it wrote."""
    models_dir = tmp_path_factory.mktemp("models")
    zoo = build(request.param)
    metadata = export(request.param, zoo, models_dir, source="test")
    return zoo, metadata, models_dir / request.param


def linear_layers(module: nn.Module) -> list[nn.Linear]:
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


def rel_error(want: np.ndarray, have: np.ndarray) -> float:
    return float(np.max(np.abs(want - have)) / np.max(np.abs(want)))


def test_export_writes_model_and_metadata(exported: tuple[ZooModel, dict, Path]) -> None:
    zoo, metadata, folder = exported
    assert (folder / "model.onnx").is_file()
    assert (folder / METADATA_FILE).is_file()
    on_disk = json.loads((folder / METADATA_FILE).read_text())
    assert on_disk == metadata == load_metadata(folder)
    assert metadata["name"] == folder.name
    assert metadata["source"] == "test"
    assert metadata["config"] == zoo.config


def test_exported_model_passes_the_checker(exported: tuple[ZooModel, dict, Path]) -> None:
    _, _, folder = exported
    onnx.checker.check_model(onnx.load(str(folder / "model.onnx")), full_check=True)


def test_batch_axis_is_symbolic_in_graph_and_metadata(exported: tuple[ZooModel, dict, Path]) -> None:
    zoo, metadata, folder = exported
    features = zoo.inputs["x"].shape[1]
    (graph_input,) = onnx.load(str(folder / "model.onnx")).graph.input
    first, second = graph_input.type.tensor_type.shape.dim
    assert first.HasField("dim_param") and first.dim_param == "batch"
    assert second.dim_value == features
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["batch", features]}]
    out_features = linear_layers(zoo.module)[-1].out_features
    assert metadata["outputs"] == [{"name": "y", "datatype": "FP32", "shape": ["batch", out_features]}]


@pytest.mark.parametrize("batch", [1, 7, 33])
def test_onnx_runtime_matches_torch_at_any_batch(exported: tuple[ZooModel, dict, Path], batch: int) -> None:
    zoo, _, folder = exported
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    x = torch.randn(batch, zoo.inputs["x"].shape[1])
    with torch.no_grad():
        want = zoo.module(x).numpy()
    (have,) = session.run(["y"], {"x": x.numpy()})
    assert have.shape == want.shape == (batch, linear_layers(zoo.module)[-1].out_features)
    assert rel_error(want, have) <= 1e-4


def test_metadata_params_count_every_torch_parameter(exported: tuple[ZooModel, dict, Path]) -> None:
    zoo, metadata, _ = exported
    assert metadata["params"] == sum(p.numel() for p in zoo.module.parameters())
    by_hand = {
        "ffn": FFN_LAYERS * FFN_D_MODEL**2,  # bias-free blocks
        "mlp": MLP_IN * MLP_HIDDEN + MLP_HIDDEN + MLP_HIDDEN * MLP_OUT + MLP_OUT,
    }
    assert metadata["params"] == by_hand[metadata["name"]]


def test_flops_per_sample_are_twice_the_dense_multiply_adds(exported: tuple[ZooModel, dict, Path]) -> None:
    zoo, metadata, _ = exported
    assert metadata["flops_per_sample"] == 2 * sum(m.in_features * m.out_features for m in linear_layers(zoo.module))
    by_hand = {"ffn": 2 * FFN_LAYERS * FFN_D_MODEL**2, "mlp": 2 * (4 * 8 + 8 * 2)}
    assert metadata["flops_per_sample"] == by_hand[metadata["name"]]


def test_parity_is_reported_and_within_tolerance(exported: tuple[ZooModel, dict, Path]) -> None:
    _, metadata, _ = exported
    parity = metadata["parity"]
    assert parity["batches"] == [1, 7]
    assert parity["tolerance_rel"] == MAX_REL_ERROR
    assert 0.0 <= parity["max_rel_error"] <= MAX_REL_ERROR
    assert 0.0 <= parity["max_abs_error"] < 1e-3


def test_check_parity_passes_for_the_exported_module(exported: tuple[ZooModel, dict, Path]) -> None:
    zoo, _, folder = exported
    parity = check_parity(zoo, folder / "model.onnx", batches=(1, 33))
    assert parity.max_rel_error <= MAX_REL_ERROR


def test_check_parity_raises_when_onnx_file_disagrees_with_module(tmp_path: Path) -> None:
    zoo = build("mlp")
    export("mlp", zoo, tmp_path, source="test")
    torch.manual_seed(1)
    other = build_mlp(MLP_IN, MLP_HIDDEN, MLP_OUT)
    impostor = ZooModel(other.module, zoo.inputs, zoo.output_names, zoo.config)
    with pytest.raises(ParityError, match="max rel error"):
        check_parity(impostor, tmp_path / "mlp" / "model.onnx")


def test_deep_ffn_keeps_outputs_finite_and_near_the_input_norm() -> None:
    torch.manual_seed(0)
    zoo = build_ffn(d_model=16, n_layers=512)
    x = torch.randn(64, 16)
    with torch.no_grad():
        y = zoo.module(x)
    assert torch.isfinite(y).all()
    ratio = y.norm(dim=1) / x.norm(dim=1)
    assert ratio.max().item() <= 10.0


def test_cli_export_prints_parity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.manual_seed(0)
    assert cli.main(["export", "mlp", "--models-dir", str(tmp_path), "--hidden", "8"]) == 0
    out = capsys.readouterr().out
    assert "max abs error" in out and "max rel error" in out
    assert (tmp_path / "mlp" / "model.onnx").is_file()
    assert load_metadata(tmp_path / "mlp")["config"] == {"in_features": 4, "hidden": 8, "out_features": 1}
