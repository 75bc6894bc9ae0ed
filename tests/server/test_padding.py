"""Padding variable-length inputs: merge/split helpers, config, and batched results equal to running alone."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from prometheus_client import CollectorRegistry

from latlab.server.batching.batcher import DynamicBatcher
from latlab.server.batching.tensors import merge, pad_to, request_length, shape_key, split
from latlab.server.config import BatcherSettings, PaddingSettings, parse_config
from latlab.server.errors import BadRequest, ConfigError
from latlab.server.metrics import ServerMetrics
from latlab.server.protocol import InferRequest
from latlab.server.runtime.deployment import Deployment

VOCAB, WIDTH = 11, 4
PADDING = PaddingSettings(axis=1, values={"input_ids": 0, "attention_mask": 0})
WAIT_S = 5.0


def build_token_model(path: Path, outputs: tuple[str, ...]) -> Path:
    """A toy encoder: ids -> embedding table -> tanh(x W) per token ("hidden", [batch, seq, 4]) and its
    masked mean over the tokens ("embedding", [batch, 4]) = ReduceSum(h*mask) / ReduceSum(mask)."""
    rng = np.random.default_rng(7)
    table = rng.standard_normal((VOCAB, WIDTH)).astype(np.float32)
    weight = rng.standard_normal((WIDTH, WIDTH)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["emb"]),
        helper.make_node("MatMul", ["emb", "W"], ["pre"]),
        helper.make_node("Tanh", ["pre"], ["hidden"]),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_f", "two"], ["mask3"]),
        helper.make_node("Mul", ["hidden", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "one"], ["total"], keepdims=0),
        helper.make_node("ReduceSum", ["mask3", "one"], ["count"], keepdims=0),
        helper.make_node("Div", ["total", "count"], ["embedding"]),
    ]
    shapes = {"hidden": ["batch", "seq", WIDTH], "embedding": ["batch", WIDTH]}
    graph = helper.make_graph(
        nodes,
        "tokens",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shapes[name]) for name in outputs],
        initializer=[
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(weight, "W"),
            numpy_helper.from_array(np.array([1], np.int64), "one"),
            numpy_helper.from_array(np.array([2], np.int64), "two"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def tokens(rng: np.random.Generator, length: int, rows: int = 1) -> dict[str, np.ndarray]:
    ids = rng.integers(1, VOCAB, size=(rows, length), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones((rows, length), np.int64)}


class RecordingSession:
    """run_batch over a real ORT session that records the input shapes of every batch."""

    def __init__(self, path: Path) -> None:
        self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self.names = [o.name for o in self.session.get_outputs()]
        self.shapes: list[tuple[int, ...]] = []
        self.lock = threading.Lock()

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self.lock:
            self.shapes.append(inputs["input_ids"].shape)
        return dict(zip(self.names, self.session.run(self.names, inputs)))

    def alone(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.names, self.session.run(self.names, inputs)))


class Positions:
    """The batcher's metrics, keeping what its padded batches computed and what was asked."""

    def __init__(self) -> None:
        self.runs: list[tuple[int, int]] = []

    def queue_depth(self, depth: int) -> None: ...
    def rejected(self, reason: str) -> None: ...
    def batch_done(self, size: int, queue_s, compute_s: float, ok: bool) -> None: ...

    def positions_run(self, run: int, real: int) -> None:
        self.runs.append((run, real))


def run_through_batcher(
    model: RecordingSession,
    requests: list[dict],
    padding: PaddingSettings | None,
    max_batch_size: int = 16,
    metrics: Positions | None = None,
) -> list[dict]:
    settings = BatcherSettings(max_batch_size=max_batch_size, max_queue_delay_ms=300.0)
    batcher = DynamicBatcher(model, settings, metrics, padding=padding)
    try:
        futures = [batcher.submit(r, len(r["input_ids"])) for r in requests]
        return [f.result(WAIT_S) for f in futures]
    finally:
        batcher.close(WAIT_S)


