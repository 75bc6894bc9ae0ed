"""Buckets, CUDA graphs per bucket and TF32 on a real CUDA device (skipped where CUDA does not load), plus the
capture refusals that are decided before ORT is asked (those run anywhere)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from latlab.server.config import parse_config
from latlab.server.errors import ConfigError
from latlab.server.runtime.model import OnnxModel
from latlab.server.runtime.providers import provider_load_error

from tests.conftest import build_tiny_model, tiny_weights
from tests.server.test_buckets import conv_model, if_model
from tests.server.test_runtime import tokens

FP32 = {"use_tf32": False}


def config(path: Path, **extra: object):
    return parse_config(
        {"deployments": [{"name": "g", "model_path": str(path), "provider": "cuda", **extra}]}
    ).deployments[0]


def test_control_flow_is_refused_for_cuda_graphs_in_one_line(tmp_path: Path) -> None:
    """Decided from the graph before any session is made, so it holds on a machine without CUDA too."""
    with pytest.raises(ConfigError) as caught:
        OnnxModel(
            config(if_model(tmp_path / "if.onnx"), cuda={"enable_cuda_graph": True}, batcher={"max_batch_size": 4})
        )
    message = str(caught.value)
    assert "it has control-flow nodes (If) that a CUDA graph cannot capture" in message
    assert "cuda_graph_fallback = true" in message and "\n" not in message


@pytest.fixture
def cuda(tmp_path: Path) -> None:
    """Skip unless CUDA really loads (a session whose first provider is CUDA)."""
    if provider_load_error("CUDAExecutionProvider"):
        pytest.skip("CUDAExecutionProvider does not load here")
    path = build_tiny_model(tmp_path / "probe.onnx")
    got = ort.InferenceSession(str(path), providers=["CUDAExecutionProvider", "CPUExecutionProvider"]).get_providers()
    if got[0] != "CUDAExecutionProvider":
        pytest.skip("CUDAExecutionProvider does not load here")


def _relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-6)))


@pytest.mark.gpu
def test_tf32_on_shows_its_error_and_off_is_fp32(cuda: None, tmp_path: Path) -> None:
    import pynvml

    pynvml.nvmlInit()
    major, _ = pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(0))
    if major < 8:
        pytest.skip("TF32 needs compute capability 8.0 (Ampere) or newer")
    path = build_tiny_model(tmp_path / "t.onnx")
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    w, b = tiny_weights()
    want = x.astype(np.float64) @ w + b
    with_tf32 = OnnxModel(config(path)).run({"x": x})["y"]  # ORT's default: TF32 on
    without = OnnxModel(config(path, cuda=FP32)).run({"x": x})["y"]
    assert _relative_error(with_tf32, want) > 1e-4  # measured on an H100: 1.75e-3 (gpu-findings/probes/tf32.json)
    assert _relative_error(without, want) < 1e-5  # 9.9e-8 there


@pytest.mark.gpu
def test_cuda_buckets_run_a_conv_net_on_one_session_per_bucket(cuda: None, tmp_path: Path) -> None:
    model = OnnxModel(config(conv_model(tmp_path / "c.onnx"), cuda=FP32, batcher={"max_batch_size": 8}))
    assert model.buckets == (1, 2, 4, 8) and model.bucket_mode == "per_bucket"
    assert model.bucket_runs()["sessions"] == 4
    x = np.random.default_rng(2).standard_normal((8, 2, 5, 5)).astype(np.float32)
    alone = np.concatenate([model.run({"x": x[i : i + 1]})["y"] for i in range(8)])
    for rows in (3, 7, 5, 8, 2, 6, 4, 1):
        # each bucket's session may pick another cuDNN algorithm (FP32, TF32 off): equal to rounding
        np.testing.assert_allclose(model.run({"x": x[:rows]})["y"], alone[:rows], rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_cuda_graph_per_bucket_replays_every_bucket(cuda: None, tmp_path: Path) -> None:
    model = OnnxModel(
        config(
            build_tiny_model(tmp_path / "t.onnx"),
            cuda={**FP32, "enable_cuda_graph": True},
            batcher={"max_batch_size": 8},
        )
    )
    assert model.bucket_mode == "cuda_graph" and model.bucket_runs()["cuda_graph"] == "per bucket"
    for batch in model.warmup_batches(8):  # captures each bucket's graph
        model.run(batch)
    w, b = tiny_weights()
    rng = np.random.default_rng(4)
    for rows in (1, 3, 8, 2, 5, 4, 8, 1):
        x = rng.standard_normal((rows, 4)).astype(np.float32)
        np.testing.assert_allclose(model.run({"x": x})["y"], x @ w + b, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_cuda_graph_fallback_serves_dynamic_shapes_without_graphs_and_says_so(cuda: None, tmp_path: Path) -> None:
    path = tokens(tmp_path)
    with pytest.raises(ConfigError, match=r"\['ids', 'n'\] have dynamic dimensions besides the batch"):
        OnnxModel(config(path, cuda={"enable_cuda_graph": True}, batcher={"max_batch_size": 4}))
    model = OnnxModel(
        config(path, cuda={"enable_cuda_graph": True, "cuda_graph_fallback": True}, batcher={"max_batch_size": 4})
    )
    assert model.bucket_mode == "shared"
    assert model.bucket_runs()["cuda_graph"].startswith("off: ['ids', 'n'] have dynamic dimensions")
    ids = np.arange(6, dtype=np.int64).reshape(3, 2)
    np.testing.assert_array_equal(model.run({"ids": ids})["n"], ids + 1)
