"""The closed loop's connections driven by native code (closed_loop.c): one thread per process reads every
answer and sends the next request with no Python between them, as wrk does; the users' greenlets only hand what
finished to the recorder and Locust's statistics, a few times a second.

The Python loop sender (loop_sender.py) costs a request about twice wrk's CPU on the same server, most of it the
interpreter's work per answer, on the cores the server under test needs (docs/measurement.md, "Closed loop against
wrk"). The C source ships with latlab and is built on first use with the system's C compiler (`cc`), once per
source version, into latlab's cache folder; where it cannot be built, `library()` says why and the closed loop
runs on the Python loop sender. `NativeSender` has LoopSender's interface: `run(record)`, `collect()`."""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from pathlib import Path

import gevent
import numpy as np
from gevent.event import Event

from latlab.common.native_build import build
from latlab.loadtest.raw_http import Finished
from latlab.loadtest.loop_sender import RECORD_EVERY_S, Record

SOURCE = Path(__file__).with_name("closed_loop.c")
CLOSED_LOOP_ENV = "LATLAB_CLOSED_LOOP"
"""Which sender drives a closed-loop user's connection: 'native' (the default where it builds), 'python' (the
event loop's callbacks: loop_sender.py) or 'greenlet' (the user's greenlet, as Locust's task would)."""
RECORD = np.dtype(
    [
        ("sent", "f8"),
        ("done", "f8"),
        ("status", "i4"),
        ("retry_after", "i4"),
        ("received", "i8"),
        ("error", "i4"),
        ("padding", "i4"),
    ]
)
"""closed_loop.c's ll_record."""
ERROR_NAMES = {-1: "HttpError", -2: "HttpError"}
"""closed_loop.c's own error codes (an answer that is not HTTP; a connection closed before its answer ended), named
as the Python senders name them; other codes are errno values, named as Python's OSError subclass for them."""
RUNNING = 0
"""closed_loop.c's state of a connection still watched (the others: closed by the server, failed)."""
TAKE_AT_ONCE = 4096

_new_tuple = tuple.__new__  # a Finished without NamedTuple's Python-level __new__, as loop_sender.py makes them
_lock = threading.Lock()
_built: tuple[ctypes.CDLL | None, str] | None = None
_driver: int | None = None
_waiting: set[Event] = set()
"""The running senders' wake-ups, all set when a connection stops (closed_loop.c's ll_notify_fd)."""
_watcher = None


def library() -> tuple[ctypes.CDLL | None, str]:
    """The built closed loop, and "" ; or None and why it could not be built (once per process)."""
    global _built
    with _lock:
        if _built is None:
            try:
                _built = _build()
            except OSError as exc:  # the cache folder cannot be written, the source cannot be read
                _built = None, f"{type(exc).__name__}: {exc}"
            if _built[0] is None:
                logging.getLogger(__name__).warning(
                    "the native closed loop is not built (%s): the Python loop sender runs", _built[1]
                )
        return _built


def _build() -> tuple[ctypes.CDLL | None, str]:
    lib, why = build(SOURCE)
    if lib is None:
        return None, why
    lib.ll_new.restype = ctypes.c_void_p
    lib.ll_add.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * 2
    lib.ll_add.restype = ctypes.c_int
    lib.ll_take.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.POINTER(ctypes.c_double),
        ctypes.POINTER(ctypes.c_int),
    ]
    lib.ll_take.restype = ctypes.c_int64
    lib.ll_notify_fd.argtypes = [ctypes.c_void_p]
    lib.ll_notify_fd.restype = ctypes.c_int
    lib.ll_drop.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.ll_drop.restype = ctypes.c_int64
    lib.ll_free.argtypes = [ctypes.c_void_p]
    return lib, ""


def closed_sender(lean: bool, sizes_vary: bool) -> str:
    """The sender a closed-loop user runs ("native", "python" or "greenlet"), as users.ClosedLoopUser chooses it:
    the native one unless asked otherwise, where it builds and the user's requests are a fixed cycle (sizes drawn
    per request are the Python sender's); the greenlet where the lean client cannot reach the host."""
    how = os.environ.get(CLOSED_LOOP_ENV, "native")
    if not lean or how == "greenlet":
        return "greenlet"
    return "native" if how == "native" and not sizes_vary and library()[0] is not None else "python"


def driver(lib: ctypes.CDLL) -> int:
    """The process's one driver thread (started on first use; it lives as long as the process), its stopped
    connections watched from this thread's event loop."""
    global _driver, _watcher
    with _lock:
        if _driver is None:
            _driver = lib.ll_new()
            if not _driver:
                raise OSError("the native closed loop could not start its thread")
        if _watcher is None:
            notify = lib.ll_notify_fd(_driver)
            _watcher = gevent.get_hub().loop.io(notify, 1)
            _watcher.ref = False  # it alone never keeps the event loop running
            _watcher.start(_stopped, notify)
        return _driver