@pytest.mark.parametrize("outputs", [("embedding",), ("hidden",), ("hidden", "embedding")])
def test_mixed_lengths_share_a_batch_and_match_running_alone(tmp_path: Path, outputs) -> None:
    model = RecordingSession(build_token_model(tmp_path / "m.onnx", outputs))
    rng = np.random.default_rng(0)
    requests = [tokens(rng, n) for n in (3, 7, 5, 1)] + [tokens(rng, 4, rows=2), tokens(rng, 7)]
    positions = Positions()
    results = run_through_batcher(model, requests, PADDING, max_batch_size=7, metrics=positions)  # one full batch
    assert model.shapes == [(7, 7)]  # every length in one batch, padded to the longest
    assert positions.runs == [(7 * 7, 3 + 7 + 5 + 1 + 2 * 4 + 7)]  # the pad tokens it added, counted
    for request, got in zip(requests, results):
        want = model.alone(request)
        assert set(got) == set(outputs)
        for name in outputs:
            assert got[name].shape == want[name].shape  # per-token outputs cut back to the own length
            np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6)


def test_without_padding_lengths_are_grouped_apart(tmp_path: Path) -> None:
    model = RecordingSession(build_token_model(tmp_path / "m.onnx", ("hidden", "embedding")))
    rng = np.random.default_rng(1)
    requests = [tokens(rng, n) for n in (3, 5, 3)]
    results = run_through_batcher(model, requests, None)
    assert sorted(model.shapes) == [(1, 5), (2, 3)]
    for request, got in zip(requests, results):
        np.testing.assert_allclose(got["embedding"], model.alone(request)["embedding"], rtol=1e-6, atol=1e-6)


def test_buckets_keep_far_apart_lengths_in_separate_batches(tmp_path: Path) -> None:
    model = RecordingSession(build_token_model(tmp_path / "m.onnx", ("hidden",)))
    rng = np.random.default_rng(2)
    requests = [tokens(rng, n) for n in (2, 9, 4, 12, 3)]  # buckets of 4: {2, 4, 3}, {9, 12}
    bucketed = PaddingSettings(axis=1, values=PADDING.values, bucket=4)
    results = run_through_batcher(model, requests, bucketed)
    assert sorted(model.shapes) == [(2, 12), (3, 4)]
    for request, got in zip(requests, results):
        np.testing.assert_allclose(got["hidden"], model.alone(request)["hidden"], rtol=1e-6, atol=1e-6)


# --- the helpers -------------------------------------------------------------------------------------


def test_pad_to_uses_the_pad_value_in_the_arrays_dtype() -> None:
    padded = pad_to(np.array([[1, 2]], np.int64), axis=1, length=4, value=9)
    assert padded.dtype == np.int64
    np.testing.assert_array_equal(padded, [[1, 2, 9, 9]])
    same = np.zeros((1, 3))
    assert pad_to(same, 1, 3, 0.0) is same


def test_merge_pads_only_the_named_inputs_and_split_cuts_back() -> None:
    a = {"ids": np.array([[1, 2]]), "x": np.ones((1, 3))}
    b = {"ids": np.array([[3, 4, 5]]), "x": np.zeros((1, 3))}
    padding = PaddingSettings(axis=1, values={"ids": -1})
    merged = merge([a, b], padding)
    np.testing.assert_array_equal(merged["ids"], [[1, 2, -1], [3, 4, 5]])
    assert merged["x"].shape == (2, 3)
    outputs = {"per_token": merged["ids"] * 10, "pooled": np.arange(6).reshape(2, 3, 1)[:, :, 0][:, :2]}
    parts = split(outputs, [1, 1], [2, 3], padding)
    np.testing.assert_array_equal(parts[0]["per_token"], [[10, 20]])
    np.testing.assert_array_equal(parts[1]["per_token"], [[30, 40, 50]])
    assert parts[0]["pooled"].shape == (1, 2)  # not the padded length (3): split only on the batch axis


def test_shape_key_ignores_the_padded_length_but_not_other_dimensions() -> None:
    short, long = {"ids": np.zeros((1, 3)), "x": np.zeros((1, 2))}, {"ids": np.zeros((1, 8)), "x": np.zeros((1, 2))}
    other = {"ids": np.zeros((1, 3)), "x": np.zeros((1, 5))}
    padding = PaddingSettings(axis=1, values={"ids": 0})
    assert shape_key(short, padding) == shape_key(long, padding) != shape_key(other, padding)
    assert shape_key(short) != shape_key(long)
    bucketed = PaddingSettings(axis=1, values={"ids": 0}, bucket=4)
    assert shape_key(short, bucketed) != shape_key(long, bucketed)
    assert request_length(long, padding) == 8 and request_length(long, None) == 0


