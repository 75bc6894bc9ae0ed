"""A closed-loop user's requests sent and read from the event loop's own I/O callbacks, one connection per user.

A closed-loop user sends its next request the moment the last answer is read. Through the lean client under
gevent that costs a greenlet switch, a timeout object and a blocking-socket emulation per send and per read, and
Locust's task machinery per request: several times what the request's own bytes cost, on the cores the server
under test needs (docs/measurement.md, "Closed loop against wrk"). Here, as wrk does with epoll, the connection's
socket is non-blocking and gevent's loop calls back when it is readable: the callback reads, parses the answer,
sends the next request at once, and hands the finished one to the user's greenlet, which records it (the
recorder and Locust's statistics, as every request) in batches, off the send path.

Only answers with Content-Length, chunked encoding, or neither (read to close) are read, as the lean client
does; a connection the server closes is reopened by the user's greenlet; an answer slower than the network
timeout fails with status 0, as the lean client's would."""

from __future__ import annotations

import _socket
import socket
import time
from dataclasses import dataclass
from typing import Callable

import gevent
from gevent.event import Event

from latlab.loadtest.lean_http import HttpError

_HEAD_END = b"\r\n\r\n"
_READ = 65536
_READ_EVENT, _WRITE_EVENT = 1, 2


@dataclass
class Finished:
    """One request's send and answer times (time.time()), its status (0: no answer), whether the answer asked to
    retry after a while, its body's length and, without an answer, why."""

    sent: float
    done: float
    status: int
    retry_after: bool
    received: int
    error: str = ""


def parse_answer(buffer: bytes | bytearray) -> tuple[int, bool, int, bool] | None:
    """(status, retry_after, body length, keep-alive) of the complete answer at the start of `buffer`; None while
    it is incomplete. An answer without length or chunks runs to the connection's end: the caller ends it then
    (`at_close`). HttpError where it is not HTTP."""
    end = buffer.find(_HEAD_END)
    if end < 0:
        if len(buffer) > 1 << 20:
            raise HttpError("answer head over 1 MiB")
        return None
    head = bytes(buffer[:end]).lower() + b"\r\n"
    if not head.startswith(b"http/") or not head[9:12].isdigit():
        raise HttpError(f"not an HTTP answer: {head[:80]!r}")
    status = int(head[9:12])
    keep = head.startswith(b"http/1.1") and _header(head, b"connection") != b"close"
    retry_after = _header(head, b"retry-after") is not None
    body = len(buffer) - end - len(_HEAD_END)
    if b"chunked" in (_header(head, b"transfer-encoding") or b""):
        length = _chunked_length(buffer, end + len(_HEAD_END))
        return None if length is None else (status, retry_after, length, keep)
    declared = _header(head, b"content-length")
    if declared is not None:
        length = int(declared)
        return (status, retry_after, length, keep) if body >= length else None
    if status in (204, 304) or status < 200:
        return status, retry_after, 0, keep
    return None


def _header(head: bytes, name: bytes) -> bytes | None:
    """The value of header `name` in a lower-cased head that ends with CRLF; None where it is absent."""
    at = head.find(b"\r\n" + name + b":")
    if at < 0:
        return None
    start = at + len(name) + 3
    return head[start : head.index(b"\r\n", start)].strip()


def _chunked_length(buffer: bytes | bytearray, at: int) -> int | None:
    """The body length of a complete chunked body starting at `at` (trailers included); None while incomplete."""
    length = 0
    while True:
        eol = buffer.find(b"\r\n", at)
        if eol < 0:
            return None
        size = int(bytes(buffer[at:eol]).split(b";")[0], 16)
        at = eol + 2
        if size == 0:
            return length if buffer.find(b"\r\n\r\n", at - 2) >= 0 else None
        if len(buffer) < at + size + 2:
            return None
        length += size
        at += size + 2


def at_close(buffer: bytes | bytearray) -> tuple[int, bool, int, bool] | None:
    """An answer that ran to the connection's end (no length, no chunks): its figures; None without a head, or
    where its head declared a length or chunks (the connection cut it short)."""
    end = buffer.find(_HEAD_END)
    if end < 0 or not bytes(buffer[:5]).lower().startswith(b"http/"):
        return None
    head = bytes(buffer[:end]).decode("latin-1").lower()
    if "\r\ncontent-length:" in head or "\r\ntransfer-encoding:" in head:
        return None  # its framing said more was to come: cut short
    return int(head[9:12]), "\r\nretry-after:" in head, len(buffer) - end - len(_HEAD_END), False


