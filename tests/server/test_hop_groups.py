"""Requests across the hop in groups: a group's messages stay bounded, a bad request fails alone in its group,
and answers reach the requests that wait on them, against a real engine process."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import zmq

from latlab.common import procs
from latlab.server.config import save_config
from latlab.server.processes.client import EngineClient
from latlab.server.processes.hop import (
    GROUP_BYTES,
    GROUP_CALLS,
    OWN_FRAME_BYTES,
    group_message,
    recv_frames,
    send_frames,
    tensors_from,
    unpack,
)
from latlab.server.processes.shared import EngineStatus, endpoint
from latlab.server.processes.supervisor import run_folder
from tests.conftest import build_tiny_model, tiny_weights


def tiny_y(x: np.ndarray) -> np.ndarray:
    w, b = tiny_weights()
    return x @ w + b


def infer_call(x: np.ndarray, model: str = "tiny") -> dict:
    return {"kind": "infer", "model": model, "outputs": None, "parameters": {}, "finite": []}


def start_engine(config: Path, run_dir: Path) -> subprocess.Popen:
    """An engine process of `config` in `run_dir`, as a supervisor starts it (its observer on a free port)."""
    command = [sys.executable, "-m", "latlab.server.processes.engine", str(config), str(run_dir)]
    return subprocess.Popen([*command, f"127.0.0.1:{procs.free_port()}"])


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, EngineStatus]]:
    """A real engine process serving the tiny model (batches of up to 8, 2 ms), as a supervisor starts it."""
    folder = tmp_path_factory.mktemp("hop-groups")
    model = build_tiny_model(folder / "tiny.onnx")
    # a queue that holds a whole oversized group: none of it is refused as queue full
    batcher = {"max_batch_size": 8, "max_queue_delay_ms": 2.0, "max_queue_size": 1024}
    deployment = {"name": "tiny", "model_path": model, "batcher": batcher}
    # a queue that holds 2 requests besides a full batch: what a group sends past them is refused
    tight = {"name": "tight", "model_path": model, "batcher": {**batcher, "max_queue_size": 2}}
    deployments = [deployment, tight]
    config = save_config({"server": {"port": procs.free_port()}, "deployments": deployments}, folder / "c.toml")
    run_dir = run_folder(len(deployments))
    status = EngineStatus(run_dir)
    process = start_engine(config, run_dir)
    status.starting(process.pid)
    try:
        while not status.ready:
            assert process.poll() is None, "the engine did not start"
            threading.Event().wait(0.05)
        yield run_dir, status
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
        status.close()
        shutil.rmtree(run_dir, ignore_errors=True)


def test_small_tensors_share_a_frame_and_large_ones_travel_alone() -> None:
    small = np.arange(3, dtype=np.float32)
    large = np.ones(OWN_FRAME_BYTES // 8, dtype=np.float64)
    calls = [({"id": 1}, "inputs", {"a": small, "b": large}), ({"id": 2}, "inputs", {"a": small[:1].astype(np.int8)})]
    frames, taken = group_message(calls)
    assert taken == 2 and len(frames) == 3  # header, the shared frame, the large array's own
    headers = unpack(frames[0])["group"]
    first, second = (tensors_from(h["inputs"], frames[1:]) for h in headers)
    np.testing.assert_array_equal(first["a"], small)
    np.testing.assert_array_equal(first["b"], large)
    np.testing.assert_array_equal(second["a"], [0])
    assert all(item[4] % 8 == 0 for h in headers for item in h["inputs"])  # every array starts aligned


def test_a_group_closes_at_its_bounds() -> None:
    many = [({"id": i}, "inputs", {"x": np.full((1, 4), i, np.float32)}) for i in range(GROUP_CALLS + 10)]
    _, taken = group_message(many)
    assert taken == GROUP_CALLS
    big = np.zeros(GROUP_BYTES // 4 + 1, dtype=np.uint8)  # four of them pass the group's bytes
    _, taken = group_message([({"id": i}, "inputs", {"x": big}) for i in range(6)])
    assert taken == 4
    _, taken = group_message([({"id": 0}, "inputs", {"x": np.zeros(GROUP_BYTES * 2, np.uint8)})])
    assert taken == 1  # never fewer than one, however large


def raw_group(run_dir: Path, calls: list[tuple[dict, str, dict | None]]) -> dict[int, tuple[dict, list]]:
    """Send `calls` to the engine as groups (as many messages as their bounds ask), read every answer by id."""
    context = zmq.Context()
    try:
        sock = context.socket(zmq.DEALER)
        sock.connect(endpoint(run_dir))
        rest = calls
        while rest:
            frames, taken = group_message(rest)
            send_frames(sock, frames)
            rest = rest[taken:]
        answers: dict[int, tuple[dict, list]] = {}
        while len(answers) < len(calls):
            assert sock.poll(30000), f"{len(answers)} answers of {len(calls)}"
            message = recv_frames(sock)
            group = unpack(message[0])["group"]
            assert len(group) <= GROUP_CALLS
            answers.update({answer["id"]: (answer, message[1:]) for answer in group})
        return answers
    finally:
        context.destroy(0)


def test_a_bad_request_fails_alone_in_its_group(engine) -> None:
    run_dir, _ = engine
    good = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    calls = [
        ({**infer_call(good), "id": 1}, "inputs", {"x": good}),
        ({**infer_call(good), "id": 2}, "inputs", {"x": np.ones((1, 5), np.float32)}),  # wrong shape
        ({**infer_call(good, model="nope"), "id": 3}, "inputs", {"x": good}),  # unknown model
        ({**infer_call(good), "id": 4}, "inputs", {"x": good[:1]}),
    ]
    answers = raw_group(run_dir, calls)
    assert answers[2][0]["error"] == "BadRequest" and "shape" in answers[2][0]["message"]
    assert answers[3][0]["error"] == "ModelNotFound"
    for request_id, x in ((1, good), (4, good[:1])):
        answer, frames = answers[request_id]
        np.testing.assert_allclose(tensors_from(answer["outputs"], frames)["y"], tiny_y(x), rtol=1e-5, atol=1e-5)


def test_a_request_its_batcher_refuses_fails_alone_in_its_group(engine) -> None:
    """A group's requests reach each deployment's batcher at once: what the batcher refuses (the queue full, a
    batch over max_batch_size, a priority out of range) is that request's answer, and the others, of both
    deployments, are answered with their outputs."""
    run_dir, _ = engine
    x = np.random.default_rng(1).standard_normal((1, 4)).astype(np.float32)
    tight = {**infer_call(x, model="tight"), "parameters": {"priority": 0}}
    refused = {2: "QueueFull", 4: "BadRequest", 6: "BadRequest", 8: "QueueFull"}
    calls = [
        ({**tight, "id": 0}, "inputs", {"x": x}),
        ({**infer_call(x), "id": 1}, "inputs", {"x": x}),
        ({**tight, "id": 3}, "inputs", {"x": x}),
        ({**tight, "id": 2}, "inputs", {"x": x}),  # the third waiting in tight's queue of 2
        ({**infer_call(x), "id": 4}, "inputs", {"x": np.ones((9, 4), np.float32)}),  # over max_batch_size 8
        ({**infer_call(x), "id": 5}, "inputs", {"x": x}),
        ({**infer_call(x), "parameters": {"priority": 5}, "id": 6}, "inputs", {"x": x}),  # one level only
        ({**infer_call(x), "id": 7}, "inputs", {"x": x}),
        ({**tight, "id": 8}, "inputs", {"x": x}),
    ]
    answers = raw_group(run_dir, calls)
    assert sorted(answers) == list(range(9))
    for request_id, (answer, frames) in answers.items():
        if request_id in refused:
            assert answer.get("error") == refused[request_id], answer
        else:
            np.testing.assert_allclose(tensors_from(answer["outputs"], frames)["y"], tiny_y(x), rtol=1e-5, atol=1e-5)


def test_a_group_past_one_message_is_answered_whole(engine) -> None:
    """More calls than one message holds, each answered once, in messages no larger than a group."""
    run_dir, _ = engine
    n = GROUP_CALLS + 44
    xs = [np.full((1, 4), i, np.float32) for i in range(n)]
    answers = raw_group(run_dir, [({**infer_call(x), "id": i}, "inputs", {"x": x}) for i, x in enumerate(xs)])
    assert sorted(answers) == list(range(n))
    for i, x in enumerate(xs):
        answer, frames = answers[i]
        assert "outputs" in answer, answer
        np.testing.assert_allclose(tensors_from(answer["outputs"], frames)["y"], tiny_y(x), rtol=1e-5, atol=1e-4)


def test_answers_reach_the_threads_that_wait_on_them(engine) -> None:
    """32 threads of one client, each sending its own inputs again and again: grouped on the way in, batched
    together, answered in groups, every thread gets the answer to its own request."""
    run_dir, status = engine
    client = EngineClient(run_dir, status)
    wrong: list = []

    def ask(index: int) -> None:
        rng = np.random.default_rng(index)
        for _ in range(25):
            x = rng.standard_normal((1 + index % 3, 4)).astype(np.float32)
            answer, frames = client.call(infer_call(x), {"x": x})
            y = tensors_from(answer["outputs"], frames)["y"]
            if not np.allclose(y, tiny_y(x), rtol=1e-4, atol=1e-5):
                wrong.append(index)

    try:
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(32)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        client.close()
    assert not wrong


def held_call(client: EngineClient, x: np.ndarray, results: dict, name: str) -> threading.Thread:
    """A call, on a thread of its own, that its group may hold for as long as a request is coming."""

    def run() -> None:
        answer, frames = client.call(infer_call(x), {"x": x}, hold_s=60.0)
        results[name] = tensors_from(answer["outputs"], frames)["y"]

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_group_waits_for_the_request_admitted_before_it_calls(engine) -> None:
    """A request admitted (expect) and not yet called holds the group of a call made meanwhile: that call is not
    sent before the admitted one calls too, and then both are answered."""
    run_dir, status = engine
    client = EngineClient(run_dir, status)
    x = np.ones((1, 4), np.float32)
    results: dict = {}
    try:
        client.expect()  # this thread's request is admitted: it is coming
        waiting = held_call(client, x, results, "held")
        waiting.join(0.5)
        assert waiting.is_alive() and not results  # held: its hold is a minute, and one request is coming
        answer, frames = client.call(infer_call(x), {"x": x})
        waiting.join(30)
        assert not waiting.is_alive()
        np.testing.assert_allclose(results["held"], tiny_y(x), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(tensors_from(answer["outputs"], frames)["y"], tiny_y(x), rtol=1e-5, atol=1e-5)
    finally:
        client.close()


def test_a_request_that_leaves_without_calling_releases_the_group(engine) -> None:
    """An admitted request that fails before its call (a bad body, say) is no longer awaited when it leaves."""
    run_dir, status = engine
    client = EngineClient(run_dir, status)
    x = np.full((1, 4), 3, np.float32)
    results: dict = {}
    try:
        client.expect()
        waiting = held_call(client, x, results, "held")
        waiting.join(0.5)
        assert waiting.is_alive()
        client.arrived()  # it leaves without calling
        waiting.join(30)
        assert not waiting.is_alive()
        np.testing.assert_allclose(results["held"], tiny_y(x), rtol=1e-5, atol=1e-5)
    finally:
        client.close()
