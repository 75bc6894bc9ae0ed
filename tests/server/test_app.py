"""latlab.server.http.app: the Open Inference Protocol routes over a tiny ONNX model, errors and /metrics."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import onnxruntime as ort
import orjson
import pytest
from flask import Flask
from prometheus_client import CollectorRegistry

import latlab
from latlab.server.config import ServerConfig, parse_config
from latlab.server.errors import ConfigError
from latlab.server.http.app import create_app
from latlab.server.protocol import HEADER_LENGTH

from tests.conftest import tiny_weights

LABELS = {"deployment": "tiny", "model": "tiny", "provider": "cpu"}
INFER = "/v2/models/tiny/infer"


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def build_app(registry: CollectorRegistry) -> Iterator[Callable[[ServerConfig], Flask]]:
    """create_app with this test's registry; every batcher it started is closed afterwards."""
    apps: list[Flask] = []

    def build(config: ServerConfig) -> Flask:
        app = create_app(config, registry=registry)
        apps.append(app)
        return app

    yield build
    for app in apps:
        app.extensions["latlab"].close()


@pytest.fixture
def app(build_app, tiny_model: Path, make_config) -> Flask:
    return build_app(make_config(tiny_model, max_batch_size=4, max_queue_delay_ms=0.0))


@pytest.fixture
def client(app: Flask):
    return app.test_client()


def infer_body(x: np.ndarray, datatype: str = "FP32", name: str = "x", **extra: object) -> bytes:
    tensor = {"name": name, "shape": list(x.shape), "datatype": datatype, "data": x.reshape(-1).tolist()}
    return orjson.dumps({"inputs": [tensor], **extra})


def expected_y(tiny_model: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(tiny_model), providers=["CPUExecutionProvider"])
    return session.run(["y"], {"x": x})[0]


def sample_x(n: int) -> np.ndarray:
    return np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32)


def assert_error(response, status: int, *fragments: str) -> str:
    assert response.status_code == status, response.data
    assert response.content_type == "application/json"
    doc = orjson.loads(response.data)
    assert set(doc) == {"error"}
    for fragment in fragments:
        assert fragment in doc["error"]
    return doc["error"]


def sample_value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, {**LABELS, **labels})


# --- health and metadata ---------------------------------------------------------------------------


def test_health_live_and_ready(client) -> None:
    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/v2/health/ready").status_code == 200


def test_model_ready(client) -> None:
    assert client.get("/v2/models/tiny/ready").status_code == 200
    assert client.get("/v2/models/tiny/versions/1/ready").status_code == 200
    assert_error(client.get("/v2/models/other/ready"), 404, "unknown model 'other'")


def test_server_metadata(client) -> None:
    response = client.get("/v2")
    assert response.status_code == 200
    assert orjson.loads(response.data) == {
        "name": "latlab",
        "version": latlab.__version__,
        "extensions": ["binary_tensor_data"],
    }


def test_model_metadata_has_minus_one_for_the_batch_dimension(client) -> None:
    response = client.get("/v2/models/tiny")
    assert response.status_code == 200
    assert orjson.loads(response.data) == {
        "name": "tiny",
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 3]}],
    }


def test_version_one_path_works_and_other_versions_are_404(client) -> None:
    assert orjson.loads(client.get("/v2/models/tiny/versions/1").data)["name"] == "tiny"
    assert_error(client.get("/v2/models/tiny/versions/2"), 404, "unknown model 'tiny' version '2'")
    x = sample_x(1)
    assert client.post("/v2/models/tiny/versions/1/infer", data=infer_body(x)).status_code == 200
    assert_error(client.post("/v2/models/tiny/versions/2/infer", data=infer_body(x)), 404, "version '2'")


