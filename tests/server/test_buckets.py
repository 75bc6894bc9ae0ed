"""Batch buckets with real ORT sessions on the CPU: padding, exactness, per-bucket sessions and graph buffers,
warm-up, padded-row metrics, length padding composed with row padding, capture refusals."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from prometheus_client import CollectorRegistry

from latlab.server.config import parse_config
from latlab.server.metrics import ServerMetrics
from latlab.server.runtime.buckets import (
    bucket_for,
    capture_refusal,
    cut_rows,
    has_conv,
    op_types,
    pad_rows,
    session_mode,
)
from latlab.server.runtime.deployment import Deployment
from latlab.server.runtime.graphs import CudaGraphRunner
from latlab.server.runtime.model import OnnxModel

from tests.conftest import build_tiny_model, tiny_weights
from tests.server.test_padding import build_token_model

BUCKETS = [1, 2, 4, 8]


def config(path: Path, provider: str = "cpu", **extra: object):
    return parse_config(
        {"deployments": [{"name": "m", "model_path": str(path), "provider": provider, **extra}]}
    ).deployments[0]


def conv_model(path: Path) -> Path:
    """y = Relu(Conv(x, W) + B) for x FP32 [batch, 2, 5, 5]: a small conv net."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, 5, 5])],
        initializer=[numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")],
    )
    return _save(path, graph)


def if_model(path: Path) -> Path:
    """y = x + 1 or x - 1 depending on a flag: control flow (an If node with two branch graphs)."""
    one = numpy_helper.from_array(np.ones(4, np.float32), "one")
    branch = lambda op, name: helper.make_graph(  # noqa: E731
        [helper.make_node(op, ["x", "one"], [name])],
        name,
        [],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 4])],
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["flag"], ["y"], then_branch=branch("Add", "up"), else_branch=branch("Sub", "down"))],
        "iffy",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[one],
    )
    return _save(path, graph)


def _save(path: Path, graph: onnx.GraphProto) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


# --- padding helpers -------------------------------------------------------------------------------


