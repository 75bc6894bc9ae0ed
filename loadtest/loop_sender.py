"""A closed-loop user's requests sent and read from the event loop's own I/O callbacks, one connection per user.

A closed-loop user sends its next request the moment the last answer is read. Through the lean client under
gevent that costs a greenlet switch, a timeout object and a blocking-socket emulation per send and per read, and
Locust's task machinery per request: several times what the request's own bytes cost, on the cores the server
under test needs (docs/measurement.md, "Closed loop against wrk"). Here, as wrk does with epoll, the connection is
a RawConnection (raw_http.py): the callback that reads an answer sends the next request at once and keeps the
finished one. Nothing wakes the user's greenlet per request: it hands what finished to `record` (the recorder
and Locust's statistics) in batches, every RECORD_EVERY_S, and at once whenever the recorder asks (`collect`),
so that a window's figures are whole. A connection the server closes is reopened by the user's greenlet; an
answer slower than the network timeout fails with status 0, as the lean client's would."""

from __future__ import annotations

import time
from typing import Callable

import gevent
from gevent.event import Event

from latlab.loadtest.raw_http import Finished, RawConnection

Record = Callable[[list[Finished], "float | None"], None]

RECORD_EVERY_S = 0.1
"""How often the user's greenlet hands the finished requests on (and checks the network timeout): a greenlet
switch per batch, not per request. The recorder's windows never wait for it (they `collect` first); Locust's
statistics (web UI, CSV, a worker's reports) hear of a request at most this much after it finished."""

_new_tuple = tuple.__new__  # a Finished without NamedTuple's Python-level __new__: the answer callback is hot
_now = time.time


class LoopSender:
    """One connection's closed loop (module docstring). `next_request()` gives the raw bytes of each request to
    send; `run(record)` sends until the calling greenlet is killed, handing each finished request to `record`;
    `collect()` hands them at once, from any greenlet of the same event loop."""

    def __init__(
        self,
        address: tuple[str, int],
        next_request: Callable[[], bytes],
        timeout_s: float = 30.0,
        connect_timeout_s: float = 5.0,
        record_every_s: float = RECORD_EVERY_S,
    ) -> None:
        self.address = address
        self.next_request = next_request
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.record_every_s = record_every_s
        self.finished: list[Finished] = []
        self._record: Record | None = None
        self._wake = Event()
        self._connection: RawConnection | None = None
        self._sent = 0.0
        self._broken = ""
        self._on_answer = self._answered  # bound once: exchange() takes it per request

    def run(self, record: Record) -> None:
        """Connect, send, and hand what finishes to `record` with the send time of the request now in flight (None
        while none is), until killed; the request in flight then ends as status 0."""
        self._record = record
        ticker = gevent.get_hub().loop.timer(self.record_every_s, self.record_every_s)
        ticker.start(self._tick)  # one timer for the connection's life: no timeout object per wait
        try:
            while True:
                if self._connection is None:
                    self._open()
                    self.collect()
                    if self._connection is None:
                        continue
                self._wake.wait()
                self._wake.clear()
                if self._flying() is not None and time.time() - self._sent > self.timeout_s:
                    self._fail("timeout")
                self.collect()
                if self._broken:
                    self._close()
        finally:
            ticker.stop()
            ticker.close()
            if self._flying() is not None:
                self.finished.append(Finished(self._sent, time.time(), 0, False, 0))
            self._close()
            self.collect()
            self._record = None

    def collect(self) -> None:
        """Hand the requests finished since the last call to `record` (nothing before `run`, or after it ended)."""
        if self._record is not None:
            done, self.finished = self.finished, []
            self._record(done, self._flying())

    def _tick(self) -> None:
        """Wake the greenlet where there is something to hand on or to time out (a switch costs more than this)."""
        if self.finished or (self._flying() is not None and time.time() - self._sent > self.timeout_s):
            self._wake.set()

    def _flying(self) -> float | None:
        return self._sent if self._connection is not None and not self._broken else None

    def _open(self) -> None:
        """A new connection; a refused one ends as status 0."""
        self._broken = ""
        try:
            self._connection = RawConnection.open(self.address, self.connect_timeout_s)
        except OSError as exc:
            now = time.time()
            self.finished.append(Finished(now, now, 0, False, 0, type(exc).__name__))
            gevent.sleep(0.01)  # a refused server is not retried in a hot loop
            return
        self._send_next()

    def _close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _send_next(self) -> None:
        self._sent = _now()
        self._connection.exchange(self.next_request(), self._on_answer)

    def _answered(self, _connection: RawConnection, found: tuple | None, error: str) -> None:
        if found is None:
            self._fail(error)
            return
        status, retry_after, received, keep = found
        self.finished.append(_new_tuple(Finished, (self._sent, _now(), status, retry_after, received, "")))
        if keep:
            self._send_next()
        else:
            self._broken = "closed"
            self._wake.set()  # the greenlet opens the next connection

    def _fail(self, why: str) -> None:
        self.finished.append(Finished(self._sent, time.time(), 0, False, 0, why))
        self._broken = why
        self._wake.set()