def test_config_route_describes_the_deployment(client, tiny_model: Path) -> None:
    for path in ("/v2/models/tiny/config", "/v2/models/tiny/versions/1/config"):
        response = client.get(path)
        assert response.status_code == 200
        doc = orjson.loads(response.data)
        assert {k: doc[k] for k in ("name", "model", "provider", "model_path", "allow_non_finite")} == {
            "name": "tiny",
            "model": "tiny",
            "provider": "cpu",
            "model_path": str(tiny_model.resolve()),
            "allow_non_finite": False,
        }
        # Every setting is described; the batcher and CPU tables gain settings, so check the ones set here.
        assert (
            doc["batcher"].items()
            >= {
                "max_batch_size": 4,
                "max_queue_delay_ms": 0.0,
                "max_queue_size": 256,
                "instances": 1,
                "timeout_ms": 10_000.0,
                "preferred_batch_sizes": [],
            }.items()
        )
        assert doc["cpu"].items() >= {"intra_op_threads": 0, "allow_spinning": True}.items()


def test_unknown_model_is_404_naming_what_is_served(client) -> None:
    for response in (client.get("/v2/models/nope"), client.post("/v2/models/nope/infer", data=infer_body(sample_x(1)))):
        assert_error(response, 404, "unknown model 'nope'", "['tiny']")


def test_unknown_route_and_wrong_method_are_json_errors(client) -> None:
    assert_error(client.get("/v3/whatever"), 404)
    assert_error(client.get(INFER), 405)


# --- inference -------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 3, 4])
def test_infer_matches_onnxruntime(client, tiny_model: Path, batch: int) -> None:
    x = sample_x(batch)
    response = client.post(INFER, data=infer_body(x, id="abc"))
    assert response.status_code == 200, response.data
    assert response.content_type == "application/json"
    assert HEADER_LENGTH not in response.headers
    doc = orjson.loads(response.data)
    assert doc["model_name"] == "tiny" and doc["model_version"] == "1" and doc["id"] == "abc"
    [y] = doc["outputs"]
    assert (y["name"], y["datatype"], y["shape"]) == ("y", "FP32", [batch, 3])
    got = np.array(y["data"], np.float32).reshape(batch, 3)
    np.testing.assert_allclose(got, expected_y(tiny_model, x), rtol=1e-6)
    w, b = tiny_weights()
    np.testing.assert_allclose(got, x @ w + b, rtol=1e-5, atol=1e-6)


