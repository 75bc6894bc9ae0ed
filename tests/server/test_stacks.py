"""Stacks across the hop (hop.stacked, hop.unstacked): a native front end joins a take's requests of one deployment
and shape into one call, which the engine queues, runs and answers as one request, and each request gets its own
rows of the answer, its own error, or its own refusal; against a real engine process where the engine decides."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import zmq

from latlab.server.processes.client import EngineClient
from latlab.server.processes.hop import (
    OWN_FRAME_BYTES,
    group_message,
    recv_frames,
    send_frames,
    stacked,
    tensors_from,
    unpack,
    unstacked,
)
from latlab.server.processes.shared import endpoint
from tests.server.test_hop_groups import engine, infer_call, tiny_y  # noqa: F401 - the module's engine fixture

ROWS = {"tiny": 8, "tight": 8}


def call(x: np.ndarray, model: str = "tiny", **changed) -> tuple[dict, dict, object]:
    return {**infer_call(x, model), **changed}, {"x": x}, object()


def xs(*rows: int) -> list[np.ndarray]:
    return [np.full((n, 4), i, np.float32) for i, n in enumerate(rows)]


def test_requests_of_one_deployment_and_shape_are_stacked_in_order() -> None:
    a, b, c, d, e = xs(1, 2, 1, 1, 1)
    calls = [call(a), call(b), call(c, parameters={"priority": 1}), call(d, model="other"), call(e)]
    out = stacked(calls, {**ROWS, "other": 8})
    assert len(out) == 3
    header, arrays, members = out[0]
    assert header["rows"] == [1, 2, 1] and header["model"] == "tiny"
    np.testing.assert_array_equal(arrays["x"], np.concatenate([a, b, e]))
    assert [m for m in members] == [(calls[i][0], calls[i][2]) for i in (0, 1, 4)]
    assert out[1] == calls[2]  # parameters (a priority, a time limit): sent alone
    assert out[2] == calls[3]  # the only one of its deployment: unchanged, not a stack of one


def test_a_stack_holds_at_most_a_batch() -> None:
    ones = [call(x) for x in xs(1, 1, 1, 1, 1, 1)]
    assert [len(item[2]) for item in stacked(ones, {"tiny": 4})] == [4, 2]
    assert stacked(ones, {"tiny": 1}) == ones  # batching off: nothing stacks
    whole = [call(np.ones((4, 4), np.float32)), call(np.ones((1, 4), np.float32))]
    assert stacked(whole, {"tiny": 4}) == whole  # a request of a whole batch stacks with none


def test_requests_that_cannot_share_a_tensor_are_not_stacked() -> None:
    one = np.ones((1, 4), np.float32)
    calls = [
        call(one),
        call(np.ones((1, 5), np.float32)),  # another trailing shape
        call(one.astype(np.float64)),  # another dtype
        call(one, outputs=["y"]),  # other outputs asked for
        call(one, finite=["x"]),  # known finite: the engine does not look again
        (infer_call(one), {"x": np.array([b"a"], dtype=object)}, object()),  # Python objects
        (infer_call(one), {"x": np.float32(1.0) * np.ones((), np.float32)}, object()),  # no batch axis
        (infer_call(one), {"x": one, "m": np.ones((2, 4), np.float32)}, object()),  # inputs disagree on rows
        call(np.ones((1, OWN_FRAME_BYTES // 4), np.float32)),  # large: crosses in its own frame, never copied
        call(np.ones((1, OWN_FRAME_BYTES // 4), np.float32)),
    ]
    assert stacked(calls, ROWS) == calls


def described_answer(header: dict, arrays: dict) -> tuple[dict, list]:
    frames, _ = group_message([(header, "outputs", arrays)])
    return unpack(frames[0])["group"][0], frames[1:]


def test_each_request_reads_its_own_rows_of_a_stack_answer_in_place() -> None:
    y = np.arange(4 * 3, dtype=np.float32).reshape(4, 3)
    big = np.arange(4 * 5000, dtype=np.float64).reshape(4, 5000)  # a frame of its own
    names = np.array([b"a", b"b", b"c", b"d"], dtype=object)
    scale = np.array(2.5, np.float32)  # no rows of the stack: every request gets it whole
    answer, frames = described_answer(
        {"ids": [7, 8, 9], "rows": [1, 2, 1]}, {"y": y, "big": big, "names": names, "scale": scale}
    )
    parts = unstacked(answer)
    assert [part["id"] for part in parts] == [7, 8, 9]
    for part, rows in zip(parts, (slice(0, 1), slice(1, 3), slice(3, 4))):
        got = tensors_from(part["outputs"], frames)
        np.testing.assert_array_equal(got["y"], y[rows])
        np.testing.assert_array_equal(got["big"], big[rows])
        assert got["names"].tolist() == names[rows].tolist()
        assert got["scale"] == scale


def test_a_stack_error_is_each_requests_error() -> None:
    parts = unstacked({"ids": [1, 2], "rows": [1, 3], "error": "QueueFull", "message": "queue is full"})
    assert parts == [{"id": i, "error": "QueueFull", "message": "queue is full"} for i in (1, 2)]


def stack_of(xs_: list[np.ndarray], model: str = "tiny", ids: list[int] | None = None) -> tuple[dict, str, dict]:
    ids = ids or list(range(1, len(xs_) + 1))
    header = {**infer_call(xs_[0], model), "ids": ids, "rows": [len(x) for x in xs_]}
    return header, "inputs", {"x": np.concatenate(xs_)}


def raw_answers(run_dir: Path, calls: list[tuple[dict, str, dict]], expected: int) -> dict[int, tuple[dict, list]]:
    """Send `calls` to the engine in one message; every request's answer by id (a stack's answer taken apart)."""
    context = zmq.Context()
    try:
        sock = context.socket(zmq.DEALER)
        sock.connect(endpoint(run_dir))
        frames, taken = group_message(calls)
        assert taken == len(calls)
        send_frames(sock, frames)
        answers: dict[int, tuple[dict, list]] = {}
        while len(answers) < expected:
            assert sock.poll(30000), f"{len(answers)} answers of {expected}"
            message = recv_frames(sock)
            for answer in unpack(message[0])["group"]:
                for part in unstacked(answer) if "ids" in answer else [answer]:
                    answers[part["id"]] = (part, message[1:])
        return answers
    finally:
        context.destroy(0)


def test_the_engine_answers_a_stack_request_by_request(engine) -> None:  # noqa: F811 - the fixture
    run_dir, _ = engine
    rng = np.random.default_rng(3)
    parts = [rng.standard_normal((n, 4)).astype(np.float32) for n in (1, 3, 2)]
    answers = raw_answers(run_dir, [stack_of(parts)], 3)
    for request_id, x in zip((1, 2, 3), parts):
        answer, frames = answers[request_id]
        np.testing.assert_allclose(tensors_from(answer["outputs"], frames)["y"], tiny_y(x), rtol=1e-5, atol=1e-5)


def test_a_bad_request_in_a_stack_fails_alone(engine) -> None:  # noqa: F811 - the fixture
    """The model refuses the stack (one request holds a NaN): the engine takes it apart, and the bad request gets
    the one-process server's error while the others are answered."""
    run_dir, _ = engine
    good = np.ones((1, 4), np.float32)
    bad = np.array([[1.0, np.nan, 0.0, 0.0]], np.float32)
    answers = raw_answers(run_dir, [stack_of([good, bad, 2 * good])], 3)
    assert answers[2][0]["error"] == "BadRequest" and "NaN" in answers[2][0]["message"]
    for request_id, x in ((1, good), (3, 2 * good)):
        answer, frames = answers[request_id]
        np.testing.assert_allclose(tensors_from(answer["outputs"], frames)["y"], tiny_y(x), rtol=1e-5, atol=1e-5)


