"""latlab.server.runtime.model: output selection, I/O binding on the CPU device, CUDA graph buffers, BYTES, warm-up."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from latlab.server.config import DeploymentConfig, parse_config
from latlab.server.errors import BadRequest
from latlab.server.runtime.buckets import capture_refusal
from latlab.server.runtime.model import WARMUP_LENGTH, CudaGraphRunner, OnnxModel, RunTimings, run_bound


def save(path: Path, nodes: list, inputs: list, outputs: list) -> Path:
    model = helper.make_model(
        helper.make_graph(nodes, path.stem, inputs, outputs), opset_imports=[helper.make_opsetid("", 17)], ir_version=9
    )
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def two_outputs(tmp_path: Path, batch: object = "batch") -> Path:
    """double = x + x, square = x * x, for x FP32 [batch, 4]."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])
    return save(
        tmp_path / "two.onnx",
        [helper.make_node("Add", ["x", "x"], ["double"]), helper.make_node("Mul", ["x", "x"], ["square"])],
        [x],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [batch, 4]) for n in ("double", "square")],
    )


def strings(tmp_path: Path) -> Path:
    """t = Identity(s) for s STRING [batch, 2]."""
    return save(
        tmp_path / "strings.onnx",
        [helper.make_node("Identity", ["s"], ["t"])],
        [helper.make_tensor_value_info("s", TensorProto.STRING, ["batch", 2])],
        [helper.make_tensor_value_info("t", TensorProto.STRING, ["batch", 2])],
    )


def tokens(tmp_path: Path) -> Path:
    """n = ids + 1 for ids INT64 [batch, seq]: a dynamic dimension besides the batch."""
    one = helper.make_tensor("one", TensorProto.INT64, [], [1])
    graph = helper.make_graph(
        [helper.make_node("Add", ["ids", "one"], ["n"])],
        "tokens",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("n", TensorProto.INT64, ["batch", "seq"])],
        initializer=[one],
    )
    path = tmp_path / "tokens.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return path


def deployment(path: Path, **extra: object) -> DeploymentConfig:
    return parse_config({"deployments": [{"name": "m", "model_path": str(path), **extra}]}).deployments[0]


X = np.arange(8, dtype=np.float32).reshape(2, 4) - 3


def test_run_returns_only_the_outputs_asked_for(tmp_path: Path) -> None:
    model = OnnxModel(deployment(two_outputs(tmp_path)))
    assert set(model.run({"x": X})) == {"double", "square"}
    only = model.run({"x": X}, ["square"])
    assert list(only) == ["square"]
    np.testing.assert_array_equal(only["square"], X * X)


def test_cpu_runs_are_plain_and_report_no_transfer(tmp_path: Path) -> None:
    model = OnnxModel(deployment(two_outputs(tmp_path)))
    assert model.bound is False and model.device == "cpu"
    outputs, timings = model.run_timed({"x": X}, ["double"])
    assert timings is None
    np.testing.assert_array_equal(outputs["double"], X + X)


def test_io_binding_on_the_cpu_device_matches_a_plain_run(tmp_path: Path) -> None:
    model = OnnxModel(deployment(two_outputs(tmp_path)))
    outputs, timings = run_bound(model.session, {"x": X}, ["square", "double"], "cpu", 0)
    assert list(outputs) == ["square", "double"]  # in the order asked
    np.testing.assert_array_equal(outputs["square"], X * X)
    np.testing.assert_array_equal(outputs["double"], X + X)
    assert isinstance(timings, RunTimings)
    assert min(timings.input_s, timings.compute_s, timings.output_s) >= 0


def test_io_binding_copies_back_only_the_requested_output(tmp_path: Path) -> None:
    model = OnnxModel(deployment(two_outputs(tmp_path)))
    outputs, _ = run_bound(model.session, {"x": X}, ["double"], "cpu", 0)
    assert list(outputs) == ["double"]


def test_io_binding_takes_non_contiguous_and_batched_inputs(tmp_path: Path) -> None:
    model = OnnxModel(deployment(two_outputs(tmp_path)))
    wide = np.arange(64, dtype=np.float32).reshape(8, 8)[:, ::2]  # a strided view, as slicing gives
    outputs, _ = run_bound(model.session, {"x": wide}, ["double"], "cpu", 0)
    np.testing.assert_array_equal(outputs["double"], wide + wide)


