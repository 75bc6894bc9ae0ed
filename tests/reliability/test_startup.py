"""A deployment that cannot load fails at start with one line naming the file and the cause; with
on_load_failure = "skip" the others are served and readiness says what is missing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest

from latlab.common import procs
from latlab.server.config import parse_config
from latlab.server.errors import ConfigError
from latlab.server.runtime.providers import provider_load_error

from tests.conftest import build_tiny_model
from tests.reliability.conftest import CLI, assert_error, running_server, tiny_body, write_config

pytestmark = pytest.mark.e2e
NO_CUDA = provider_load_error("CUDAExecutionProvider")
needs_no_cuda = pytest.mark.skipif(NO_CUDA is None, reason="CUDA loads here: nothing to fail on")
X = np.ones((1, 4), np.float32)


def corrupt_model(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(range(256)) * 8)  # not a protobuf ONNX can parse
    return path


def truncated_model(path: Path, tmp_path: Path) -> Path:
    whole = build_tiny_model(tmp_path / "whole" / "model.onnx").read_bytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(whole[: len(whole) // 2])
    return path


def future_ir_model(path: Path) -> Path:
    """Parses as ONNX, but ONNX Runtime refuses its IR version: only a real session finds out (in the worker)."""
    model = onnx.load(str(build_tiny_model(path)))
    model.ir_version = 99
    onnx.save(model, str(path))
    return path


def serve(config: Path, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "serve", "--config", str(config)], capture_output=True, text=True, timeout=timeout_s)


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.mark.parametrize("kind", ["corrupt", "truncated"])
def test_unparsable_model_fails_at_start_naming_file_and_cause(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "bad" / "model.onnx"
    corrupt_model(path) if kind == "corrupt" else truncated_model(path, tmp_path)
    config = write_config(tmp_path / "s.toml", [{"name": "bad", "model_path": str(path)}], port=procs.free_port())
    assert_one_line_error(serve(config), "deployment 'bad'", str(path), "is not a valid ONNX model", "Error parsing")


@needs_no_cuda
def test_cuda_deployment_without_cuda_fails_at_start_naming_the_library(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "tiny" / "model.onnx")
    config = write_config(
        tmp_path / "s.toml", [{"name": "gpu", "model_path": str(model), "provider": "cuda"}], port=procs.free_port()
    )
    result = serve(config)
    assert_one_line_error(result, "deployment 'gpu'", str(model), "needs provider cuda, which cannot load")
    assert ".so" in result.stderr  # the library that is missing, e.g. libcublasLt.so.13


def test_model_path_escaping_model_dir_is_refused(tmp_path: Path) -> None:
    outside = build_tiny_model(tmp_path / "outside" / "model.onnx")
    (tmp_path / "models").mkdir()
    config = write_config(
        tmp_path / "s.toml",
        [{"name": "sneaky", "model_path": "models/../outside/model.onnx"}],
        port=procs.free_port(),
        model_dir="models",
    )
    assert_one_line_error(
        serve(config), "deployment 'sneaky'", str(outside), "outside model_dir", str(tmp_path / "models")
    )


def test_failure_only_a_session_finds_ends_the_worker_with_one_logged_line(tmp_path: Path) -> None:
    path = future_ir_model(tmp_path / "future" / "model.onnx")
    config = write_config(tmp_path / "s.toml", [{"name": "future", "model_path": str(path)}], port=procs.free_port())
    result = serve(config)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if " ERROR latlab.server" in line]
    assert len(errors) == 1 and f"cannot load {path}" in errors[0] and "IR version" in errors[0], result.stderr
    assert "Traceback" not in result.stderr


def test_skip_serves_the_others_and_readiness_tells(tmp_path: Path) -> None:
    good = build_tiny_model(tmp_path / "tiny" / "model.onnx")
    deployments = [
        {"name": "corrupt", "model_path": str(corrupt_model(tmp_path / "corrupt" / "model.onnx"))},
        {"name": "future", "model_path": str(future_ir_model(tmp_path / "future" / "model.onnx"))},
        {"name": "tiny", "model_path": str(good)},
    ]
    if NO_CUDA:
        deployments.append({"name": "gpu", "model_path": str(good), "provider": "cuda"})
    with running_server(tmp_path, deployments, on_load_failure="skip") as server:
        get = server.session.get
        assert get(f"{server.url}/v2/health/ready", timeout=10).status_code == 400
        assert get(f"{server.url}/v2/models/tiny/ready", timeout=10).status_code == 200
        assert server.infer(tiny_body(X)).status_code == 200
        causes = {"corrupt": "INVALID_PROTOBUF", "future": "IR version", "gpu": "CUDAExecutionProvider"}
        for deployment in deployments[:2] + deployments[3:]:
            name = deployment["name"]
            for path in (f"/v2/models/{name}/ready", f"/v2/models/{name}", f"/v2/models/{name}/config"):
                assert_error(
                    get(server.url + path, timeout=10),
                    503,
                    f"deployment '{name}'",
                    causes[name],
                    "failed to load at start",
                )
            assert_error(server.infer(tiny_body(X), model=name), 503, causes[name])
        log = server.log.read_text()
        assert 'on_load_failure = "skip"' in log and str(tmp_path / "corrupt" / "model.onnx") in log


def test_skip_with_nothing_loadable_still_fails(tmp_path: Path) -> None:
    path = corrupt_model(tmp_path / "corrupt" / "model.onnx")
    config = write_config(
        tmp_path / "s.toml",
        [{"name": "corrupt", "model_path": str(path)}],
        port=procs.free_port(),
        on_load_failure="skip",
    )
    result = serve(config)
    assert result.returncode == 2
    assert "no deployment can be loaded" in result.stderr.splitlines()[-1]


@pytest.mark.parametrize("value", ["ignore", "", 1])
def test_on_load_failure_is_fail_or_skip(value: object) -> None:
    with pytest.raises(ConfigError, match="on_load_failure must"):
        parse_config({"server": {"on_load_failure": value}, "deployments": [{"name": "m", "model_path": "m.onnx"}]})
