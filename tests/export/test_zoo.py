"""latlab.export zoo: rnn (LSTM/GRU over a dynamic sequence) and cnn (ResNet-18 shape), tiny sizes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from latlab import cli
from latlab.export.onnx_export import MAX_REL_ERROR, export, load_metadata
from latlab.export.resnet import BasicBlock, ResNet18
from latlab.export.zoo import BUILDERS, ZooModel, build_cnn, build_rnn

RNN = {"input_size": 4, "hidden": 8, "rnn_layers": 2, "seq_len": 5, "out_features": 3}
CNN = {"image_size": 32, "width": 8, "classes": 10}


@pytest.fixture(scope="module", params=["lstm", "gru", "cnn"])
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[ZooModel, dict, Path]:
    """(zoo model, metadata, folder) of a tiny rnn (each cell) or cnn, exported once per module."""
    torch.manual_seed(0)
    zoo = build_cnn(**CNN) if request.param == "cnn" else build_rnn(cell=request.param, **RNN)
    models_dir = tmp_path_factory.mktemp("models")
    return zoo, export(request.param, zoo, models_dir, source="test"), models_dir / request.param


def dims(value: onnx.ValueInfoProto) -> list:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def session(folder: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])


def test_builders_cover_the_zoo() -> None:
    assert set(BUILDERS) == {"mlp", "ffn", "rnn", "cnn", "minilm"}


def test_checker_passes_and_axes_are_symbolic(exported: tuple[ZooModel, dict, Path]) -> None:
    zoo, metadata, folder = exported
    model = onnx.load(str(folder / "model.onnx"))
    onnx.checker.check_model(model, full_check=True)
    (graph_input,) = model.graph.input
    if isinstance(zoo.module, ResNet18):
        assert dims(graph_input) == ["batch", 3, 32, 32]
        assert metadata["dynamic_axes"] == {"image": {"0": "batch"}}
        assert metadata["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": ["batch", 10]}]
    else:
        assert dims(graph_input) == ["batch", "seq", RNN["input_size"]]
        assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["batch", "seq", 4]}]
        assert metadata["dynamic_axes"] == {"x": {"0": "batch", "1": "seq"}}
        assert metadata["outputs"] == [{"name": "y", "datatype": "FP32", "shape": ["batch", 3]}]


def test_parity_is_measured_and_small(exported: tuple[ZooModel, dict, Path]) -> None:
    _, metadata, _ = exported
    parity = metadata["parity"]
    assert 0.0 <= parity["max_rel_error"] <= MAX_REL_ERROR
    assert parity["max_abs_error"] < 1e-4


@pytest.mark.parametrize("batch, seq", [(1, 1), (6, 5), (3, 17)])
def test_runs_at_any_batch_and_sequence_length(exported: tuple[ZooModel, dict, Path], batch: int, seq: int) -> None:
    zoo, _, folder = exported
    if isinstance(zoo.module, ResNet18):
        x = torch.randn(batch, 3, 32, 32)
    else:
        x = torch.randn(batch, seq, RNN["input_size"])
    with torch.no_grad():
        want = zoo.module(x).numpy()
    (have,) = session(folder).run(None, {list(zoo.inputs)[0]: x.numpy()})
    assert have.shape == want.shape and have.shape[0] == batch
    assert np.max(np.abs(want - have)) <= 1e-4 * max(1.0, float(np.max(np.abs(want))))


def test_output_depends_on_the_first_step_or_pixel(exported: tuple[ZooModel, dict, Path]) -> None:
    zoo, _, folder = exported
    name = list(zoo.inputs)[0]
    shape = (2, 3, 32, 32) if isinstance(zoo.module, ResNet18) else (2, 9, RNN["input_size"])
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    changed = x.copy()
    changed[:, 0, 0] += 1.0  # the first time step (rnn) or the first row's channel (cnn): must still reach the output
    run = session(folder).run
    assert not np.allclose(run(None, {name: x})[0], run(None, {name: changed})[0], atol=1e-6)


def test_flops_count_convolutions_and_recurrent_cells(exported: tuple[ZooModel, dict, Path]) -> None:
    zoo, metadata, _ = exported
    if isinstance(zoo.module, ResNet18):
        expected = _cnn_flops(zoo.module, CNN["image_size"])
        assert "flops_at" not in metadata
    else:
        gates = 4 if zoo.config["cell"] == "lstm" else 3
        h, i, seq = RNN["hidden"], RNN["input_size"], RNN["seq_len"]
        per_step = 2 * gates * h * ((i + h) + (h + h) * (RNN["rnn_layers"] - 1))
        expected = per_step * seq + 2 * h * RNN["out_features"]
        assert metadata["flops_at"] == {"seq": seq}
    assert metadata["flops_per_sample"] == expected


def _cnn_flops(module: nn.Module, size: int) -> int:
    """2 x multiply-adds of every Conv2d (measured with hooks on a real forward) plus the classifier."""
    total = 0

    def hook(conv: nn.Conv2d, _: tuple, out: torch.Tensor) -> None:
        nonlocal total
        total += 2 * conv.weight.numel() * out.shape[2] * out.shape[3]

    handles = [m.register_forward_hook(hook) for m in module.modules() if isinstance(m, nn.Conv2d)]
    with torch.no_grad():
        module(torch.randn(1, 3, size, size))
    for handle in handles:
        handle.remove()
    return total + 2 * module.fc.weight.numel()


def test_resnet18_has_the_paper_shape_at_default_width() -> None:
    net = ResNet18()
    blocks = [m for m in net.modules() if isinstance(m, BasicBlock)]
    assert len(blocks) == 8
    assert sum(p.numel() for p in net.parameters()) == 11_689_512  # torchvision's resnet18, 1000 classes
    convs = [m for m in net.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 20  # stem + 16 in blocks + 3 projection shortcuts


def test_cnn_params_and_output_shape_at_tiny_width() -> None:
    zoo = build_cnn(**CNN)
    with torch.no_grad():
        assert zoo.module(torch.randn(3, 3, 32, 32)).shape == (3, 10)
    assert zoo.config == CNN


def test_rnn_rejects_an_unknown_cell() -> None:
    with pytest.raises(ValueError, match="lstm"):
        build_rnn(cell="transformer")


def test_cli_exports_rnn_and_cnn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        cli.main(
            [
                "export",
                "rnn",
                "--models-dir",
                str(tmp_path),
                "--cell",
                "gru",
                "--hidden",
                "6",
                "--input-size",
                "3",
                "--rnn-layers",
                "1",
                "--seq-len",
                "4",
                "--name",
                "tiny-gru",
            ]
        )
        == 0
    )
    meta = load_metadata(tmp_path / "tiny-gru")
    assert meta["config"] == {
        "cell": "gru",
        "input_size": 3,
        "hidden": 6,
        "rnn_layers": 1,
        "seq_len": 4,
        "out_features": 8,
    }
    assert (
        cli.main(
            ["export", "cnn", "--models-dir", str(tmp_path), "--width", "4", "--image-size", "16", "--classes", "5"]
        )
        == 0
    )
    assert load_metadata(tmp_path / "cnn")["outputs"][0]["shape"] == ["batch", 5]
    out = capsys.readouterr().out
    assert out.count("max rel error") == 2 and "exported tiny-gru" in out and "exported cnn" in out
