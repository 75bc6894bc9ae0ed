"""Batch bucket and CUDA precision settings: defaults per provider, validation, one-line errors."""

from __future__ import annotations

import pytest

from latlab.common.settings import default_buckets
from latlab.server.config import DeploymentConfig, parse_config
from latlab.server.errors import ConfigError


def deployment(provider: str = "cpu", max_batch_size: int = 8, **batcher: object) -> DeploymentConfig:
    table = {"max_batch_size": max_batch_size, **batcher}
    return parse_config(
        {"deployments": [{"name": "a", "model_path": "/m.onnx", "provider": provider, "batcher": table}]}
    ).deployments[0]


@pytest.mark.parametrize(
    ("provider", "size", "expected"),
    [
        ("cuda", 8, (1, 2, 4, 8)),
        ("cuda", 64, (1, 2, 4, 8, 16, 32, 64)),
        ("cuda", 12, (1, 2, 4, 8, 12)),
        ("tensorrt", 5, (1, 2, 4, 5)),
        ("cuda", 1, (1,)),
        ("cpu", 8, ()),
        ("cpu", 1, ()),
    ],
)
def test_default_buckets_are_powers_of_two_up_to_the_max_on_a_device(provider: str, size: int, expected: tuple) -> None:
    assert default_buckets(provider, size) == expected
    assert deployment(provider, size).batcher.batch_buckets == expected


def test_configured_buckets_are_kept_on_any_provider() -> None:
    assert deployment("cpu", 8, batch_buckets=[2, 8]).batcher.batch_buckets == (2, 8)
    assert deployment("cuda", 8, batch_buckets=[3, 8]).batcher.batch_buckets == (3, 8)


def test_an_empty_list_turns_buckets_off_on_cuda() -> None:
    assert deployment("cuda", 8, batch_buckets=[]).batcher.batch_buckets == ()


@pytest.mark.parametrize(
    ("buckets", "message"),
    [
        ([4, 2, 8], "batch_buckets must be ascending, distinct integers >= 1, got [4, 2, 8]"),
        ([2, 2, 8], "batch_buckets must be ascending, distinct integers >= 1"),
        ([0, 8], "batch_buckets must be ascending, distinct integers >= 1"),
        ([1.5, 8], "batch_buckets must be ascending, distinct integers >= 1"),
        ([True, 8], "batch_buckets must be ascending, distinct integers >= 1"),
        ([1, 4], "the last of batch_buckets must be max_batch_size (8) so every batch has a bucket, got [1, 4]"),
        ([1, 16], "the last of batch_buckets must be max_batch_size (8)"),
        ("1,2,8", "batch_buckets must be a list, got '1,2,8'"),
    ],
)
def test_bad_buckets_are_one_line_errors(buckets: object, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        deployment("cuda", 8, batch_buckets=buckets)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_bucket_sessions_must_be_a_known_choice() -> None:
    assert deployment("cuda", 8, bucket_sessions="per_bucket").batcher.bucket_sessions == "per_bucket"
    with pytest.raises(
        ConfigError,
        match=r"bucket_sessions must be one of \('auto', 'shared', 'per_bucket'\), "
        r"got 'each'",
    ):
        deployment("cuda", 8, bucket_sessions="each")


def test_cuda_precision_defaults_are_ort_defaults_and_configurable() -> None:
    cuda = deployment("cuda").cuda
    assert (cuda.use_tf32, cuda.fuse_conv_bias, cuda.cudnn_conv_algo_search) == (True, False, "exhaustive")
    doc = {
        "deployments": [
            {
                "name": "a",
                "model_path": "/m.onnx",
                "provider": "cuda",
                "cuda": {"use_tf32": False, "fuse_conv_bias": True, "cudnn_conv_algo_search": "heuristic"},
            }
        ]
    }
    cuda = parse_config(doc).deployments[0].cuda
    assert (cuda.use_tf32, cuda.fuse_conv_bias, cuda.cudnn_conv_algo_search) == (False, True, "heuristic")
