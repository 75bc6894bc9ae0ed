"""latlab export of the user's own models: `--module package.module:factory` and `--onnx FILE`, and bad input."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from latlab import cli
from latlab.export.adopt import NO_PARITY, adopt_onnx, load_factory
from latlab.export.onnx_export import ExportError, load_metadata
from tests.conftest import build_tiny_model, tiny_weights
from tests.export.factories import IN_A, IN_B, OUT, two_inputs

FACTORY = "tests.export.factories"


def export_cli(tmp_path: Path, *args: str) -> int:
    return cli.main(["export", "--models-dir", str(tmp_path), *args])


def test_module_factory_exports_two_inputs_and_named_outputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert export_cli(tmp_path, "--module", f"{FACTORY}:two_inputs", "--name", "mine") == 0
    meta = load_metadata(tmp_path / "mine")
    assert meta["source"] == f"user module {FACTORY}:two_inputs"
    assert meta["inputs"] == [
        {"name": "a", "datatype": "FP32", "shape": ["batch", IN_A]},
        {"name": "b", "datatype": "FP32", "shape": ["batch", IN_B]},
    ]
    assert [o["name"] for o in meta["outputs"]] == ["y", "total"]
    assert meta["params"] == IN_A * OUT + OUT + IN_B * OUT + OUT
    assert meta["parity"]["max_rel_error"] <= 1e-4
    module, _, _ = two_inputs()
    a, b = torch.randn(9, IN_A), torch.randn(9, IN_B)
    with torch.no_grad():
        want_y, want_total = module(a, b)
    session = ort.InferenceSession(str(tmp_path / "mine" / "model.onnx"), providers=["CPUExecutionProvider"])
    y, total = session.run(["y", "total"], {"a": a.numpy(), "b": b.numpy()})
    assert np.allclose(y, want_y.numpy(), atol=1e-5) and np.allclose(total, want_total.numpy(), atol=1e-5)
    assert "exported mine" in capsys.readouterr().out


def test_factory_without_output_names_gets_numbered_ones() -> None:
    zoo = load_factory(f"{FACTORY}:unnamed_outputs")
    assert zoo.output_names == ["y0", "y1"] and zoo.config == {"module": f"{FACTORY}:unnamed_outputs"}


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no_colon_here", "write package.module:factory"),
        ("latlab_no_such_package.mod:f", "cannot import latlab_no_such_package.mod"),
        (f"{FACTORY}:missing", "has no attribute 'missing'"),
        (f"{FACTORY}:not_a_module", "not an nn.Module"),
        (f"{FACTORY}:bad_inputs", "dict of name -> tensor"),
        (f"{FACTORY}:fixed_batch", "torch.onnx.export failed"),
    ],
)
def test_bad_module_spec_is_one_readable_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: str, message: str
) -> None:
    assert export_cli(tmp_path, "--module", spec, "--name", "x") == 2
    err = capsys.readouterr().err
    assert err.startswith("latlab: error:") and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_onnx_file_is_adopted_with_its_signature(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = build_tiny_model(tmp_path / "elsewhere" / "tiny.onnx")
    assert export_cli(tmp_path / "models", "--onnx", str(src), "--name", "adopted") == 0
    folder = tmp_path / "models" / "adopted"
    meta = load_metadata(folder)
    assert meta["parity"] == NO_PARITY == "not applicable (no PyTorch source)"
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["batch", 4]}]
    assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": ["batch", 3]}]
    assert meta["params"] == 4 * 3 + 3 and meta["opset"] == 17 and meta["flops_per_sample"] == 2 * 4 * 3
    assert meta["batch_dynamic"] is True and meta["cpu_smoke_run"].startswith("ok")
    w, b = tiny_weights()
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    (y,) = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.allclose(y, x @ w + b, atol=1e-5)
    assert "not applicable" in capsys.readouterr().out


def fixed_batch_model(path: Path) -> Path:
    w, b = tiny_weights()
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])],
        "fixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        initializer=[numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return path


def test_fixed_first_axis_is_refused_unless_allowed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = fixed_batch_model(tmp_path / "fixed.onnx")
    assert export_cli(tmp_path / "models", "--onnx", str(src), "--name", "fixed") == 2
    err = capsys.readouterr().err
    assert "first axis of input(s) x is fixed" in err and "--allow-fixed-batch" in err
    assert not (tmp_path / "models" / "fixed").exists()
    assert export_cli(tmp_path / "models", "--onnx", str(src), "--name", "fixed", "--allow-fixed-batch") == 0
    meta = load_metadata(tmp_path / "models" / "fixed")
    assert meta["batch_dynamic"] is False and "max_batch_size = 1" in meta["warning"]
    assert "warning:" in capsys.readouterr().out


def test_missing_onnx_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert export_cli(tmp_path, "--onnx", str(tmp_path / "nope.onnx"), "--name", "x") == 2
    err = capsys.readouterr().err
    assert "nope.onnx does not exist" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("damage", ["garbage", "truncated", "invalid graph"])
def test_corrupt_onnx_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str) -> None:
    path = build_tiny_model(tmp_path / "bad.onnx")
    if damage == "garbage":
        path.write_bytes(b"this is not a protobuf \xff\xfe" * 10)
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:40])
    else:
        model = onnx.load(str(path))
        model.graph.node[1].input[0] = "nowhere"  # Add reads a value nothing produces
        onnx.save(model, str(path))
    assert export_cli(tmp_path / "models", "--onnx", str(path), "--name", "bad") == 2
    err = capsys.readouterr().err
    assert "is not a valid ONNX model" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "models" / "bad").exists()


def test_adopt_api_refuses_without_the_cli(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="fixed"):
        adopt_onnx(fixed_batch_model(tmp_path / "f.onnx"), "f", tmp_path / "models")
    with pytest.raises(FileNotFoundError):
        adopt_onnx(tmp_path / "absent.onnx", "a", tmp_path / "models")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["mlp", "--onnx", "x.onnx", "--name", "n"], "exactly one of"),
        ([], "exactly one of"),
        (["--onnx", "x.onnx"], "need --name"),
        (["cnn", "--width", "0"], "--width must be a positive integer"),
        (["rnn", "--seq-len", "-3"], "--seq-len must be a positive integer"),
    ],
)
def test_source_must_be_exactly_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert export_cli(tmp_path, *argv) == 2
    assert message in capsys.readouterr().err


def test_adopted_external_data_model_is_copied_with_its_weights(tmp_path: Path) -> None:
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    model = onnx.load(str(build_tiny_model(tmp_path / "t.onnx")))
    onnx.save_model(
        model, str(src_dir / "ext.onnx"), save_as_external_data=True, location="weights.bin", size_threshold=0
    )
    meta = adopt_onnx(src_dir / "ext.onnx", "ext", tmp_path / "models", external_data_threshold=0)
    shutil.rmtree(src_dir)  # the adopted copy must not depend on the original's files
    folder = tmp_path / "models" / "ext"
    assert meta["external_data"] is True and (folder / "model.onnx.data").is_file()
    x = np.ones((2, 4), np.float32)
    w, b = tiny_weights()
    (y,) = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.allclose(y, x @ w + b, atol=1e-5)
