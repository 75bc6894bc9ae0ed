"""An open-loop user's requests sent the moment their intended time comes, answers read from the event loop's own
I/O callbacks.

Through the lean client each arrival spawned a greenlet that waited its turn on the event loop before sending:
a spawn, two switches and a loop iteration between the timer's wake-up and the bytes leaving, all part of the
request's latency (it counts from the intended time), and a greenlet switch and a timeout object per answer read.
Here the sender writes the request on an idle keep-alive connection (a RawConnection, raw_http.py) straight from
its wake-up, and the connection's read callback hands the answer to `done`. Only a request that finds no idle
connection waits for a new one, in a greenlet of its own. A kept-alive connection the server closed meanwhile
is replaced once, when it failed before any byte of the answer came (as the lean client does); an answer slower
than the network timeout fails with status 0."""

from __future__ import annotations

import sys
import time
from typing import Callable

import gevent

from latlab.loadtest.raw_http import Finished, RawConnection

Done = Callable[[object, Finished], None]


class OpenSender:
    """The connections of one open-loop user. `send(raw, token, sent)` sends at once; `done(token, finished)` is
    called once per request, from the event loop (or the greenlet that opened its connection)."""

    def __init__(
        self, address: tuple[str, int], done: Done, timeout_s: float = 30.0, connect_timeout_s: float = 5.0
    ) -> None:
        self.address = address
        self.done = done
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.idle: list[RawConnection] = []
        self.flying: dict[RawConnection, tuple[object, float, bytes, bool]] = {}
        """Connection -> (token, send time, request, whether it went on a kept-alive connection)."""
        self.connecting = 0
        self._watchdog = gevent.get_hub().loop.timer(timeout_s / 4, timeout_s / 4)
        self._watchdog.start(self.expire)

    @property
    def in_flight(self) -> int:
        return len(self.flying) + self.connecting

    def send(self, raw: bytes, token: object, sent: float) -> None:
        while self.idle:
            connection = self.idle.pop()
            if not connection.closed:
                self._start(connection, raw, token, sent, reused=True)
                return
            connection.close()
        self._connect_then_send(raw, token, sent)

    def _connect_then_send(self, raw: bytes, token: object, sent: float) -> None:
        self.connecting += 1
        gevent.spawn(self._connect, raw, token, sent)

    def _connect(self, raw: bytes, token: object, sent: float) -> None:
        try:
            connection = RawConnection.open(self.address, self.connect_timeout_s)
        except OSError as exc:
            self.connecting -= 1
            self._report(token, Finished(sent, time.time(), 0, False, 0, type(exc).__name__))
            return
        self.connecting -= 1
        self._start(connection, raw, token, sent, reused=False)

    def _start(self, connection: RawConnection, raw: bytes, token: object, sent: float, reused: bool) -> None:
        self.flying[connection] = (token, sent, raw, reused)
        connection.exchange(raw, self._answered)

    def _answered(self, connection: RawConnection, found: tuple | None, error: str) -> None:
        flight = self.flying.pop(connection, None)
        if flight is None:  # expired meanwhile: already reported
            connection.close()
            return
        token, sent, raw, reused = flight
        if found is None:
            connection.close()
            if reused and not connection.got_bytes:  # the server closed it while it was idle: once more, anew
                self._connect_then_send(raw, token, sent)
                return
            self._report(token, Finished(sent, time.time(), 0, False, 0, error))
            return
        status, retry_after, received, keep = found
        if keep:
            self.idle.append(connection)
        else:
            connection.close()
        self._report(token, Finished(sent, time.time(), status, retry_after, received))

    def expire(self) -> None:
        """Fail the requests waiting longer than the network timeout (status 0, "timeout")."""
        now = time.time()
        for connection, (token, sent, _, _) in list(self.flying.items()):
            if now - sent > self.timeout_s:
                del self.flying[connection]
                connection.close()
                self._report(token, Finished(sent, now, 0, False, 0, "timeout"))

    def close(self) -> None:
        """Close every connection; a request still in flight ends as status 0 (as a stopped user's would)."""
        self._watchdog.stop()
        self._watchdog.close()
        now = time.time()
        for connection, (token, sent, _, _) in list(self.flying.items()):
            del self.flying[connection]
            self._report(token, Finished(sent, now, 0, False, 0))
            connection.close()
        while self.idle:
            self.idle.pop().close()

    def _report(self, token: object, finished: Finished) -> None:
        try:
            self.done(token, finished)
        except Exception:  # on the event loop: a recording error is printed, and the loop's callbacks go on
            gevent.get_hub().handle_error(self, *sys.exc_info())