def test_an_input_without_the_padded_axis_is_a_bad_request() -> None:
    batcher = DynamicBatcher(
        lambda inputs: inputs, BatcherSettings(max_batch_size=4), padding=PaddingSettings(axis=2, values={"ids": 0})
    )
    try:
        with pytest.raises(BadRequest, match="input 'ids' has 2 dimension"):
            batcher.submit({"ids": np.zeros((1, 3))}, 1)
    finally:
        batcher.close(WAIT_S)


# --- config ---------------------------------------------------------------------------------------------


def deployment_doc(tmp_path: Path, padding: object) -> dict:
    return {"deployments": [{"name": "enc", "model_path": str(tmp_path / "m.onnx"), "padding": padding}]}


def test_padding_table_is_parsed(tmp_path: Path) -> None:
    config = parse_config(
        deployment_doc(tmp_path, {"axis": 1, "values": {"input_ids": 0, "attention_mask": 0}, "bucket": 16})
    )
    assert config.deployments[0].padding == PaddingSettings(1, {"input_ids": 0, "attention_mask": 0}, 16)
    plain = parse_config({"deployments": [{"name": "enc", "model_path": str(tmp_path / "m.onnx")}]})
    assert plain.deployments[0].padding.values == {}


@pytest.mark.parametrize(
    "padding, message",
    [
        ({"axis": 0, "values": {"a": 0}}, "axis must be >= 1"),
        ({"bucket": -1}, "bucket >= 0"),
        ({"values": [0]}, "values must be a table"),
        ({"values": {"a": "zero"}}, "values must be a table"),
        ({"values": {"a": True}}, "values must be a table"),
        ({"axis": "1"}, "axis must be an integer"),
        ({"side": "left"}, r"unknown setting\(s\) \['side'\]"),
        ([1], "padding must be a table"),
    ],
)
def test_bad_padding_settings_are_one_line_config_errors(tmp_path: Path, padding: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        parse_config(deployment_doc(tmp_path, padding))
    assert "\n" not in str(caught.value)


def test_padding_an_input_the_model_lacks_is_refused_at_start(tmp_path: Path) -> None:
    build_token_model(tmp_path / "m.onnx", ("embedding",))
    config = parse_config(deployment_doc(tmp_path, {"values": {"input_ids": 0, "token_type_ids": 0}}))
    with pytest.raises(ConfigError, match=r"values name input\(s\) \['token_type_ids'\]"):
        Deployment(config.deployments[0], ServerMetrics(CollectorRegistry()))


def test_a_deployment_with_padding_batches_mixed_lengths_and_answers_each_alone(tmp_path: Path) -> None:
    path = build_token_model(tmp_path / "m.onnx", ("hidden", "embedding"))
    config = parse_config(
        {
            "deployments": [
                {
                    "name": "enc",
                    "model_path": str(path),
                    "batcher": {"max_batch_size": 2, "max_queue_delay_ms": 5000.0},
                    "padding": {"axis": 1, "values": {"input_ids": 0, "attention_mask": 0}},
                }
            ]
        }
    )
    registry = CollectorRegistry()
    deployment = Deployment(config.deployments[0], ServerMetrics(registry))
    rng = np.random.default_rng(3)
    requests = [tokens(rng, 2), tokens(rng, 6)]
    results: list[dict] = [{}, {}]

    def call(i: int) -> None:
        results[i] = deployment.infer(InferRequest(requests[i]))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_S)
    finally:
        deployment.close()
    labels = deployment.metrics.labels
    assert registry.get_sample_value("latlab_batcher_batch_size_count", labels) == 1  # one batch of both
    assert registry.get_sample_value("latlab_batcher_batch_size_sum", labels) == 2
    alone = RecordingSession(path)
    for request, got in zip(requests, results):
        want = alone.alone(request)
        for name in ("hidden", "embedding"):
            np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6)