def test_a_stack_the_queue_cannot_hold_whole_is_queued_request_by_request(engine) -> None:  # noqa: F811
    """tight holds 2 requests waiting (its batch of 8 not full): of a stack of 5, the first 2 get in and are
    answered, the other 3 are refused, each on its own, as 5 requests sent one by one would be."""
    run_dir, _ = engine
    parts = xs(1, 1, 1, 1, 1)
    answers = raw_answers(run_dir, [stack_of(parts, model="tight")], 5)
    assert [answers[i][0].get("error") for i in range(1, 6)] == [None, None, "QueueFull", "QueueFull", "QueueFull"]
    for request_id in (1, 2):
        answer, frames = answers[request_id]
        x = parts[request_id - 1]
        np.testing.assert_allclose(tensors_from(answer["outputs"], frames)["y"], tiny_y(x), rtol=1e-5, atol=1e-5)


def test_a_client_waits_on_a_stack_as_its_requests(engine) -> None:  # noqa: F811 - the fixture
    """EngineClient.send_many with a stack: each request gets an id of its own, its own answer, and one forgotten
    (its caller's time ran out) is never answered while the others are."""
    run_dir, status = engine
    client = EngineClient(run_dir, status)
    got: dict[int, np.ndarray] = {}
    done = threading.Event()
    parts = [np.full((n, 4), n, np.float32) for n in (2, 1, 3)]

    def answered(index: int):
        def deliver(answer: dict, frames: list, error: BaseException | None) -> None:
            assert error is None, error
            got[index] = tensors_from(answer["outputs"], frames)["y"]
            if index == 2:  # the last part: a stack's parts are handed over in order, from one message
                done.set()

        return deliver

    calls = [(infer_call(x), {"x": x}, answered(i)) for i, x in enumerate(parts)]
    items = stacked(calls, ROWS)
    assert len(items) == 1
    try:
        client.send_many(items)  # held until the engine answers the client's hello
        ids = [header["id"] for header, _, _ in calls]
        assert len(set(ids)) == 3
        assert client.forget(ids[1])
        assert done.wait(30)
    finally:
        client.close()
    assert sorted(got) == [0, 2]
    for index in (0, 2):
        np.testing.assert_allclose(got[index], tiny_y(parts[index]), rtol=1e-5, atol=1e-5)
