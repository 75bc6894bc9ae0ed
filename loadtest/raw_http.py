"""HTTP/1.1 exchanges driven by the event loop's own I/O callbacks: a non-blocking keep-alive socket sends a
request and reads its answer when gevent's loop says it is readable, with no greenlet switch, timeout object or
blocking-socket emulation per request (what the lean client pays under gevent: lean_http.py). The load
generator's closed-loop and open-loop senders (loop_sender.py, open_sender.py) drive their connections with it.

Only what a load generator needs of an answer is read: its status, whether it asks to retry after a while, its
body's length and whether the connection stays open. Answers may carry Content-Length, chunked encoding, or
neither (read to close), as the lean client reads them."""

from __future__ import annotations

import _socket
import re
import socket
from typing import Callable, NamedTuple

import gevent

from latlab.loadtest.lean_http import HttpError

_HEAD_END = b"\r\n\r\n"
_RARE_HEADERS = re.compile(rb"\r\n(?:connection|retry-after|transfer-encoding):")
_CONTENT_LENGTH = b"\r\ncontent-length:"
_READ = 65536
_READ_EVENT, _WRITE_EVENT = 1, 2


class Finished(NamedTuple):
    """One request's send and answer times (time.time()), its status (0: no answer), whether the answer asked to
    retry after a while, its body's length and, without an answer, why. A tuple, so that a batch of them turns
    into columns with `zip(*batch)`."""

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
    head = buffer[: end + 2].lower()  # ends with CRLF, as every header line does
    code = head[9:12]
    if head[:5] != b"http/" or not code.isdigit():
        raise HttpError(f"not an HTTP answer: {bytes(head[:80])!r}")
    status = int(code)
    keep, retry_after = head.startswith(b"http/1.1"), False
    body = len(buffer) - end - len(_HEAD_END)
    # This runs per answer: the headers an answer seldom has are looked for in one scan, and `bytes.find`, never
    # `in` (which tries its operand as an integer first, and formats and clears a TypeError every time).
    if _RARE_HEADERS.search(head) is not None:
        keep = keep and _header(head, b"connection") != b"close"
        retry_after = _header(head, b"retry-after") is not None
        if (_header(head, b"transfer-encoding") or b"").find(b"chunked") >= 0:
            length = _chunked_length(buffer, end + len(_HEAD_END))
            return None if length is None else (status, retry_after, length, keep)
    at = head.find(_CONTENT_LENGTH)
    if at >= 0:
        at += len(_CONTENT_LENGTH)
        length = int(head[at : head.index(b"\r\n", at)])
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


