"""Execution providers: [cpu]/[cuda]/[tensorrt] settings, the options handed to ORT, no silent fallback, CUDA runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from prometheus_client import CollectorRegistry

from latlab.server.config import CpuOptions, CudaOptions, TensorrtOptions, parse_config
from latlab.server.errors import ConfigError
from latlab.server.metrics import ServerMetrics
from latlab.server.runtime.deployment import Deployment
from latlab.server.runtime.model import OnnxModel
from latlab.server.runtime.providers import (
    check_no_fallback,
    create_session,
    cuda_provider_options,
    preload_cuda_libraries,
    provider_chain,
    provider_load_error,
    session_options,
    tensorrt_provider_options,
)

from tests.conftest import build_tiny_model, tiny_weights
from tests.server.test_runtime import two_outputs


def config(path: Path | str = "/m.onnx", provider: str = "cpu", **tables: object):
    return parse_config(
        {"deployments": [{"name": "a", "model_path": str(path), "provider": provider, **tables}]}
    ).deployments[0]


# --- settings --------------------------------------------------------------------------------------


def test_defaults() -> None:
    d = config()
    assert d.cpu == CpuOptions(0, 0, True, "all", "sequential")
    assert d.cuda == CudaOptions(0, "exhaustive", False, 0, "next_power_of_two", True)
    assert d.tensorrt == TensorrtOptions(False, "", 0)
    assert d.warmup is True


def test_every_option_is_read() -> None:
    d = config(
        provider="tensorrt",
        warmup=False,
        cpu={
            "intra_op_threads": 2,
            "inter_op_threads": 3,
            "allow_spinning": False,
            "graph_optimization_level": "basic",
            "execution_mode": "parallel",
        },
        cuda={
            "device_id": 1,
            "cudnn_conv_algo_search": "heuristic",
            "gpu_mem_limit": 2**30,
            "arena_extend_strategy": "same_as_requested",
            "copy_in_default_stream": False,
        },
        tensorrt={"fp16": True, "engine_cache_dir": "/tmp/trt", "max_workspace_bytes": 2**31},
    )
    assert d.cpu == CpuOptions(2, 3, False, "basic", "parallel")
    assert d.cuda == CudaOptions(1, "heuristic", False, 2**30, "same_as_requested", False)
    assert d.tensorrt == TensorrtOptions(True, "/tmp/trt", 2**31)
    assert d.warmup is False and d.provider == "tensorrt"


@pytest.mark.parametrize(
    "tables, message",
    [
        (
            {"cpu": {"graph_optimization_level": "max"}},
            "[cpu] graph_optimization_level must be one of ('disable', 'basic', 'extended', 'all'), got 'max'",
        ),
        ({"cpu": {"execution_mode": "Parallel"}}, "[cpu] execution_mode must be one of ('sequential', 'parallel')"),
        ({"cpu": {"inter_op_threads": -1}}, "[cpu] inter_op_threads must be >= 0, got -1"),
        ({"cuda": {"cudnn_conv_algo_search": "EXHAUSTIVE"}}, "[cuda] cudnn_conv_algo_search must be one of"),
        ({"cuda": {"arena_extend_strategy": "kSameAsRequested"}}, "[cuda] arena_extend_strategy must be one of"),
        ({"cuda": {"device_id": -1}}, "[cuda] device_id must be >= 0"),
        ({"cuda": {"gpu_mem_limit": -5}}, "[cuda] gpu_mem_limit must be >= 0"),
        ({"cuda": {"gpu_mem_limit": "2GB"}}, "[cuda]: gpu_mem_limit must be an integer, got '2GB'"),
        ({"cuda": {"enable_cuda_graph": "yes"}}, "[cuda]: enable_cuda_graph must be true or false"),
        ({"cuda": {"streams": 2}}, "[cuda]: unknown setting(s) ['streams']"),
        ({"tensorrt": {"fp16": 1}}, "[tensorrt]: fp16 must be true or false"),
        ({"tensorrt": {"max_workspace_bytes": -1}}, "[tensorrt] max_workspace_bytes must be >= 0"),
        ({"cuda": []}, "deployment 'a' cuda must be a table"),
        (
            {"cuda": {"enable_cuda_graph": True}, "batcher": {"max_batch_size": 8, "batch_buckets": []}},
            "[cuda] enable_cuda_graph with max_batch_size 8 needs batch_buckets (a captured graph has fixed shapes)",
        ),
        ({"cuda": {"use_tf32": 0}}, "[cuda]: use_tf32 must be true or false"),
        ({"cuda": {"fuse_conv_bias": "on"}}, "[cuda]: fuse_conv_bias must be true or false"),
        ({"warmup": "no"}, "warmup must be true or false"),
    ],
)
def test_bad_settings_are_one_line_errors(tables: dict, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config(provider="cuda", **tables)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_cuda_graph_with_batch_size_one_is_accepted() -> None:
    assert config(cuda={"enable_cuda_graph": True}, batcher={"max_batch_size": 1}).cuda.enable_cuda_graph


def test_cuda_graph_with_buckets_is_accepted() -> None:
    """One graph per bucket: max_batch_size > 1 is fine once batches have buckets (the default on cuda)."""
    deployment = config(provider="cuda", cuda={"enable_cuda_graph": True}, batcher={"max_batch_size": 8})
    assert deployment.batcher.batch_buckets == (1, 2, 4, 8)


def test_cuda_graph_is_refused_under_tensorrt() -> None:
    with pytest.raises(ConfigError, match='enable_cuda_graph is for provider "cuda" only'):
        config(provider="tensorrt", cuda={"enable_cuda_graph": True}, batcher={"max_batch_size": 1})


# --- what ORT is given -----------------------------------------------------------------------------


def test_session_options_follow_the_cpu_table() -> None:
    options = session_options(CpuOptions(2, 3, False, "extended", "parallel"))
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (2, 3)
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert (
        session_options(CpuOptions(graph_optimization_level="disable")).graph_optimization_level
        == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )


def test_a_real_session_gets_the_options(tiny_model: Path) -> None:
    session = create_session(config(tiny_model, cpu={"intra_op_threads": 1, "graph_optimization_level": "basic"}))
    options = session.get_session_options()
    assert options.intra_op_num_threads == 1
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert session.get_providers() == ["CPUExecutionProvider"]


def test_cuda_provider_options_in_ort_names() -> None:
    assert cuda_provider_options(CudaOptions()) == {
        "device_id": "0",
        "cudnn_conv_algo_search": "EXHAUSTIVE",
        "arena_extend_strategy": "kNextPowerOfTwo",
        "do_copy_in_default_stream": "1",
        "enable_cuda_graph": "0",
        "use_tf32": "1",
        "fuse_conv_bias": "0",
    }  # ORT's defaults, stated; no gpu_mem_limit: no limit
    options = cuda_provider_options(CudaOptions(1, "default", True, 123, "same_as_requested", False))
    assert options == {
        "device_id": "1",
        "cudnn_conv_algo_search": "DEFAULT",
        "arena_extend_strategy": "kSameAsRequested",
        "do_copy_in_default_stream": "0",
        "enable_cuda_graph": "1",
        "gpu_mem_limit": "123",
        "use_tf32": "1",
        "fuse_conv_bias": "0",
    }
    explicit = cuda_provider_options(CudaOptions(use_tf32=False, fuse_conv_bias=True))
    assert (explicit["use_tf32"], explicit["fuse_conv_bias"]) == ("0", "1")


def test_tensorrt_provider_options() -> None:
    assert tensorrt_provider_options(TensorrtOptions(), 0) == {"device_id": "0", "trt_fp16_enable": "0"}
    assert tensorrt_provider_options(TensorrtOptions(True, "/c", 99), 2) == {
        "device_id": "2",
        "trt_fp16_enable": "1",
        "trt_engine_cache_enable": "1",
        "trt_engine_cache_path": "/c",
        "trt_max_workspace_size": "99",
    }


def test_provider_chains_put_the_wanted_provider_first() -> None:
    names = {p: [name for name, _ in provider_chain(config(provider=p))] for p in ("cpu", "cuda", "tensorrt")}
    assert names == {
        "cpu": ["CPUExecutionProvider"],
        "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
        "tensorrt": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
    }
    chain = dict(provider_chain(config(provider="tensorrt", cuda={"device_id": 3})))
    assert chain["TensorrtExecutionProvider"]["device_id"] == chain["CUDAExecutionProvider"]["device_id"] == "3"


# --- never a silent fallback -----------------------------------------------------------------------


def test_fallback_is_refused_naming_the_provider() -> None:
    with pytest.raises(
        ConfigError,
        match="deployment 'a' asked for CUDAExecutionProvider but ONNX Runtime fell back to CPUExecutionProvider",
    ):
        check_no_fallback("a", "CUDAExecutionProvider", ["CPUExecutionProvider"])
    check_no_fallback("a", "CUDAExecutionProvider", ["CUDAExecutionProvider", "CPUExecutionProvider"])


@pytest.mark.parametrize(
    "provider, name", [("cuda", "CUDAExecutionProvider"), ("tensorrt", "TensorrtExecutionProvider")]
)
def test_device_deployment_gets_its_provider_or_refuses_naming_the_library(
    tiny_model: Path, provider: str, name: str
) -> None:
    """Either the session really runs on the device provider, or creating it fails with the reason."""
    reason = provider_load_error(name)
    if reason is None:
        assert create_session(config(tiny_model, provider=provider)).get_providers()[0] == name
        return
    with pytest.raises(ConfigError) as caught:
        create_session(config(tiny_model, provider=provider))
    assert f"asked for {name} but ONNX Runtime fell back to CPUExecutionProvider: {reason}" in str(caught.value)
    assert ".so" in reason  # names the library, e.g. libcublasLt.so.13


def test_pip_cuda_libraries_are_loaded_before_the_provider_is_checked(monkeypatch, capfd) -> None:
    """ORT's CUDA provider finds pip's nvidia-* libraries only once they are loaded (preload_dlls); this
    happens, once, before the load check, and ORT's printed complaints stay out of the output."""
    calls = []
    real = ort.preload_dlls

    def recording_preload(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(ort, "preload_dlls", recording_preload)
    preload_cuda_libraries.cache_clear()
    try:
        provider_load_error("CUDAExecutionProvider")
        provider_load_error("TensorrtExecutionProvider")
        assert provider_load_error("CPUExecutionProvider") is None
    finally:
        preload_cuda_libraries.cache_clear()
    assert len(calls) == 1
    assert capfd.readouterr().out == ""


# --- on a GPU --------------------------------------------------------------------------------------


@pytest.fixture
def cuda(tmp_path: Path) -> None:
    """Skip unless CUDA really loads (a session whose first provider is CUDA)."""
    if provider_load_error("CUDAExecutionProvider"):
        pytest.skip("CUDAExecutionProvider does not load here")
    path = build_tiny_model(tmp_path / "probe.onnx")
    got = ort.InferenceSession(str(path), providers=["CUDAExecutionProvider", "CPUExecutionProvider"]).get_providers()
    if got[0] != "CUDAExecutionProvider":
        pytest.skip("CUDAExecutionProvider does not load here")


X = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)