class LoopSender:
    """One connection's closed loop, driven by I/O callbacks (module docstring). `next_request()` gives the raw
    bytes of each request to send; `run(record)` sends until the calling greenlet is killed, handing each finished
    request to `record` in the calling greenlet."""

    def __init__(
        self,
        address: tuple[str, int],
        next_request: Callable[[], bytes],
        timeout_s: float = 30.0,
        connect_timeout_s: float = 5.0,
    ) -> None:
        self.address = address
        self.next_request = next_request
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.finished: list[Finished] = []
        self._wake = Event()
        self._sock: _socket.socket | None = None
        self._reader = self._writer = None
        self._buffer = bytearray()
        self._pending = b""
        self._sent = 0.0
        self._broken = ""

    def run(self, record: Callable[[list[Finished], float | None], None]) -> None:
        """Connect, send, and hand what finishes to `record` with the send time of the request now in flight (None
        while none is), until killed; the request in flight then ends as status 0."""
        watchdog = gevent.get_hub().loop.timer(self.timeout_s, self.timeout_s)
        watchdog.start(self._wake.set)  # one timer for the connection's life: no timeout object per wait
        try:
            while True:
                if self._sock is None:
                    self._open()
                    self._flush(record)
                self._wake.wait()
                self._wake.clear()
                if self._sock is not None and not self.finished and time.time() - self._sent > self.timeout_s:
                    self._fail("timeout")
                self._flush(record)
                if self._broken:
                    self._close()
        finally:
            watchdog.stop()
            watchdog.close()
            if self._sock is not None and not self._broken:
                self.finished.append(Finished(self._sent, time.time(), 0, False, 0))
            self._close()
            self._flush(record)

    def _flush(self, record: Callable[[list[Finished], float | None], None]) -> None:
        done, self.finished = self.finished, []
        record(done, self._sent if self._sock is not None and not self._broken else None)

    def _open(self) -> None:
        """A new connection (connected as a green socket, then driven raw); a refused one ends as status 0."""
        self._broken = ""
        try:
            green = socket.create_connection(self.address, timeout=self.connect_timeout_s)
        except OSError as exc:
            now = time.time()
            self.finished.append(Finished(now, now, 0, False, 0, type(exc).__name__))
            self._wake.set()
            gevent.sleep(0.01)  # a refused server is not retried in a hot loop
            return
        green.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = _socket.socket(fileno=green.detach())
        self._sock.setblocking(False)
        loop = gevent.get_hub().loop
        self._reader = loop.io(self._sock.fileno(), _READ_EVENT)
        self._writer = loop.io(self._sock.fileno(), _WRITE_EVENT)
        self._reader.start(self._readable)
        self._send_next()

    def _close(self) -> None:
        for watcher in (self._reader, self._writer):
            if watcher is not None:
                watcher.stop()
                watcher.close()
        self._reader = self._writer = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._buffer.clear()
        self._pending = b""

    def _send_next(self) -> None:
        self._sent = time.time()
        self._pending = self.next_request()
        self._writable()

    def _writable(self) -> None:
        try:
            while self._pending:
                sent = self._sock.send(self._pending)
                self._pending = self._pending[sent:]
        except BlockingIOError:
            self._writer.start(self._writable)
            return
        except OSError as exc:
            self._fail(type(exc).__name__)
            return
        self._writer.stop()

    def _readable(self) -> None:
        try:
            chunk = self._sock.recv(_READ)
        except BlockingIOError:
            return
        except OSError as exc:
            self._fail(type(exc).__name__)
            return
        try:
            if not chunk:
                found = at_close(self._buffer)
                if found is None:
                    raise HttpError("connection closed before the answer ended")
                self._finish(found)
                return
            self._buffer += chunk
            found = parse_answer(self._buffer)
        except (HttpError, ValueError) as exc:
            self._fail(type(exc).__name__)
            return
        if found is not None:
            self._finish(found)

    def _finish(self, found: tuple[int, bool, int, bool]) -> None:
        status, retry_after, received, keep = found
        self.finished.append(Finished(self._sent, time.time(), status, retry_after, received))
        self._buffer.clear()
        self._wake.set()
        if keep:
            self._send_next()
        else:
            self._broken = "closed"
            self._reader.stop()

    def _fail(self, why: str) -> None:
        self.finished.append(Finished(self._sent, time.time(), 0, False, 0, why))
        self._broken = why
        if self._reader is not None:
            self._reader.stop()
        if self._writer is not None:
            self._writer.stop()
        self._wake.set()