class RawConnection:
    """One connected keep-alive socket: `exchange(raw, answered)` sends a request and calls
    `answered(connection, found, error)` from the event loop once its answer is read (`found`: parse_answer's
    figures) or it failed (`found` None, `error` the failure's name). Between exchanges it notices the server
    closing it (`closed`)."""

    def __init__(self, sock: _socket.socket) -> None:
        self.sock = sock
        sock.setblocking(False)
        loop = gevent.get_hub().loop
        self._reader = loop.io(sock.fileno(), _READ_EVENT)
        self._writer = loop.io(sock.fileno(), _WRITE_EVENT)
        self._buffer = bytearray()
        self._pending = b""
        self._answered: Callable[[RawConnection, tuple | None, str], None] | None = None
        self.closed = False
        self.got_bytes = False
        """Whether the last exchange received any byte of its answer (a kept-alive connection the server closed
        meanwhile fails before any: the request can go again on a new one)."""
        self._before_length, self._after_length, self._length_at = b"\x00", b"", 0
        self._last_found: tuple = ()
        """The last answer read in one piece with a Content-Length, around that header's value: its bytes before
        the value (`_length_at` of them) and its head's after it, and its figures. A server's answers to one route
        mostly differ in their lengths and bodies alone (and the Date header each second), so an answer whose
        head is the last one's but for the length is not parsed again: that one number is read."""
        self._reader.start(self._readable)

    @classmethod
    def open(cls, address: tuple[str, int], timeout_s: float) -> RawConnection:
        """Connect (as a green socket, so the calling greenlet waits, not the loop); OSError where it cannot."""
        green = socket.create_connection(address, timeout=timeout_s)
        green.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(_socket.socket(fileno=green.detach()))

    def exchange(self, raw: bytes, answered: Callable[[RawConnection, tuple | None, str], None]) -> None:
        self._answered, self.got_bytes = answered, False
        if self._buffer:
            self._buffer.clear()
        try:
            sent = self.sock.send(raw)  # a request mostly leaves in one send: the write watcher waits for the rest
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._end(None, type(exc).__name__)
            return
        if sent < len(raw):
            self._pending = raw[sent:]
            self._writable()

    def close(self) -> None:
        """Stop watching and close the socket (once; again does nothing)."""
        self.closed = True
        if self.sock.fileno() < 0:
            return
        for watcher in (self._reader, self._writer):
            watcher.stop()
            watcher.close()
        self.sock.close()

    def _writable(self) -> None:
        try:
            while self._pending:
                self._pending = self._pending[self.sock.send(self._pending) :]
        except BlockingIOError:
            self._writer.start(self._writable)
            return
        except OSError as exc:
            self._end(None, type(exc).__name__)
            return
        self._writer.stop()

    def _readable(self) -> None:
        try:
            chunk = self.sock.recv(_READ)
        except BlockingIOError:
            return
        except OSError as exc:
            self._end(None, type(exc).__name__)
            return
        if self._answered is None:  # between exchanges: the server closed it, or spoke out of turn
            self.closed = True
            self._reader.stop()
            return
        try:
            if not chunk:
                found = at_close(self._buffer)
                if found is None:
                    raise HttpError("connection closed before the answer ended")
            elif self._buffer:
                self._buffer += chunk
                found = parse_answer(self._buffer)
            elif (
                chunk.startswith(self._before_length)
                and chunk.startswith(self._after_length, eol := chunk.find(b"\r\n", self._length_at))
                and len(chunk) == eol + len(self._after_length) + (length := int(chunk[self._length_at : eol]))
            ):  # the last answer's head but for its length, and whole: its figures, with this length
                self.got_bytes = True
                found = (self._last_found[0], self._last_found[1], length, self._last_found[3])
            else:  # most answers come in one read: parsed where they lie, copied only when incomplete
                self.got_bytes = True
                found = parse_answer(chunk)
                if found is None:
                    self._buffer += chunk
                else:
                    self._remember(chunk, found)
        except (HttpError, ValueError) as exc:
            self._end(None, type(exc).__name__)
            return
        if found is not None:
            self._end(found, "")

    def _remember(self, chunk: bytes, found: tuple) -> None:
        """Keep `chunk`'s head around its Content-Length value for the next answer (see __init__) where `chunk` is
        exactly one answer framed by one Content-Length: its head, then a body of the length the head declares."""
        end = chunk.find(_HEAD_END) + len(_HEAD_END)
        head = chunk[:end].lower()
        at = head.find(_CONTENT_LENGTH) + len(_CONTENT_LENGTH)
        if (
            len(chunk) != end + found[2]
            or at < len(_CONTENT_LENGTH)
            or head.find(_CONTENT_LENGTH, at) >= 0
            or head.find(b"\r\ntransfer-encoding:") >= 0
        ):
            return
        eol = chunk.find(b"\r\n", at)
        self._before_length, self._after_length, self._length_at = chunk[:at], chunk[eol:end], at
        self._last_found = found

    def _end(self, found: tuple | None, error: str) -> None:
        answered, self._answered = self._answered, None
        if found is None or not found[3]:
            self.closed = True
            self._reader.stop()
            self._writer.stop()
        if answered is not None:
            answered(self, found, error)
