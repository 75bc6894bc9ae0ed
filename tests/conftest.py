"""Shared fixtures: a tiny ONNX model built in tmp_path and a ServerConfig factory; the fast lane's guard."""

from __future__ import annotations

import gzip
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from latlab.server.config import ServerConfig, parse_config

# The tiny model's fixed parameters, so a test can recompute y = x @ W + b by hand.
RNG_SEED = 1234
TINY_IN, TINY_OUT = 4, 3


def tiny_weights() -> tuple[np.ndarray, np.ndarray]:
    """W (4x3) and b (3,) of the tiny model, drawn from a fixed seed."""
    rng = np.random.default_rng(RNG_SEED)
    w = rng.standard_normal((TINY_IN, TINY_OUT)).astype(np.float32)
    b = rng.standard_normal(TINY_OUT).astype(np.float32)
    return w, b


def build_tiny_model(path: Path) -> Path:
    """Write y = MatMul(x, W) + b with x FP32 ["batch", 4] as an opset-17 ONNX file at `path`."""
    w, b = tiny_weights()
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", TINY_IN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", TINY_OUT])],
        initializer=[numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")],
    )
    # ir_version 9 is what onnxruntime 1.2x-1.3x accepts; the newest onnx would stamp a newer one.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


@pytest.fixture
def tiny_model(tmp_path: Path) -> Path:
    """Path of a freshly built tiny ONNX model: tmp_path/tiny/model.onnx."""
    return build_tiny_model(tmp_path / "tiny" / "model.onnx")


def server_config(model_path: Path | str, name: str = "tiny", **batcher: object) -> ServerConfig:
    """A one-deployment ServerConfig for `model_path`, built through parse_config like a TOML file."""
    deployment: dict = {"name": name, "model_path": str(model_path)}
    if batcher:
        deployment["batcher"] = dict(batcher)
    return parse_config({"deployments": [deployment]})


@pytest.fixture
def make_config() -> Callable[..., ServerConfig]:
    """The `server_config` factory, for tests that prefer a fixture to an import."""
    return server_config


FAST_LANE = os.environ.get("LATLAB_FAST_LANE") == "1"
"""`make check` sets it: the tests that start no process and open no listening socket run, the rest skip where
they would start one. The line is drawn by what a test does, so no list of slow tests needs keeping."""


LAB_V1 = Path(__file__).resolve().parent / "data" / "lab-v1"
"""A committed lab run (an AMD EPYC VM, no GPU deployment)."""


@pytest.fixture(scope="module")
def ffn_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The committed lab run's ffn results and bench, unzipped into a run folder."""
    folder = tmp_path_factory.mktemp("run")
    for name, target in (("ffn-results.json.gz", "results-ffn.json"), ("bench.json.gz", "bench.json")):
        with gzip.open(LAB_V1 / name) as source, open(folder / target, "wb") as out:
            shutil.copyfileobj(source, out)
    return folder


def _starts_something(what: str):
    def refuse(*args, **kwargs):
        pytest.skip(f"fast lane: {what} (make test runs it)")

    return refuse


def pytest_collection_finish(session):
    """Refuse from the first test on (not before: pytest-xdist's workers start and describe their platform first)."""
    controller = session.config.getoption("dist", "no") != "no" and "PYTEST_XDIST_WORKER" not in os.environ
    if FAST_LANE and not controller:  # pytest-xdist's controller starts its workers and runs no test
        subprocess.Popen.__init__ = _starts_something("starts a process")
        socket.socket.bind = _starts_something("opens a socket")
