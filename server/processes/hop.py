"""The hop between a front-end process and the engine: ZeroMQ multipart messages that each carry a group of
requests (or of answers), a msgpack header listing them, then their tensors' bytes: small tensors joined in one
shared frame, each large one a frame of its own (sent from the array's memory and read in place). No JSON, no
pickle. docs/design.md says why ZeroMQ frames and not shared memory; docs/performance.md why groups."""

from __future__ import annotations

import math
from typing import Callable

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
Answered = Callable[[dict, list, "BaseException | None"], None]
"""What an asynchronous call is answered with: (header, data frames, None), or ({}, [], the error)."""


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


def stack_key(header: dict, arrays: dict | None) -> tuple | None:
    """What infer calls must share to be stacked: the deployment, the outputs asked for, the inputs known finite,
    and each input's name, dtype and shape past the batch axis; None for a call that is sent alone (one with
    parameters, such as a priority or a time limit, an input of Python objects or without a batch axis, inputs
    that disagree on the batch axis: the engine says what is wrong with it, alone; and one with a tensor of
    OWN_FRAME_BYTES or more, which crosses without a copy in a frame of its own, where stacking would copy it and
    the engine's work per request is small beside its bytes)."""
    if header.get("kind") != "infer" or header.get("parameters") or not arrays:
        return None
    outputs = header.get("outputs")
    key: list = [header["model"], None if outputs is None else tuple(outputs), tuple(header.get("finite") or ())]
    rows = None
    for name, array in arrays.items():
        if array.dtype == object or array.ndim == 0 or rows not in (None, array.shape[0]):
            return None
        if array.nbytes >= OWN_FRAME_BYTES:
            return None
        rows = array.shape[0]
        key.append((name, array.dtype.str, array.shape[1:]))
    return tuple(key)


def stacked(calls: list[tuple[dict, dict | None, Answered]], max_rows: dict[str, int]) -> list[tuple]:
    """The infer calls of one send, those of one stack_key joined into stacks: one call whose inputs are its
    requests' inputs concatenated on the batch axis (at most `max_rows[model]` rows: a batch's bound, so the
    engine queues the stack as one request), its header's "rows" each request's rows, in place of its `answered`
    the list of its requests' (header, answered). The engine queues, runs and answers a stack as one request and
    the client hands each request its rows of the answer (`unstacked`): the per-request work of the engine's loop
    and batcher is done once per stack. Other calls pass unchanged, in order; a stack takes the place of its
    first request."""
    out: list = []
    open_at: dict[tuple, int] = {}
    for header, arrays, answered in calls:
        key = stack_key(header, arrays)
        limit = max_rows.get(header["model"], 0) if key is not None else 0
        rows = _rows(arrays) if key is not None else 0
        at = open_at.get(key)
        if at is not None and out[at][3] + rows <= limit:
            out[at][1].append(arrays)
            out[at][2].append((header, answered))
            out[at][3] += rows
        elif rows < limit:
            open_at[key] = len(out)
            out.append([header, [arrays], [(header, answered)], rows])
        else:
            out.append((header, arrays, answered))
    return [item if isinstance(item, tuple) else _joined(*item[:3]) for item in out]


def _rows(arrays: dict) -> int:
    return next(iter(arrays.values())).shape[0]


def _joined(header: dict, parts: list[dict], members: list[tuple]) -> tuple:
    """One stack's call; a stack of one request is that request's call, unchanged."""
    if len(parts) == 1:
        return header, parts[0], members[0][1]
    arrays = {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
    return {**header, "rows": [_rows(part) for part in parts]}, arrays, members


def unstacked(answer: dict) -> list[dict]:
    """The answers to a stack's requests, in order, each as a lone request's: the stack's error, or its own rows
    of every output, described in place in the same frames (no copy). An output without the stack's rows on its
    first axis reaches each request whole."""
    ids, rows = answer["ids"], answer["rows"]
    if "outputs" not in answer:
        shared = {k: v for k, v in answer.items() if k not in ("ids", "rows")}
        return [{**shared, "id": request_id} for request_id in ids]
    parts: list[dict] = [{"id": request_id, "outputs": []} for request_id in ids]
    total = sum(rows)
    for item in answer["outputs"]:
        name, dtype, shape = item[0], item[1], item[2]
        if not shape or shape[0] != total:
            for part in parts:
                part["outputs"].append(item)
            continue
        per_row, start = math.prod(shape[1:]), 0
        row_bytes = 0 if dtype == "object" else per_row * np.dtype(dtype).itemsize
        for part, count in zip(parts, rows):
            if dtype == "object":
                own = [name, dtype, [count, *shape[1:]], item[3][start * per_row : (start + count) * per_row]]
            else:
                own = [name, dtype, [count, *shape[1:]], item[3], item[4] + start * row_bytes]
            part["outputs"].append(own)
            start += count
    return parts


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