def test_binary_input_and_output_round_trip(client, tiny_model: Path) -> None:
    x = sample_x(2)
    raw = x.astype("<f4").tobytes()
    header = orjson.dumps(
        {
            "inputs": [
                {"name": "x", "shape": [2, 4], "datatype": "FP32", "parameters": {"binary_data_size": len(raw)}}
            ],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
        }
    )
    response = client.post(
        INFER, data=header + raw, headers={HEADER_LENGTH: str(len(header))}, content_type="application/octet-stream"
    )
    assert response.status_code == 200, response.data
    assert response.content_type == "application/octet-stream"
    header_length = int(response.headers[HEADER_LENGTH])
    doc = orjson.loads(response.data[:header_length])
    assert doc["outputs"] == [
        {"name": "y", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": 24}}
    ]
    y = np.frombuffer(response.data[header_length:], "<f4").reshape(2, 3)
    np.testing.assert_allclose(y, expected_y(tiny_model, x), rtol=1e-6)


def test_binary_data_output_parameter_gives_binary_output(client, tiny_model: Path) -> None:
    x = sample_x(1)
    response = client.post(INFER, data=infer_body(x, parameters={"binary_data_output": True}))
    assert response.status_code == 200
    header_length = int(response.headers[HEADER_LENGTH])
    y = np.frombuffer(response.data[header_length:], "<f4").reshape(1, 3)
    np.testing.assert_allclose(y, expected_y(tiny_model, x), rtol=1e-6)


def test_requested_output_by_name(client) -> None:
    response = client.post(INFER, data=infer_body(sample_x(1), outputs=[{"name": "y"}]))
    assert response.status_code == 200
    assert [t["name"] for t in orjson.loads(response.data)["outputs"]] == ["y"]


# --- bad requests ----------------------------------------------------------------------------------


BAD_REQUESTS = [
    pytest.param(b"{nope", {}, 400, ["not valid JSON"], id="malformed-json"),
    pytest.param(b"[]", {}, 400, ["JSON object"], id="not-an-object"),
    pytest.param(b"{}", {}, 400, ["'inputs'"], id="no-inputs"),
    pytest.param(
        infer_body(sample_x(1), name="z"),
        {},
        400,
        ["takes inputs ['x']", "missing ['x']", "unknown ['z']"],
        id="wrong-input-name",
    ),
    pytest.param(
        orjson.dumps(
            {
                "inputs": [
                    {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.0] * 4},
                    {"name": "extra", "shape": [1], "datatype": "FP32", "data": [0.0]},
                ]
            }
        ),
        {},
        400,
        ["unknown ['extra']"],
        id="extra-input",
    ),
    pytest.param(
        infer_body(np.zeros((2, 5), np.float32)),
        {},
        400,
        ["input 'x' must have shape [-1, 4]", "got [2, 5]"],
        id="wrong-shape",
    ),
    pytest.param(infer_body(np.zeros(4, np.float32)), {}, 400, ["must have shape [-1, 4]", "got [4]"], id="wrong-rank"),
    pytest.param(
        infer_body(np.zeros((0, 4), np.float32)), {}, 400, ["batch dimension of at least 1"], id="empty-batch"
    ),
    pytest.param(
        infer_body(np.zeros((1, 4), np.int64), datatype="INT64"),
        {},
        400,
        ["input 'x' must be FP32, got INT64"],
        id="wrong-dtype",
    ),
    pytest.param(
        infer_body(np.zeros((1, 4), np.float64), datatype="FP64"),
        {},
        400,
        ["must be FP32, got FP64"],
        id="wrong-float-dtype",
    ),
    pytest.param(infer_body(sample_x(5)), {}, 400, ["batch of 5 exceeds", "max_batch_size 4"], id="batch-too-large"),
    pytest.param(
        infer_body(sample_x(1), outputs=[{"name": "logits"}]),
        {},
        400,
        ["has no output(s) ['logits']", "['y']"],
        id="unknown-output",
    ),
    pytest.param(
        infer_body(sample_x(1)),
        {HEADER_LENGTH: "abc"},
        400,
        [f"{HEADER_LENGTH} must be a non-negative integer", "'abc'"],
        id="header-not-a-number",
    ),
    pytest.param(infer_body(sample_x(1)), {HEADER_LENGTH: "-3"}, 400, ["non-negative integer"], id="header-negative"),
    pytest.param(
        infer_body(sample_x(1)),
        {HEADER_LENGTH: "100000"},
        400,
        [f"{HEADER_LENGTH} is 100000 but the body has"],
        id="header-beyond-body",
    ),
    pytest.param(
        infer_body(sample_x(1), parameters={"timeout": -5}),
        {},
        400,
        ["parameters.timeout must be a non-negative integer of microseconds"],
        id="timeout-negative",
    ),
    pytest.param(
        infer_body(sample_x(1), parameters={"timeout": "soon"}),
        {},
        400,
        ["parameters.timeout", "'soon'"],
        id="timeout-not-a-number",
    ),
    pytest.param(
        infer_body(sample_x(1)) + b"\0\0",
        {HEADER_LENGTH: str(len(infer_body(sample_x(1))))},
        400,
        ["binary part has 2 bytes but the inputs use 0"],
        id="leftover-binary",
    ),
]


@pytest.mark.parametrize("body, headers, status, fragments", BAD_REQUESTS)
def test_bad_request_names_the_problem_and_serving_goes_on(
    client, tiny_model: Path, body: bytes, headers: dict, status: int, fragments: list[str]
) -> None:
    assert_error(client.post(INFER, data=body, headers=headers), status, *fragments)
    x = sample_x(2)
    response = client.post(INFER, data=infer_body(x))
    assert response.status_code == 200
    got = np.array(orjson.loads(response.data)["outputs"][0]["data"], np.float32).reshape(2, 3)
    np.testing.assert_allclose(got, expected_y(tiny_model, x), rtol=1e-6)


