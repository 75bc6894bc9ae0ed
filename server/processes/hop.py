"""The hop between a front-end process and the engine: ZeroMQ multipart messages that each carry a group of
requests (or of answers), a msgpack header listing them, then their tensors' bytes: small tensors joined in one
shared frame, each large one a frame of its own (sent from the array's memory and read in place). No JSON, no
pickle. docs/design.md says why ZeroMQ frames and not shared memory; docs/performance.md why groups."""

from __future__ import annotations

import math

import msgpack
import numpy as np
import zmq

from latlab.server.errors import ServingError
from latlab.server.http.fastpath import STATUS

ERRORS = {cls.__name__: cls for cls in STATUS}
"""The serving errors an engine answers with, by name: the front end raises the same kind, so that statuses
and headers (fastpath.error_answer) are those of a one-process server."""
OWN_FRAME_BYTES = 65536
"""A tensor this large travels in a frame of its own (pyzmq sends it without a copy); smaller ones are joined."""
GROUP_CALLS = 256
GROUP_BYTES = 4 << 20
"""A group closes at this many calls, or once its tensors hold this many bytes: messages stay bounded."""
ALIGN = 8
_PAD = bytes(ALIGN)


class Frames:
    """The tensors of one message, laid out as frames: `describe` places arrays and says where they went."""

    __slots__ = ("joined", "joined_bytes", "own", "own_bytes")

    def __init__(self) -> None:
        self.joined: list = []
        self.joined_bytes = 0
        self.own: list = []
        self.own_bytes = 0

    def describe(self, arrays: dict[str, np.ndarray]) -> list:
        """[name, dtype, shape, frame, offset] for each array, placed in this message's frames. An array of Python
        objects (BYTES: bytes, or the str ONNX Runtime returns) travels in its description as a list of its
        elements, each kept bytes or str (msgpack tells them apart), with no bytes in a frame."""
        described = []
        for name, array in arrays.items():
            if array.dtype == object:
                described.append([name, "object", list(array.shape), array.reshape(-1).tolist()])
                continue
            array = np.ascontiguousarray(array)
            size = array.nbytes
            if size >= OWN_FRAME_BYTES:
                self.own.append(memoryview(array.reshape(-1)).cast("B"))
                self.own_bytes += size
                described.append([name, array.dtype.str, list(array.shape), len(self.own), 0])
                continue
            pad = -self.joined_bytes % ALIGN  # every array starts aligned, as numpy's own buffers do
            if pad:
                self.joined.append(_PAD[:pad])
                self.joined_bytes += pad
            described.append([name, array.dtype.str, list(array.shape), 0, self.joined_bytes])
            if size:
                self.joined.append(array)
                self.joined_bytes += size
        return described

    def full(self) -> bool:
        return self.joined_bytes + self.own_bytes >= GROUP_BYTES

    def frames(self) -> list:
        """The message's data frames: the joined one (possibly empty), then each large array's."""
        return [b"".join(self.joined), *self.own]


def tensors_from(described: list, frames: list) -> dict[str, np.ndarray]:
    """The arrays Frames.describe described, read in place from a received message's data frames (read-only)."""
    arrays = {}
    for item in described:
        name, dtype, shape = item[0], item[1], item[2]
        if dtype == "object":
            array = np.empty(len(item[3]), dtype=object)
            array[:] = item[3]
            arrays[name] = array.reshape(shape)
            continue
        frame = frames[item[3]]
        buffer = getattr(frame, "buffer", frame)
        count = math.prod(shape)
        arrays[name] = np.frombuffer(buffer, dtype=dtype, count=count, offset=item[4]).reshape(shape)
    return arrays


def group_message(calls: list[tuple[dict, str, dict | None]], reply: bytes | None = None) -> tuple[list, int]:
    """One message of the calls at the head of `calls`: (header, key, arrays) each, its arrays (None: none)
    described under header[key]; `reply`: the routing id of the socket the answers go to (None: the sender's).
    Returns (frames, calls taken): at most GROUP_CALLS, and no more once their tensors hold GROUP_BYTES, never
    fewer than one."""
    frames = Frames()
    headers = []
    for header, key, arrays in calls:
        if headers and (len(headers) >= GROUP_CALLS or frames.full()):
            break
        if arrays is not None:
            header[key] = frames.describe(arrays)
        headers.append(header)
    group = {"group": headers} if reply is None else {"group": headers, "reply": reply}
    return [pack(group), *frames.frames()], len(headers)


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