def _stopped(notify: int) -> None:
    """A connection stopped: every running sender looks at its own (a stop is rare; a look is cheap)."""
    try:
        os.read(notify, 8)
    except BlockingIOError:
        return
    for wake in _waiting:
        wake.set()


def error_name(code: int) -> str:
    if code in ERROR_NAMES:
        return ERROR_NAMES[code]
    return type(OSError(code, "")).__name__


class NativeSender:
    """One connection's closed loop, driven by the process's native thread (module docstring). `requests` is the
    cycle of raw requests to send in turn; `run(record)` sends until the calling greenlet is killed, handing each
    finished request to `record` with the send time of the one in flight; `collect()` hands them at once."""

    def __init__(
        self,
        lib: ctypes.CDLL,
        address: tuple[str, int],
        requests: list[bytes],
        timeout_s: float = 30.0,
        connect_timeout_s: float = 5.0,
        record_every_s: float = RECORD_EVERY_S,
    ) -> None:
        self.lib = lib
        self.driver = driver(lib)
        self.address = address
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.record_every_s = record_every_s
        self._requests = list(requests)  # kept alive here: the native side holds pointers into them
        self._pointers = (ctypes.c_char_p * len(self._requests))(*self._requests)
        self._lengths = (ctypes.c_int64 * len(self._requests))(*(len(raw) for raw in self._requests))
        self._out = np.zeros(TAKE_AT_ONCE, RECORD)
        self._out_at = self._out.ctypes.data
        self._sent = ctypes.c_double()
        self._state = ctypes.c_int()
        self._slot: int | None = None
        self._next = 0
        """The request a new connection sends first: the cycle goes on where the last connection left it."""
        self._record: Record | None = None
        self._wake = Event()
        self.finished: list[Finished] = []

    def run(self, record: Record) -> None:
        """Connect, send, and hand what finishes to `record`, until killed; the request in flight then ends as
        status 0, as LoopSender's does."""
        self._record = record
        _waiting.add(self._wake)
        ticker = gevent.get_hub().loop.timer(self.record_every_s, self.record_every_s)
        ticker.start(self._wake.set)  # one timer for the connection's life: no timeout object per wait
        try:
            while True:
                if self._slot is None:
                    self._open()
                    self.collect()
                    if self._slot is None:
                        continue
                self._wake.wait()
                self._wake.clear()
                flying = self._take()
                if self._state.value != RUNNING:
                    self._drop()
                elif flying is not None and time.time() - flying > self.timeout_s:
                    self._drop()
                    self.finished.append(Finished(flying, time.time(), 0, False, 0, "timeout"))
                self._hand_on(self._flying_now())
        finally:
            ticker.stop()
            ticker.close()
            _waiting.discard(self._wake)
            flying = self._take()
            self._drop()
            if flying is not None:
                self.finished.append(Finished(flying, time.time(), 0, False, 0))
            self._hand_on(None)
            self._record = None

    def collect(self) -> None:
        """Hand the requests finished since the last call to `record` (nothing before `run`, or after it ended)."""
        if self._record is not None:
            self._hand_on(self._take())

    def _hand_on(self, flying: float | None) -> None:
        if self._record is not None:
            done, self.finished = self.finished, []
            self._record(done, flying)

    def _flying_now(self) -> float | None:
        return self._sent.value or None if self._slot is not None and self._state.value == RUNNING else None

    def _take(self) -> float | None:
        """Move what the native side finished into `finished`; the send time of the request in flight, if any."""
        if self._slot is None:
            return None
        while True:
            n = self.lib.ll_take(self.driver, self._slot, self._out_at, TAKE_AT_ONCE, self._sent, self._state)
            if n:
                self.finished += [
                    _new_tuple(Finished, (s, d, st, ra != 0, rc, error_name(e) if e else ""))
                    for s, d, st, ra, rc, e, _ in self._out[:n].tolist()
                ]
            if n < TAKE_AT_ONCE:
                return self._flying_now()

    def _open(self) -> None:
        """A new connection; a refused one ends as status 0."""
        from gevent import socket as green

        try:
            sock = green.create_connection(self.address, timeout=self.connect_timeout_s)
            sock.setsockopt(green.IPPROTO_TCP, green.TCP_NODELAY, 1)
            sock.setblocking(False)
        except OSError as exc:
            now = time.time()
            self.finished.append(Finished(now, now, 0, False, 0, type(exc).__name__))
            gevent.sleep(0.01)  # a refused server is not retried in a hot loop
            return
        fd = sock.detach()
        os.set_blocking(fd, False)
        slot = self.lib.ll_add(self.driver, fd, self._pointers, self._lengths, len(self._requests), self._next)
        if slot < 0:
            os.close(fd)
            raise MemoryError("the native closed loop has no memory for another connection")
        self._slot = slot

    def _drop(self) -> None:
        if self._slot is not None:
            self._next = self.lib.ll_drop(self.driver, self._slot)
            self._slot = None