def test_bad_requests_are_counted_and_never_reach_the_batcher(client, registry) -> None:
    client.post(INFER, data=infer_body(np.zeros((1, 4), np.int64), datatype="INT64"))
    client.post(INFER, data=b"{nope")
    assert sample_value(registry, "latlab_server_requests_total", outcome="bad_request") == 2
    assert sample_value(registry, "latlab_batcher_batch_size_count") == 0


def test_body_larger_than_max_body_bytes_is_413(build_app, tiny_model: Path) -> None:
    config = parse_config(
        {"server": {"max_body_bytes": 64}, "deployments": [{"name": "tiny", "model_path": str(tiny_model)}]}
    )
    client = build_app(config).test_client()
    assert_error(client.post(INFER, data=infer_body(sample_x(4))), 413)
    assert client.post(INFER, data=b'{"inputs": []}').status_code == 400  # small bodies still pass the limit


def test_unicode_digit_in_header_length_is_a_bad_request(client) -> None:
    """'²' passes str.isdigit() but not int(): it must still be a 400, not an internal error."""
    assert_error(
        client.post(INFER, data=infer_body(sample_x(1)), headers={HEADER_LENGTH: "\u00b2"}), 400, HEADER_LENGTH
    )


def test_full_queue_is_503_with_retry_after(build_app, tiny_model: Path, make_config, registry) -> None:
    app = build_app(make_config(tiny_model, max_batch_size=4, max_queue_delay_ms=300.0, max_queue_size=1))
    waiting: list[int] = []
    first = threading.Thread(
        target=lambda: waiting.append(app.test_client().post(INFER, data=infer_body(sample_x(1))).status_code)
    )
    first.start()
    deadline = time.monotonic() + 2.0
    while sample_value(registry, "latlab_batcher_queue_depth") != 1 and time.monotonic() < deadline:
        time.sleep(0.005)  # until the first request sits in the queue, waiting out its delay
    response = app.test_client().post(INFER, data=infer_body(sample_x(1)))
    assert_error(response, 503, "queue is full")
    assert response.headers["Retry-After"] == "1"
    first.join(2.0)
    assert waiting == [200]
    assert sample_value(registry, "latlab_server_requests_total", outcome="rejected") == 1
    assert sample_value(registry, "latlab_batcher_rejections_total", reason="queue_full") == 1


def test_request_past_its_timeout_is_504_and_not_computed(build_app, tiny_model: Path, make_config, registry) -> None:
    client = build_app(
        make_config(tiny_model, max_batch_size=4, max_queue_delay_ms=200.0, timeout_ms=20.0)
    ).test_client()
    assert_error(client.post(INFER, data=infer_body(sample_x(1))), 504, "expired after")
    assert sample_value(registry, "latlab_server_requests_total", outcome="timeout") == 1
    assert sample_value(registry, "latlab_batcher_batch_size_count") == 0


# --- metrics ---------------------------------------------------------------------------------------