@pytest.mark.gpu
def test_cuda_model_binds_and_matches_cpu(cuda: None, tiny_model: Path) -> None:
    # TF32 (ORT's default on Ampere and newer) carries ~1e-3 relative error: parity is checked in FP32.
    model = OnnxModel(config(tiny_model, provider="cuda", cuda={"use_tf32": False}))
    assert model.bound and model.device == "cuda"
    outputs, timings = model.run_timed({"x": X})
    w, b = tiny_weights()
    np.testing.assert_allclose(outputs["y"], X @ w + b, rtol=1e-5, atol=1e-5)
    assert timings is not None and timings.compute_s > 0 and timings.input_s > 0


@pytest.mark.gpu
def test_cuda_returns_only_requested_outputs(cuda: None, tmp_path: Path) -> None:
    model = OnnxModel(config(two_outputs(tmp_path), provider="cuda"))
    outputs, _ = model.run_timed({"x": X}, ["square"])
    assert list(outputs) == ["square"]
    np.testing.assert_allclose(outputs["square"], X * X)


@pytest.mark.gpu
def test_cuda_graph_deployment_replays_new_inputs(cuda: None, tmp_path: Path) -> None:
    model = OnnxModel(
        config(
            two_outputs(tmp_path, batch=1),
            provider="cuda",
            cuda={"enable_cuda_graph": True},
            batcher={"max_batch_size": 1},
        )
    )
    for scale in (1.0, 3.0, -1.0):
        x = X[:1] * np.float32(scale)
        np.testing.assert_allclose(model.run({"x": x})["double"], x + x)


@pytest.mark.gpu
def test_cuda_deployment_observes_transfers(cuda: None, tiny_model: Path) -> None:
    registry = CollectorRegistry()
    deployment = Deployment(config(tiny_model, provider="cuda", batcher={"max_batch_size": 4}), ServerMetrics(registry))
    try:
        assert deployment.wait_ready(60)
        deployment.batcher.infer({"x": X}, 3)
        labels = {"deployment": "a", "model": deployment.config.model, "provider": "cuda"}
        for name in ("input", "output"):
            count = registry.get_sample_value(f"latlab_batcher_{name}_transfer_duration_seconds_count", labels)
            assert count == 1  # warm-up runs are not observed
        environment = deployment.describe()["environment"]
        assert environment["gpu"]
        # results files say which precision ran (ORT's defaults stated, not implied)
        assert (environment["use_tf32"], environment["cudnn_conv_algo_search"], environment["fuse_conv_bias"]) == (
            True,
            "exhaustive",
            False,
        )
        assert deployment.describe()["bucket_runs"] == {
            "batch_buckets": [1, 2, 4],
            "bucket_mode": "shared",
            "sessions": 1,
            "cuda_graph": "off",
        }
    finally:
        deployment.close()
