"""A stock Open Inference Protocol client (Triton's `tritonclient.http`) against the real server process:
every endpoint, JSON and binary tensors both ways, output selection, ids, and errors it understands."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from latlab.common import procs
from tests.conftest import tiny_weights

import tritonclient.http as tritonclient_http
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e
CLI = [sys.executable, "-m", "latlab.cli"]


def two_output_model(path: Path) -> Path:
    """y = x @ W + b and z = relu(y), so a client can ask for one output or both."""
    w, b = tiny_weights()
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["y"]),
            helper.make_node("Relu", ["y"], ["z"]),
        ],
        "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 3]),
        ],
        initializer=[numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")],
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return path


def string_model(path: Path) -> Path:
    """Identity over a BYTES tensor: what goes in must come back byte for byte."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["s"], ["t"])],
        "strings",
        [helper.make_tensor_value_info("s", TensorProto.STRING, ["batch", 2])],
        [helper.make_tensor_value_info("t", TensorProto.STRING, ["batch", 2])],
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return path


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stock")
    port = procs.free_port()
    config = folder / "server.toml"
    config.write_text(f"""
[server]
port = {port}
[[deployments]]
name = "two"
model_path = "{two_output_model(folder / "two" / "model.onnx")}"
[deployments.batcher]
max_batch_size = 8
max_queue_delay_ms = 1
[[deployments]]
name = "strings"
model_path = "{string_model(folder / "strings" / "model.onnx")}"
[deployments.batcher]
max_batch_size = 4
""")
    log = folder / "server.log"
    process = procs.start([*CLI, "serve", "--config", str(config)], log_path=log)
    try:
        procs.wait_ready(f"http://127.0.0.1:{port}/v2/health/ready", process, timeout_s=60, log_path=log)
        triton = tritonclient_http.InferenceServerClient(f"127.0.0.1:{port}")
        yield triton
        triton.close()
    finally:
        procs.stop(process)


def expected(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w, b = tiny_weights()
    y = x @ w + b
    return y, np.maximum(y, 0)


def test_health_and_metadata_endpoints(client):
    assert client.is_server_live() and client.is_server_ready()
    server = client.get_server_metadata()
    assert server["name"] == "latlab" and "binary_tensor_data" in server["extensions"]
    assert client.is_model_ready("two") and client.is_model_ready("two", model_version="1")
    model = client.get_model_metadata("two")
    assert model["name"] == "two" and model["versions"] == ["1"]
    assert model["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert [o["name"] for o in model["outputs"]] == ["y", "z"]
    assert client.get_model_metadata("two", model_version="1") == model
    assert client.get_model_config("two")["batcher"]["max_batch_size"] == 8  # latlab's settings, at Triton's path


@pytest.mark.parametrize("binary_in", [False, True], ids=["json-in", "binary-in"])
@pytest.mark.parametrize("binary_out", [False, True], ids=["json-out", "binary-out"])
def test_infer_in_json_and_binary_both_ways(client, binary_in, binary_out):
    x = np.random.default_rng(7).standard_normal((3, 4)).astype(np.float32)
    tensor = tritonclient_http.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary_in)
    outputs = [tritonclient_http.InferRequestedOutput("z", binary_data=binary_out)]
    result = client.infer("two", [tensor], outputs=outputs, request_id="req-42", model_version="1")
    _, z = expected(x)
    np.testing.assert_allclose(result.as_numpy("z"), z, rtol=1e-5, atol=1e-6)
    assert result.as_numpy("y") is None  # only what was asked for comes back
    response = result.get_response()
    assert response["id"] == "req-42" and response["model_name"] == "two"


def test_infer_all_outputs_by_default(client):
    x = np.ones((1, 4), np.float32)
    tensor = tritonclient_http.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("two", [tensor])
    y, z = expected(x)
    np.testing.assert_allclose(result.as_numpy("y"), y, rtol=1e-5)
    np.testing.assert_allclose(result.as_numpy("z"), z, rtol=1e-5)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_bytes_tensors_round_trip(client, binary):
    # JSON carries text; the binary extension carries bytes (a 4-byte length, then them); the model takes UTF-8.
    last = "tab\tnul\x00 é".encode() if binary else b"two words"
    s = np.array([[b"hello", b""], ["naïve".encode(), last]], dtype=np.object_)
    tensor = tritonclient_http.InferInput("s", [2, 2], "BYTES")
    tensor.set_data_from_numpy(s, binary_data=binary)
    result = client.infer(
        "strings", [tensor], outputs=[tritonclient_http.InferRequestedOutput("t", binary_data=binary)]
    )
    got = [[v if isinstance(v, bytes) else str(v).encode() for v in row] for row in result.as_numpy("t").tolist()]
    assert got == s.tolist()


def test_errors_reach_the_client_as_messages(client):
    tensor = tritonclient_http.InferInput("x", [1, 5], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 5), np.float32))
    with pytest.raises(InferenceServerException, match=r"shape \[-1, 4\]"):
        client.infer("two", [tensor])
    with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
        client.get_model_metadata("nope")
    assert not client.is_model_ready("nope")
    assert client.is_server_live()  # and the server is still there