def test_metrics_route_exposes_every_series_with_deployment_labels(client, registry) -> None:
    for n in (1, 2, 3):
        assert client.post(INFER, data=infer_body(sample_x(n))).status_code == 200
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.content_type.startswith("text/plain")
    text = response.data.decode()
    label_text = 'deployment="tiny",model="tiny",provider="cpu"'
    for name in (
        "latlab_server_request_duration_seconds",
        "latlab_batcher_queue_duration_seconds",
        "latlab_batcher_compute_duration_seconds",
        "latlab_batcher_batch_size",
    ):
        assert f"# TYPE {name} histogram" in text
        assert f"{name}_count{{{label_text}}} 3.0" in text

    assert sample_value(registry, "latlab_server_request_duration_seconds_count") == 3
    assert sample_value(registry, "latlab_batcher_queue_duration_seconds_count") == 3
    assert sample_value(registry, "latlab_batcher_compute_duration_seconds_count") == 3
    assert sample_value(registry, "latlab_batcher_batch_size_count") == 3
    assert sample_value(registry, "latlab_batcher_batch_size_sum") == 6  # 1 + 2 + 3 samples
    assert sample_value(registry, "latlab_batcher_batch_size_bucket", le="1.0") == 1
    assert sample_value(registry, "latlab_batcher_batch_size_bucket", le="2.0") == 2
    assert sample_value(registry, "latlab_server_requests_total", outcome="ok") == 3
    assert sample_value(registry, "latlab_batcher_batches_total", outcome="ok") == 3
    assert sample_value(registry, "latlab_server_inflight_requests") == 0
    assert sample_value(registry, "latlab_batcher_queue_depth") == 0


def test_each_app_has_its_own_registry(tiny_model: Path, make_config) -> None:
    # Two apps in one process must not collide on metric names (nothing registered globally).
    first = create_app(make_config(tiny_model), registry=CollectorRegistry())
    second = create_app(make_config(tiny_model), registry=CollectorRegistry())
    try:
        assert first.test_client().post(INFER, data=infer_body(sample_x(1))).status_code == 200
        text = second.test_client().get("/metrics").data.decode()
        assert 'latlab_batcher_batch_size_count{deployment="tiny",model="tiny",provider="cpu"} 0.0' in text
    finally:
        first.extensions["latlab"].close()
        second.extensions["latlab"].close()


def test_several_deployments_are_served_under_their_names(build_app, tiny_model: Path, registry) -> None:
    config = parse_config(
        {
            "deployments": [
                {"name": "a", "model_path": str(tiny_model), "model": "ffn"},
                {"name": "b", "model_path": str(tiny_model), "batcher": {"max_batch_size": 8}},
            ]
        }
    )
    client = build_app(config).test_client()
    assert client.post("/v2/models/a/infer", data=infer_body(sample_x(1))).status_code == 200
    assert client.post("/v2/models/b/infer", data=infer_body(sample_x(6))).status_code == 200
    assert (
        registry.get_sample_value(
            "latlab_batcher_batch_size_sum", {"deployment": "a", "model": "ffn", "provider": "cpu"}
        )
        == 1
    )
    assert (
        registry.get_sample_value(
            "latlab_batcher_batch_size_sum", {"deployment": "b", "model": "tiny", "provider": "cpu"}
        )
        == 6
    )


# --- startup errors --------------------------------------------------------------------------------


def test_missing_model_file_is_a_config_error_naming_the_path(tmp_path: Path, registry) -> None:
    missing = tmp_path / "gone" / "model.onnx"
    config = parse_config({"deployments": [{"name": "gone", "model_path": str(missing)}]})
    with pytest.raises(ConfigError) as caught:
        create_app(config, registry=registry)
    assert str(missing) in str(caught.value)
    assert "deployment 'gone'" in str(caught.value)


def test_missing_second_model_fails_the_whole_app(tiny_model: Path, tmp_path: Path, registry) -> None:
    missing = tmp_path / "gone.onnx"
    config = parse_config(
        {"deployments": [{"name": "ok", "model_path": str(tiny_model)}, {"name": "gone", "model_path": str(missing)}]}
    )
    with pytest.raises(ConfigError, match="gone.onnx"):
        create_app(config, registry=registry)


def test_unreadable_model_file_is_a_config_error(tmp_path: Path, registry) -> None:
    junk = tmp_path / "junk" / "model.onnx"
    junk.parent.mkdir()
    junk.write_bytes(b"this is not a protobuf")
    config = parse_config({"deployments": [{"name": "junk", "model_path": str(junk)}]})
    with pytest.raises(ConfigError, match=f"deployment 'junk': cannot load {junk}"):
        create_app(config, registry=registry)
