"""The hop between a front-end process and the engine: one ZeroMQ multipart message each way, a msgpack header
then every tensor's bytes as a frame of its own (no JSON, no pickle; a frame past pyzmq's copy threshold is
sent from the array's memory and received as a buffer numpy reads in place). docs/design.md says why ZeroMQ
frames and not shared memory, with the figures of benchmarks/frontend_hop.py."""

from __future__ import annotations

import msgpack
import numpy as np
import zmq

from latlab.server.errors import ServingError
from latlab.server.http.fastpath import STATUS

ERRORS = {cls.__name__: cls for cls in STATUS}
"""The serving errors an engine answers with, by name: the front end raises the same kind, so that statuses
and headers (fastpath.error_answer) are those of a one-process server."""


def tensor_frames(arrays: dict[str, np.ndarray]) -> tuple[list, list]:
    """(descriptions, frames) of named arrays: [name, dtype, shape] each, and their bytes in that order. An array
    of Python objects (BYTES: bytes, or the str ONNX Runtime returns) travels in its description as a list of
    its elements, each kept bytes or str (msgpack tells them apart), with no frame."""
    described, frames = [], []
    for name, array in arrays.items():
        if array.dtype == object:
            described.append([name, "object", list(array.shape), array.reshape(-1).tolist()])
            continue
        array = np.ascontiguousarray(array)
        described.append([name, array.dtype.str, list(array.shape)])
        frames.append(memoryview(array).cast("B") if array.size else b"")
    return described, frames


def tensors_from(described: list, frames: list) -> dict[str, np.ndarray]:
    """The arrays tensor_frames described, read in place from the received frames (read-only views)."""
    arrays, next_frame = {}, iter(frames)
    for item in described:
        name, dtype, shape = item[0], item[1], item[2]
        if dtype == "object":
            array = np.empty(len(item[3]), dtype=object)
            array[:] = item[3]
            arrays[name] = array.reshape(shape)
            continue
        frame = next(next_frame)
        buffer = getattr(frame, "buffer", frame)
        arrays[name] = np.frombuffer(buffer, dtype=np.dtype(dtype)).reshape(shape)
    return arrays


SNDMORE = int(zmq.SNDMORE)
"""As a plain int: pyzmq's send_multipart ORs its enum flag into every frame's flags, which costs more than the
send (enum arithmetic builds a new member each time)."""


def send_frames(sock: zmq.Socket, frames: list, flags: int = 0) -> None:
    """Send one multipart message (zero-copy frames), as send_multipart does without its per-frame enum work; a
    zmq.Again from `flags` NOBLOCK comes before the first frame leaves, so a message goes whole or not at all."""
    last = len(frames) - 1
    for index, frame in enumerate(frames):
        sock.send(frame, flags if index == last else flags | SNDMORE, copy=False)


def recv_frames(sock: zmq.Socket, flags: int = 0) -> list[zmq.Frame]:
    """Receive one multipart message as zmq.Frames (read in place), asking each frame whether more follow instead
    of the socket option recv_multipart reads through pyzmq's enums."""
    frames = [sock.recv(flags, copy=False)]
    while frames[-1].more:
        frames.append(sock.recv(flags, copy=False))
    return frames


def pack(header: dict) -> bytes:
    return msgpack.packb(header, use_bin_type=True)


def unpack(frame) -> dict:
    return msgpack.unpackb(getattr(frame, "bytes", frame), raw=False)


def error_header(request_id: int, exc: BaseException) -> dict:
    """The answer to a request that failed: a serving error's kind and message (any other error: a bare
    internal one, its trace in the engine's log)."""
    if isinstance(exc, ServingError) and type(exc).__name__ in ERRORS:
        return {"id": request_id, "error": type(exc).__name__, "message": str(exc)}
    return {"id": request_id, "error": "", "message": "internal server error"}


def raise_error(header: dict) -> None:
    """Raise the error an engine's answer carries, as the engine raised it."""
    kind = ERRORS.get(header["error"])
    if kind is None:
        raise RuntimeError(header["message"])
    raise kind(header["message"])
