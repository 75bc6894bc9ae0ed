"""latlab.server.config writes configs: what it writes loads back as the same typed settings."""

from __future__ import annotations

import tomllib
from dataclasses import fields
from pathlib import Path

import pytest

from latlab.server.config import (
    BatcherSettings,
    CpuOptions,
    CudaOptions,
    DeploymentConfig,
    PaddingSettings,
    ServerConfig,
    TensorrtOptions,
    TokenizerSettings,
    dumps_config,
    load_config,
    save_config,
)
from latlab.server.errors import ConfigError

ODD = 'a "quoted" dir\\with a backslash'
"""A folder name TOML must escape: quotes, a backslash and spaces."""


def odd_folder(tmp_path: Path) -> Path:
    """A models folder under ODD holding model.onnx and tokenizer/tokenizer.json (the loader checks only
    that the tokenizer file exists)."""
    folder = tmp_path / ODD / "minilm"
    (folder / "tokenizer").mkdir(parents=True)
    (folder / "tokenizer" / "tokenizer.json").write_text("{}")
    (folder / "model.onnx").write_bytes(b"")
    return folder


def every_section(folder: Path) -> dict:
    """A config using every table a deployment may hold, with paths, tuples, booleans and strings."""
    return {
        "server": {
            "host": "0.0.0.0",
            "port": 9000,
            "metrics_port": 9100,
            "threads": 600,
            "admission": False,
            "max_body_bytes": 1 << 20,
            "on_load_failure": "skip",
            "model_dir": folder.parent,
            "auth_token": "a-token-of-twenty-chars",
        },
        "deployments": [
            {
                "name": "text",
                "model": "minilm",
                "model_path": folder / "model.onnx",
                "warmup": False,
                "allow_non_finite": True,
                "batcher": {
                    "max_batch_size": 8,
                    "max_queue_delay_ms": 2.5,
                    "max_queue_size": 64,
                    "instances": 2,
                    "timeout_ms": 500,
                    "preferred_batch_sizes": (4, 8),
                    "adaptive": True,
                    "priority_levels": 2,
                    "default_priority_level": 2,
                    "batch_buckets": [2, 8],
                    "bucket_sessions": "shared",
                },
                "cpu": {
                    "intra_op_threads": 1,
                    "inter_op_threads": 2,
                    "allow_spinning": False,
                    "graph_optimization_level": "extended",
                    "execution_mode": "parallel",
                },
                "padding": {"axis": 1, "values": {"input_ids": 0, "attention_mask": 0}, "bucket": 16},
                "tokenizer": {"file": folder / "tokenizer" / "tokenizer.json", "max_length": 128},
            },
            {
                "name": "gpu",
                "model_path": folder / "model.onnx",
                "provider": "cuda",
                "batcher": {"max_batch_size": 4},
                "cuda": {
                    "device_id": 1,
                    "cudnn_conv_algo_search": "heuristic",
                    "enable_cuda_graph": True,
                    "gpu_mem_limit": 1 << 30,
                    "arena_extend_strategy": "same_as_requested",
                    "copy_in_default_stream": False,
                    "cuda_graph_fallback": True,
                    "use_tf32": False,
                    "fuse_conv_bias": True,
                },
            },
            {
                "name": "trt",
                "model_path": folder / "model.onnx",
                "provider": "tensorrt",
                "tokenizer": None,
                "tensorrt": {"fp16": True, "engine_cache_dir": str(folder / "engines"), "max_workspace_bytes": 1 << 28},
            },
        ],
    }


def test_every_section_comes_back_as_the_same_typed_config(tmp_path: Path) -> None:
    folder = odd_folder(tmp_path)
    config = load_config(save_config(every_section(folder), tmp_path / "server.toml"), environ={})
    model = folder / "model.onnx"
    assert config == ServerConfig(
        host="0.0.0.0",
        port=9000,
        metrics_port=9100,
        threads=600,
        admission=False,
        max_body_bytes=1 << 20,
        on_load_failure="skip",
        model_dir=folder.parent,
        auth_token="a-token-of-twenty-chars",
        deployments=(
            DeploymentConfig(
                name="text",
                model="minilm",
                model_path=model,
                warmup=False,
                allow_non_finite=True,
                batcher=BatcherSettings(
                    max_batch_size=8,
                    max_queue_delay_ms=2.5,
                    max_queue_size=64,
                    instances=2,
                    timeout_ms=500,
                    preferred_batch_sizes=(4, 8),
                    adaptive=True,
                    priority_levels=2,
                    default_priority_level=2,
                    batch_buckets=(2, 8),
                    bucket_sessions="shared",
                ),
                cpu=CpuOptions(
                    intra_op_threads=1,
                    inter_op_threads=2,
                    allow_spinning=False,
                    graph_optimization_level="extended",
                    execution_mode="parallel",
                ),
                padding=PaddingSettings(axis=1, values={"input_ids": 0, "attention_mask": 0}, bucket=16),
                tokenizer=TokenizerSettings(file=folder / "tokenizer" / "tokenizer.json", max_length=128),
            ),
            DeploymentConfig(
                name="gpu",
                model="minilm",
                model_path=model,
                provider="cuda",
                batcher=BatcherSettings(max_batch_size=4, batch_buckets=(1, 2, 4)),  # cuda's default buckets
                cuda=CudaOptions(
                    device_id=1,
                    cudnn_conv_algo_search="heuristic",
                    enable_cuda_graph=True,
                    gpu_mem_limit=1 << 30,
                    arena_extend_strategy="same_as_requested",
                    copy_in_default_stream=False,
                    cuda_graph_fallback=True,
                    use_tf32=False,
                    fuse_conv_bias=True,
                ),
            ),
            DeploymentConfig(
                name="trt",
                model="minilm",
                model_path=model,
                provider="tensorrt",
                batcher=BatcherSettings(batch_buckets=(1,)),
                tensorrt=TensorrtOptions(
                    fp16=True, engine_cache_dir=str(folder / "engines"), max_workspace_bytes=1 << 28
                ),
            ),
        ),
    )


