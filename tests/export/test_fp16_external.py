"""latlab.export: the fp16 variant (models/<name>-fp16/) and external weight data past a size threshold."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from latlab import cli
from latlab.export.fp16 import FP16_MAX_REL_ERROR
from latlab.export.onnx_export import export, export_fp16, load_metadata
from latlab.export.zoo import ZooModel, build_cnn, build_mlp

CUDA = "CUDAExecutionProvider"


def cuda_loads() -> bool:
    """Whether ORT's CUDA provider really loads here (it is listed as available even where it cannot)."""
    if CUDA not in ort.get_available_providers():
        return False
    from tests.conftest import build_tiny_model
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_model(Path(tmp) / "t.onnx")
        return ort.InferenceSession(str(path), providers=[CUDA]).get_providers()[0] == CUDA


def tiny_mlp() -> ZooModel:
    torch.manual_seed(0)
    return build_mlp(4, 16, 3)


@pytest.fixture(scope="module")
def with_fp16(tmp_path_factory: pytest.TempPathFactory) -> tuple[ZooModel, dict, Path]:
    """A tiny cnn exported with --fp16: (zoo, fp32 metadata, models dir)."""
    torch.manual_seed(0)
    zoo = build_cnn(image_size=16, width=4, classes=5)
    models_dir = tmp_path_factory.mktemp("models")
    return zoo, export("cnn", zoo, models_dir, source="test", fp16=True), models_dir


def test_fp16_variant_is_its_own_model_folder(with_fp16: tuple[ZooModel, dict, Path]) -> None:
    _, meta, models_dir = with_fp16
    assert meta["fp16_variant"] == "cnn-fp16"
    half = load_metadata(models_dir / "cnn-fp16")
    assert half["name"] == "cnn-fp16" and half["fp32_model"] == "cnn" and half["config"]["fp16"] is True
    # clients send the same FP32 tensors to both variants
    assert half["inputs"] == meta["inputs"] and half["outputs"] == meta["outputs"]
    model = onnx.load(str(models_dir / "cnn-fp16" / "model.onnx"))
    onnx.checker.check_model(model, full_check=True)
    kinds = {init.data_type for init in model.graph.initializer if len(init.dims) > 1}
    assert kinds == {onnx.TensorProto.FLOAT16}  # every weight matrix / kernel is half precision
    fp32 = onnx.load(str(models_dir / "cnn" / "model.onnx"))
    weight_bytes = [sum(len(i.raw_data) for i in m.graph.initializer) for m in (fp32, model)]
    assert weight_bytes[1] <= 0.55 * weight_bytes[0]  # half the bytes (a few small fp32 tensors aside)


def test_fp16_parity_is_checked_with_a_looser_stated_tolerance(with_fp16: tuple[ZooModel, dict, Path]) -> None:
    zoo, meta, models_dir = with_fp16
    parity = load_metadata(models_dir / "cnn-fp16")["parity"]
    assert parity["status"] == "checked" and parity["provider"] == "CPUExecutionProvider"
    assert parity["tolerance_rel"] == FP16_MAX_REL_ERROR == 1e-2
    # fp16 is measurably less exact than fp32, and still within its tolerance
    assert meta["parity"]["max_rel_error"] < parity["max_rel_error"] <= FP16_MAX_REL_ERROR
    x = torch.randn(3, 3, 16, 16)
    session = ort.InferenceSession(str(models_dir / "cnn-fp16" / "model.onnx"), providers=["CPUExecutionProvider"])
    (have,) = session.run(None, {"image": x.numpy()})
    with torch.no_grad():
        want = zoo.module(x).numpy()
    assert have.dtype == np.float32
    assert np.max(np.abs(want - have)) <= FP16_MAX_REL_ERROR * np.max(np.abs(want))


def test_fp16_check_says_when_its_provider_cannot_run_it(tmp_path: Path) -> None:
    """Asked to check on CUDA: where CUDA does not load (ORT would fall back to CPU), the metadata says so."""
    zoo = tiny_mlp()
    export("mlp", zoo, tmp_path, source="test")
    meta = export_fp16("mlp", zoo, tmp_path / "mlp" / "model.onnx", tmp_path, "test", providers=[CUDA])
    if cuda_loads():
        assert meta["parity"]["status"] == "checked" and meta["parity"]["provider"] == CUDA
    else:
        status = meta["parity"]["status"]
        assert status.startswith(f"not checked: {CUDA} cannot run this fp16 graph")
        assert "did not load" in status and "fell back to CPUExecutionProvider" in status
    assert (tmp_path / "mlp-fp16" / "model.onnx").is_file()


@pytest.mark.gpu
def test_fp16_parity_on_cuda(tmp_path: Path) -> None:
    if not cuda_loads():
        pytest.skip("CUDA provider does not load on this machine")
    zoo = tiny_mlp()
    export("mlp", zoo, tmp_path, source="test")
    meta = export_fp16("mlp", zoo, tmp_path / "mlp" / "model.onnx", tmp_path, "test", providers=[CUDA])
    assert meta["parity"]["status"] == "checked" and meta["parity"]["provider"] == CUDA
    assert meta["parity"]["max_rel_error"] <= FP16_MAX_REL_ERROR


def test_cli_fp16_prints_both_parities(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["export", "mlp", "--hidden", "8", "--fp16", "--models-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "fp16 variant:" in out and "tolerance 1e-02" in out
    assert load_metadata(tmp_path / "mlp")["fp16_variant"] == "mlp-fp16"


def test_weights_past_the_threshold_go_to_external_data(tmp_path: Path) -> None:
    torch.manual_seed(0)
    zoo = build_mlp(4, 64, 3)
    meta = export("mlp", zoo, tmp_path, source="test", external_data_threshold=1000)  # 515 floats > 1000 B
    folder = tmp_path / "mlp"
    data = folder / "model.onnx.data"
    assert meta["external_data"] is True and data.is_file()
    # the weight matrices live in the data file (the exporter keeps tensors of <= 256 bytes inline)
    assert data.stat().st_size >= 4 * (4 * 64 + 64 * 3)
    graph_only = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    external = {i.name for i in graph_only.graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL}
    assert {i.name for i in graph_only.graph.initializer if len(i.dims) == 2} <= external
    onnx.checker.check_model(str(folder / "model.onnx"), full_check=True)
    x = torch.randn(5, 4)
    with torch.no_grad():
        want = zoo.module(x).numpy()
    (have,) = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.numpy()}
    )
    assert np.allclose(want, have, atol=1e-5)
    # a later export under the threshold is self-contained again: no stale weights file beside it
    meta = export("mlp", zoo, tmp_path, source="test")
    assert meta["external_data"] is False and not data.exists()


def test_fp16_variant_follows_the_external_data_threshold(tmp_path: Path) -> None:
    meta = export("mlp", tiny_mlp(), tmp_path, source="test", fp16=True, external_data_threshold=100)
    assert meta["external_data"] is True
    half = load_metadata(tmp_path / "mlp-fp16")
    assert half["external_data"] is True and (tmp_path / "mlp-fp16" / "model.onnx.data").is_file()
    assert half["parity"]["status"] == "checked"


def test_cli_threshold_option(tmp_path: Path) -> None:
    assert (
        cli.main(["export", "mlp", "--hidden", "8", "--models-dir", str(tmp_path), "--external-data-threshold", "0"])
        == 0
    )
    assert (tmp_path / "mlp" / "model.onnx.data").is_file()
