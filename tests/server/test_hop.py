"""latlab.server.processes.hop: multipart messages sent and received frame by frame, whole and kept apart."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pytest
import zmq

from latlab.server.processes.hop import Frames, pack, recv_frames, send_frames, tensors_from, unpack


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    context = zmq.Context()
    a, b = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    a.bind("inproc://hop-test")
    b.connect("inproc://hop-test")
    yield a, b
    context.destroy(0)


def test_messages_arrive_whole_and_apart(pair) -> None:
    a, b = pair
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    frames = Frames()
    described = frames.describe({"x": x, "empty": np.zeros((0, 4), np.int64)})
    send_frames(a, [pack({"id": 1, "inputs": described}), *frames.frames()])
    send_frames(a, [pack({"id": 2})])
    send_frames(a, [b"one", b"", b"three"])
    first = recv_frames(b)
    header = unpack(first[0])
    arrays = tensors_from(header["inputs"], first[1:])
    assert header["id"] == 1 and len(first) == 2  # small tensors share one frame
    np.testing.assert_array_equal(arrays["x"], x)
    assert arrays["empty"].shape == (0, 4)
    assert [unpack(f) for f in recv_frames(b)] == [{"id": 2}]
    assert [f.bytes for f in recv_frames(b)] == [b"one", b"", b"three"]


def test_a_refused_send_sends_nothing(pair) -> None:
    """NOBLOCK with nobody to take it: zmq.Again before the first frame, so no half message reaches anyone."""
    context = zmq.Context()
    try:
        lonely = context.socket(zmq.DEALER)
        lonely.setsockopt(zmq.IMMEDIATE, 1)
        lonely.connect("ipc:///nonexistent/hop-test")
        with pytest.raises(zmq.Again):
            send_frames(lonely, [b"header", b"frame"], zmq.NOBLOCK)
    finally:
        context.destroy(0)
    a, b = pair
    send_frames(a, [b"next"])
    assert [f.bytes for f in recv_frames(b)] == [b"next"]


def test_a_receive_with_a_timeout_raises_again_then_reads_the_next_message(pair) -> None:
    a, b = pair
    b.setsockopt(zmq.RCVTIMEO, 1)
    with pytest.raises(zmq.Again):
        recv_frames(b)
    send_frames(a, [b"late", b"answer"])
    assert [f.bytes for f in recv_frames(b)] == [b"late", b"answer"]