def test_bucket_for_is_the_smallest_bucket_that_holds_the_batch() -> None:
    assert [bucket_for(n, BUCKETS) for n in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    assert bucket_for(3, ()) == 3  # no buckets: the batch as it is


def test_pad_rows_repeats_the_last_row_and_cut_rows_drops_it() -> None:
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    words = np.array([["a"], ["b"]], dtype=object)
    padded = pad_rows({"x": x, "s": words}, 4)
    np.testing.assert_array_equal(padded["x"], [[0, 1], [2, 3], [4, 5], [4, 5]])
    assert padded["s"].tolist() == [["a"], ["b"], ["b"], ["b"]]
    assert pad_rows({"x": x}, 3)["x"] is x  # already a bucket: no copy
    scalar = np.array(2.0, np.float32)
    assert pad_rows({"x": x, "t": scalar}, 4)["t"] is scalar  # no batch axis, nothing to pad
    np.testing.assert_array_equal(cut_rows(padded, 3)["x"], x)


# --- what the graph says ---------------------------------------------------------------------------


def test_op_types_find_conv_and_control_flow_in_subgraphs(tmp_path: Path) -> None:
    assert has_conv(conv_model(tmp_path / "c.onnx"))
    assert not has_conv(build_tiny_model(tmp_path / "t.onnx"))
    assert {"If", "Add", "Sub"} <= op_types(if_model(tmp_path / "i.onnx"))  # branch bodies included


@pytest.mark.parametrize(
    ("provider", "wanted", "buckets", "conv", "mode"),
    [
        ("cuda", "auto", BUCKETS, True, "per_bucket"),  # the measured case: Conv re-plans on CUDA
        ("cuda", "auto", BUCKETS, False, "shared"),  # MatMul/attention models: no penalty measured
        ("tensorrt", "auto", BUCKETS, True, "shared"),  # TensorRT builds its own engines
        ("cpu", "auto", BUCKETS, True, "shared"),
        ("cpu", "per_bucket", BUCKETS, False, "per_bucket"),
        ("cuda", "shared", BUCKETS, True, "shared"),
        ("cuda", "per_bucket", [8], True, "shared"),  # one bucket: one session whatever was asked
        ("cuda", "auto", [], True, "off"),
    ],
)
def test_session_mode(provider: str, wanted: str, buckets: list, conv: bool, mode: str) -> None:
    asked = []
    assert session_mode(provider, wanted, buckets, lambda: asked.append(1) or conv) == mode
    assert len(asked) <= (provider == "cuda" and wanted == "auto")  # the graph is read only when it decides


def test_capture_refusals_name_why(tmp_path: Path) -> None:
    tiny = build_tiny_model(tmp_path / "t.onnx")
    assert capture_refusal(tiny, [], False) is None
    assert (
        capture_refusal(if_model(tmp_path / "i.onnx"), [], False)
        == "it has control-flow nodes (If) that a CUDA graph cannot capture"
    )
    assert "string tensors" in capture_refusal(tiny, [], True)


# --- exactness with real sessions ------------------------------------------------------------------


@pytest.mark.parametrize("sessions", ["shared", "per_bucket"])
def test_padded_runs_equal_each_request_run_alone(tmp_path: Path, sessions: str) -> None:
    model = OnnxModel(
        config(
            build_tiny_model(tmp_path / "t.onnx"),
            batcher={"max_batch_size": 8, "batch_buckets": BUCKETS, "bucket_sessions": sessions},
        )
    )
    assert model.bucket_mode == sessions and model.bucket_runs()["sessions"] == (4 if sessions == "per_bucket" else 1)
    w, b = tiny_weights()
    rng = np.random.default_rng(0)
    for rows in range(1, 9):
        x = rng.standard_normal((rows, 4)).astype(np.float32)
        y = model.run({"x": x})["y"]
        assert y.shape == (rows, 3)  # padded rows never come back
        alone = np.concatenate([model.run({"x": x[i : i + 1]})["y"] for i in range(rows)])
        np.testing.assert_array_equal(y, alone)
        np.testing.assert_allclose(y, x @ w + b, rtol=1e-5, atol=1e-5)


def test_per_bucket_sessions_each_see_one_shape(tmp_path: Path) -> None:
    """Each bucket's session only ever runs its bucket's shape (the point of them on CUDA's Conv)."""
    model = OnnxModel(
        config(
            conv_model(tmp_path / "c.onnx"),
            batcher={"max_batch_size": 4, "batch_buckets": [2, 4], "bucket_sessions": "per_bucket"},
        )
    )
    seen: dict[int, set] = {}
    for size, session in model._sessions.items():
        run = session.run
        session.run = lambda names, feed, _run=run, _size=size: (
            seen.setdefault(_size, set()).add(feed["x"].shape[0]),
            _run(names, feed),
        )[1]
    x = np.random.default_rng(1).standard_normal((4, 2, 5, 5)).astype(np.float32)
    for rows in (3, 1, 4, 2, 1, 3):
        np.testing.assert_array_equal(model.run({"x": x[:rows]})["y"], model.run({"x": x[:4]})["y"][:rows])
    assert seen == {2: {2}, 4: {4}}


def test_auto_shares_one_session_on_cpu_even_with_conv(tmp_path: Path) -> None:
    model = OnnxModel(config(conv_model(tmp_path / "c.onnx"), batcher={"max_batch_size": 4, "batch_buckets": [2, 4]}))
    assert (model.bucket_mode, model.bucket_runs()["sessions"]) == ("shared", 1)


def test_no_buckets_on_cpu_by_default(tmp_path: Path) -> None:
    model = OnnxModel(config(build_tiny_model(tmp_path / "t.onnx"), batcher={"max_batch_size": 8}))
    assert model.buckets == () and model.bucket_mode == "off" and model.bucket_for(5) == 5


def test_token_model_composes_length_padding_with_row_padding(tmp_path: Path) -> None:
    path = build_token_model(tmp_path / "tok.onnx", ("embedding",))
    deployment = Deployment(
        config(
            path,
            batcher={"max_batch_size": 8, "batch_buckets": [4, 8], "max_queue_delay_ms": 50.0},
            padding={"axis": 1, "values": {"input_ids": 0, "attention_mask": 0}},
        ),
        ServerMetrics(CollectorRegistry()),
    )
    try:
        assert deployment.wait_ready(30)
        lengths = [3, 5, 2]
        requests = [
            {"input_ids": np.arange(1, n + 1, dtype=np.int64)[None] % 11, "attention_mask": np.ones((1, n), np.int64)}
            for n in lengths
        ]
        alone = [deployment.model.run(r)["embedding"] for r in requests]
        got = _infer_together(deployment, requests)
        for mine, want in zip(got, alone):
            np.testing.assert_allclose(mine["embedding"], want, rtol=1e-6)
    finally:
        deployment.close()


def _infer_together(deployment: Deployment, requests: list[dict]) -> list[dict]:
    results: list = [None] * len(requests)

    def go(i: int) -> None:
        results[i] = deployment.batcher.infer(requests[i], next(iter(requests[i].values())).shape[0])

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


# --- warm-up and metrics ---------------------------------------------------------------------------


def test_warm_up_runs_every_bucket_and_only_buckets(tmp_path: Path) -> None:
    model = OnnxModel(
        config(build_tiny_model(tmp_path / "t.onnx"), batcher={"max_batch_size": 8, "batch_buckets": [2, 5, 8]})
    )
    assert [batch["x"].shape[0] for batch in model.warmup_batches(8)] == [2, 5, 8]


def test_padded_rows_are_counted_apart_from_requests(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    deployment = Deployment(
        config(build_tiny_model(tmp_path / "t.onnx"), batcher={"max_batch_size": 8, "batch_buckets": BUCKETS}),
        ServerMetrics(registry),
    )
    labels = {"deployment": "m", "model": deployment.config.model, "provider": "cpu"}
    value = lambda name: registry.get_sample_value(name, labels)  # noqa: E731
    try:
        assert deployment.wait_ready(30)
        assert value("latlab_batcher_padded_rows_total") == 0  # visible before any padding
        x = np.ones((3, 4), np.float32)
        assert deployment.batcher.infer({"x": x}, 3)["y"].shape == (3, 3)
        deployment.batcher.infer({"x": x[:1]}, 1)
        assert value("latlab_batcher_padded_rows_total") == 1  # 3 -> 4; 1 is a bucket
        assert value("latlab_batcher_run_rows_total") == 5
        assert value("latlab_batcher_batch_size_sum") == 4  # samples asked for, not rows run
        assert deployment.describe()["bucket_runs"] == {
            "batch_buckets": BUCKETS,
            "bucket_mode": "shared",
            "sessions": 1,
        }
    finally:
        deployment.close()


# --- CUDA graph bookkeeping on the CPU device --------------------------------------------------------


def test_graph_runner_keeps_fixed_buffers_and_one_graph_id_per_bucket(tmp_path: Path) -> None:
    model = OnnxModel(config(build_tiny_model(tmp_path / "t.onnx")))
    specs = [(s.name, s.dtype, s.shape) for s in model.inputs], [(s.name, s.dtype, s.shape) for s in model.outputs]
    runner = CudaGraphRunner(model.session, *specs, buckets=BUCKETS, device="cpu", graph_ids=True)
    assert [runner.graph_id(size) for size in BUCKETS] == [1, 2, 3, 4]
    addresses = {size: (runner.buffer_address(size, "x"), runner.buffer_address(size, "y")) for size in BUCKETS}
    assert len({a for pair in addresses.values() for a in pair}) == 8  # no two buckets share a buffer
    w, b = tiny_weights()
    rng = np.random.default_rng(5)
    for size in [4, 1, 8, 2, 4, 8]:
        x = rng.standard_normal((size, 4)).astype(np.float32)
        outputs, timings = runner.run({"x": x}, ["y"])
        np.testing.assert_allclose(outputs["y"], x @ w + b, rtol=1e-5, atol=1e-5)
        assert timings.compute_s >= 0
    assert addresses == {
        size: (runner.buffer_address(size, "x"), runner.buffer_address(size, "y")) for size in BUCKETS
    }  # replays never moved a buffer
    assert CudaGraphRunner(model.session, *specs, buckets=[1], device="cpu").graph_id(1) is None
    with pytest.raises(ValueError, match=r"a batch of 3 rows has no CUDA graph bucket"):
        runner.run({"x": np.ones((3, 4), np.float32)}, ["y"])
