"""A punctual wake-up for an open-loop sender: a Linux timerfd armed at the intended send time, which the event
loop watches like a socket, so the sender wakes within the kernel's timer slack (tens of microseconds) instead of
on the event loop's timer, which waits in whole milliseconds (epoll's timeout) and so wakes up to a millisecond
late. Nothing spins: the process sleeps in epoll until the timer fires, and the CPU stays with the server.

Python 3.11 and 3.12 have no os.timerfd_create (3.13 does), so libc's is called through ctypes. Where there is
none (not Linux), `Timer.make()` returns None and the sender keeps the event loop's timer. LATLAB_TIMER=loop in
the environment keeps it too: to measure one against the other (benchmarks/generator_floor.py)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

from gevent.socket import wait_read

CLOCK_REALTIME = 0
"""time.time()'s clock: intended send times are wall-clock instants shared by every process of the fleet."""
TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.timerfd_create, libc.timerfd_settime  # noqa: B018 (absent outside Linux: AttributeError)
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


class Timer:
    """One sender's timerfd: `wait_until(when)` returns at the time.time() instant `when` (at once if it passed)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._spec = _Itimerspec()

    @classmethod
    def make(cls) -> Timer | None:
        """A timer, or None where the system has no timerfd (or LATLAB_TIMER=loop asks for the loop's timer)."""
        if _LIBC is None or os.environ.get("LATLAB_TIMER") == "loop":
            return None
        fd = _LIBC.timerfd_create(CLOCK_REALTIME, os.O_NONBLOCK | os.O_CLOEXEC)
        return cls(fd) if fd >= 0 else None

    def wait_until(self, when: float) -> None:
        """Yield to the event loop until `when`; a greenlet killed meanwhile leaves the timer to be armed again."""
        seconds = int(when)
        self._spec.it_value.tv_sec, self._spec.it_value.tv_nsec = seconds, int((when - seconds) * 1e9)
        if _LIBC.timerfd_settime(self.fd, TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"timerfd_settime: {os.strerror(errno)}")
        wait_read(self.fd)
        try:
            os.read(self.fd, 8)  # its expiry count: read, so that the next wait waits
        except BlockingIOError:
            pass

    def close(self) -> None:
        os.close(self.fd)
