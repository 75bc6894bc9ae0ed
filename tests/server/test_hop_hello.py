"""A client's calls to an engine that has not answered its hello yet (the status says the engine is up, but the
client cannot yet be answered: a restart, for milliseconds) wait queued for the hello's answer, bounded by
CONNECT_WAIT_S, instead of being refused at once; against a real engine process."""

from __future__ import annotations

import shutil
import signal
import threading
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from latlab.common import procs
from latlab.server.config import save_config
from latlab.server.errors import ModelNotReady
from latlab.server.processes import client as client_module
from latlab.server.processes.client import UNREACHABLE, EngineClient
from latlab.server.processes.hop import stacked, tensors_from
from latlab.server.processes.shared import EngineStatus
from latlab.server.processes.supervisor import run_folder
from tests.conftest import build_tiny_model
from tests.server.test_hop_groups import infer_call, start_engine, tiny_y


class Answers:
    def __init__(self) -> None:
        self.got: dict[int, tuple[dict, list, BaseException | None]] = {}
        self.all_in = threading.Event()
        self.expected = 0

    def answered(self, index: int):
        def deliver(answer: dict, frames: list, error: BaseException | None) -> None:
            self.got[index] = answer, frames, error
            if len(self.got) == self.expected:
                self.all_in.set()

        return deliver

    def calls(self, parts: list[np.ndarray]) -> list:
        self.expected = len(parts)
        return [(infer_call(x), {"x": x}, self.answered(i)) for i, x in enumerate(parts)]


@pytest.fixture
def up_without_engine() -> Iterator[tuple[Path, EngineStatus]]:
    """A run folder whose status says an engine is up (ready) while none listens yet."""
    run_dir = run_folder(1)
    status = EngineStatus(run_dir)
    status.starting(0)
    status.set_ready(True)
    yield run_dir, status
    status.close()
    shutil.rmtree(run_dir, ignore_errors=True)


def test_calls_before_the_hello_is_answered_wait_for_it_and_are_answered(
    up_without_engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The calls are queued while no engine answers; the engine then starts (the same generation), answers the
    hello, and every queued call is sent and answered, none refused."""
    monkeypatch.setattr(client_module, "CONNECT_WAIT_S", 600.0)  # the engine's start is not what is tested
    run_dir, status = up_without_engine
    answers = Answers()
    parts = [np.full((n, 4), n, np.float32) for n in (1, 2)]
    client = EngineClient(run_dir, status)
    engine = None
    try:
        client.send_many(answers.calls(parts))  # no engine listens: nothing can answer the hello yet
        assert not answers.all_in.is_set() and not answers.got
        model = build_tiny_model(tmp_path / "tiny.onnx")
        batcher = {"max_batch_size": 8, "max_queue_delay_ms": 2.0}
        deployments = [{"name": "tiny", "model_path": model, "batcher": batcher}]
        config = save_config({"server": {"port": procs.free_port()}, "deployments": deployments}, tmp_path / "c.toml")
        engine = start_engine(config, run_dir)
        while not answers.all_in.wait(0.05):
            assert engine.poll() is None, "the engine did not start"
    finally:
        client.close()
        if engine is not None:
            engine.send_signal(signal.SIGTERM)
            engine.wait(60)
    for index, x in enumerate(parts):
        answer, frames, error = answers.got[index]
        assert error is None, error
        np.testing.assert_allclose(tensors_from(answer["outputs"], frames)["y"], tiny_y(x), rtol=1e-5, atol=1e-5)


def test_calls_the_engine_never_hears_are_refused_after_the_connect_wait(
    up_without_engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No engine answers the hello: after CONNECT_WAIT_S each queued call (a stack's requests each) is answered
    ModelNotReady, "not reachable", as a request thread's call is after the same wait; nothing is left waiting."""
    monkeypatch.setattr(client_module, "CONNECT_WAIT_S", 0.2)
    run_dir, status = up_without_engine
    answers = Answers()
    client = EngineClient(run_dir, status)
    try:
        client.send_many(stacked(answers.calls([np.ones((1, 4), np.float32)] * 3), {"tiny": 8}))
        assert answers.all_in.wait(60)
        assert not client.forget(1)  # answered: no longer waited on
    finally:
        client.close()
    assert sorted(answers.got) == [0, 1, 2]
    for _, _, error in answers.got.values():
        assert isinstance(error, ModelNotReady) and str(error) == UNREACHABLE
