"""A closed-loop user's requests sent and read from the event loop's own I/O callbacks, one connection per user.

A closed-loop user sends its next request the moment the last answer is read. Through the lean client under
gevent that costs a greenlet switch, a timeout object and a blocking-socket emulation per send and per read, and
Locust's task machinery per request: several times what the request's own bytes cost, on the cores the server
under test needs (docs/measurement.md, "Closed loop against wrk"). Here, as wrk does with epoll, the connection is
a RawConnection (raw_http.py): the callback that reads an answer sends the next request at once and hands the
finished one to the user's greenlet, which records it (the recorder and Locust's statistics, as every request)
in batches, off the send path. A connection the server closes is reopened by the user's greenlet; an answer
slower than the network timeout fails with status 0, as the lean client's would."""

from __future__ import annotations

import time
from typing import Callable

import gevent
from gevent.event import Event

from latlab.loadtest.raw_http import Finished, RawConnection

Record = Callable[[list[Finished], "float | None"], None]


class LoopSender:
    """One connection's closed loop (module docstring). `next_request()` gives the raw bytes of each request to
    send; `run(record)` sends until the calling greenlet is killed, handing each finished request to `record` in
    the calling greenlet."""

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
        self._connection: RawConnection | None = None
        self._sent = 0.0
        self._broken = ""

    def run(self, record: Record) -> None:
        """Connect, send, and hand what finishes to `record` with the send time of the request now in flight (None
        while none is), until killed; the request in flight then ends as status 0."""
        watchdog = gevent.get_hub().loop.timer(self.timeout_s, self.timeout_s)
        watchdog.start(self._wake.set)  # one timer for the connection's life: no timeout object per wait
        try:
            while True:
                if self._connection is None:
                    self._open()
                    self._flush(record)
                    if self._connection is None:
                        continue
                self._wake.wait()
                self._wake.clear()
                if self._flying() is not None and not self.finished and time.time() - self._sent > self.timeout_s:
                    self._fail("timeout")
                self._flush(record)
                if self._broken:
                    self._close()
        finally:
            watchdog.stop()
            watchdog.close()
            if self._flying() is not None:
                self.finished.append(Finished(self._sent, time.time(), 0, False, 0))
            self._close()
            self._flush(record)

    def _flying(self) -> float | None:
        return self._sent if self._connection is not None and not self._broken else None

    def _flush(self, record: Record) -> None:
        done, self.finished = self.finished, []
        record(done, self._flying())

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
        self._sent = time.time()
        self._connection.exchange(self.next_request(), self._answered)

    def _answered(self, _connection: RawConnection, found: tuple | None, error: str) -> None:
        if found is None:
            self._fail(error)
            return
        status, retry_after, received, keep = found
        self.finished.append(Finished(self._sent, time.time(), status, retry_after, received))
        self._wake.set()
        if keep:
            self._send_next()
        else:
            self._broken = "closed"

    def _fail(self, why: str) -> None:
        self.finished.append(Finished(self._sent, time.time(), 0, False, 0, why))
        self._broken = why
        self._wake.set()