def test_cuda_graph_buffers_replay_with_new_inputs(tmp_path: Path) -> None:
    """The graph runner's buffer logic, on the CPU device: fixed buffers, new values each run."""
    model = OnnxModel(deployment(two_outputs(tmp_path, batch=1)))
    spec = [(s.name, s.dtype, s.shape) for s in model.inputs], [(s.name, s.dtype, s.shape) for s in model.outputs]
    runner = CudaGraphRunner(model.session, *spec, buckets=(1,), device="cpu")
    for scale in (1.0, -2.0, 0.5):
        x = (X[:1] * scale).astype(np.float32)
        outputs, timings = runner.run({"x": x}, ["square"])
        assert list(outputs) == ["square"]
        np.testing.assert_array_equal(outputs["square"], x * x)
        assert timings.compute_s >= 0


def test_cuda_graph_is_refused_for_dynamic_dimensions(tmp_path: Path) -> None:
    assert (
        capture_refusal(tokens(tmp_path), ["ids", "n"], False)
        == "['ids', 'n'] have dynamic dimensions besides the batch (a graph replays fixed shapes)"
    )


def test_string_model_runs_bytes_inputs_as_text(tmp_path: Path) -> None:
    model = OnnxModel(deployment(strings(tmp_path)))
    assert [spec.datatype for spec in (*model.inputs, *model.outputs)] == ["BYTES", "BYTES"]
    text = np.empty((1, 2), dtype=object)
    text[0] = ["caf\u00e9".encode(), b""]
    assert model.validate({"s": text}) == 1
    out = model.run({"s": text})["t"]
    assert out.tolist() == [["caf\u00e9", ""]]  # not "b'caf\\xc3\\xa9'", ORT's reading of a bytes object


def test_string_input_that_is_not_utf8_is_refused_before_queueing(tmp_path: Path) -> None:
    model = OnnxModel(deployment(strings(tmp_path)))
    bad = np.empty((1, 2), dtype=object)
    bad[0] = [b"ok", b"\xff"]
    with pytest.raises(BadRequest, match="input 's' holds an element that is not UTF-8 text"):
        model.validate({"s": bad})


def test_warmup_covers_every_batch_size_with_zeros(tmp_path: Path) -> None:
    model = OnnxModel(deployment(tokens(tmp_path)))
    batches = list(model.warmup_batches(5))
    assert [b["ids"].shape for b in batches] == [(n, WARMUP_LENGTH) for n in range(1, 6)]
    assert all(not b["ids"].any() and b["ids"].dtype == np.int64 for b in batches)
    for inputs in batches:
        assert model.run(inputs)["n"].shape == inputs["ids"].shape  # zeros are valid input here


def test_warmup_of_a_fixed_batch_model_uses_its_size_only(tmp_path: Path) -> None:
    model = OnnxModel(deployment(two_outputs(tmp_path, batch=1)))
    assert [b["x"].shape for b in model.warmup_batches(64)] == [(1, 4)]


def test_warmup_of_string_inputs_uses_empty_strings(tmp_path: Path) -> None:
    model = OnnxModel(deployment(strings(tmp_path)))
    [first, second] = list(model.warmup_batches(2))
    assert second["s"].shape == (2, 2) and second["s"].tolist() == [["", ""], ["", ""]]
    assert model.run(first)["t"].shape == (1, 2)


def test_metadata_keeps_minus_one_for_dynamic_dimensions(tmp_path: Path) -> None:
    meta = OnnxModel(deployment(tokens(tmp_path))).metadata()
    assert meta["inputs"] == [{"name": "ids", "datatype": "INT64", "shape": [-1, -1]}]
    assert meta["outputs"] == [{"name": "n", "datatype": "INT64", "shape": [-1, -1]}]
    fixed = OnnxModel(deployment(two_outputs(tmp_path, batch=1))).metadata()
    assert fixed["inputs"][0]["shape"] == [1, 4]