def test_the_text_holds_the_document_as_given(tmp_path: Path) -> None:
    """Paths become strings, tuples lists and None keys go; nothing is added, dropped or retyped."""
    folder = odd_folder(tmp_path)
    doc = every_section(folder)
    read = tomllib.loads(dumps_config(doc))
    text, gpu, trt = read["deployments"]
    assert read["server"] == {**doc["server"], "model_dir": str(folder.parent)}
    assert text["model_path"] == str(folder / "model.onnx") and text["batcher"]["preferred_batch_sizes"] == [4, 8]
    assert text["tokenizer"] == {"file": str(folder / "tokenizer" / "tokenizer.json"), "max_length": 128}
    assert gpu["cuda"] == doc["deployments"][1]["cuda"] and "tokenizer" not in trt


def test_a_path_with_quotes_a_backslash_and_spaces_survives(tmp_path: Path) -> None:
    folder = odd_folder(tmp_path)
    doc = {
        "deployments": [
            {
                "name": "m",
                "model_path": folder / "model.onnx",
                "tokenizer": {"file": folder / "tokenizer" / "tokenizer.json", "max_length": 16},
            }
        ]
    }
    (deployment,) = load_config(save_config(doc, tmp_path / "s.toml"), environ={}).deployments
    assert deployment.model_path == folder / "model.onnx" and ODD in str(deployment.model_path)
    assert deployment.tokenizer.file == folder / "tokenizer" / "tokenizer.json"


def test_a_relative_model_path_is_read_against_the_configs_folder(tmp_path: Path) -> None:
    folder = odd_folder(tmp_path)
    doc = {"deployments": [{"name": "m", "model_path": Path("minilm") / "model.onnx"}]}
    (deployment,) = load_config(save_config(doc, folder.parent / "s.toml"), environ={}).deployments
    assert deployment.model_path == folder / "model.onnx"


BOOLEANS = [
    (table, f.name, not getattr(cls, f.name))
    for table, cls in (
        ("server", ServerConfig),
        ("deployment", DeploymentConfig),
        ("batcher", BatcherSettings),
        ("cpu", CpuOptions),
        ("cuda", CudaOptions),
        ("tensorrt", TensorrtOptions),
    )
    for f in fields(cls)
    if isinstance(getattr(cls, f.name, None), bool)
]


@pytest.mark.parametrize("table, key, value", BOOLEANS)
def test_every_boolean_is_a_toml_boolean(tmp_path: Path, table: str, key: str, value: bool) -> None:
    deployment: dict = {"name": "m", "model_path": "m.onnx"}
    doc: dict = {"server": {}, "deployments": [deployment]}
    if table == "server":
        doc["server"][key] = value
    elif table == "deployment":
        deployment[key] = value
    else:
        deployment[table] = {key: value}
    text = dumps_config(doc)
    assert f"{key} = {str(value).lower()}" in text
    config = load_config(save_config(doc, tmp_path / "s.toml"), environ={})
    owner = {"server": config, "deployment": config.deployments[0]}.get(table) or getattr(config.deployments[0], table)
    assert getattr(owner, key) is value


@pytest.mark.parametrize(
    "doc, message",
    [
        (
            {"deployments": [{"name": "m", "model_path": "m.onnx", "cpu": {"allow_spinning": "false"}}]},
            r"deployment 'm' \[cpu\]: allow_spinning must be true or false, got 'false'",
        ),
        ({"server": {"admission": 0}, "deployments": []}, r"\[server\]: admission must be true or false"),
        (
            {"deployments": [{"name": "m", "model_path": "m.onnx", "batcher": {"max_batch": 8}}]},
            r"deployment 'm' \[batcher\]: unknown setting\(s\) \['max_batch'\]",
        ),
        ({"deployments": [{"name": "m", "model_path": "m.onnx", "gpu": True}]}, r"unknown setting\(s\) \['gpu'\]"),
        ({"deployments": [{"name": "m", "model_path": "m.onnx", "cuda": "on"}]}, "cuda must be a table"),
        ({"server": {"port": "8000"}, "deployments": []}, r"\[server\]: port must be an integer"),
        ({"servers": {}, "deployments": []}, r"\[server\] and \[\[deployments\]\] only, got \['servers'\]"),
    ],
)
def test_settings_the_loader_would_refuse_are_refused_before_writing(tmp_path: Path, doc: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        save_config(doc, tmp_path / "s.toml")
    assert not (tmp_path / "s.toml").exists()
