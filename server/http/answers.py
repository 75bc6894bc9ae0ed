"""An event loop and the batcher's threads, with wake-ups per batch and per pass of the loop, not per request."""

from __future__ import annotations

import asyncio
import threading

from latlab.server.batching.batch_queue import Slot
from latlab.server.batching.batcher import DynamicBatcher


class LoopAnswers:
    """Wakes the event loop once for every slot a batch answers, not once per slot: the batcher's worker appends
    each answered slot's future here, and only the first of a burst schedules a call on the loop, which then
    resolves every future gathered meanwhile (a batch's slots are answered back to back, under the GIL).

    A thread per waiting request (the WSGI path) costs a wake-up and an interpreter hand-over per request;
    here a batch of any size costs one. The other way likewise: requests queued with the batcher's `wake` False
    (`wake_soon`) wake its worker once per pass of the loop, however many that pass queued."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._ready: list[asyncio.Future] = []
        self._scheduled = False
        self._to_wake: dict[int, DynamicBatcher] = {}

    def wake_soon(self, batcher: DynamicBatcher) -> None:
        """Wake `batcher`'s worker once this pass of the loop is over (on the loop's thread)."""
        if not self._to_wake:
            self._loop.call_soon(self._wake)
        self._to_wake[id(batcher)] = batcher

    def _wake(self) -> None:
        to_wake, self._to_wake = self._to_wake, {}
        for batcher in to_wake.values():
            batcher.wake()

    async def wait(self, slot: Slot, limit_s: float) -> bool:
        """Wait on the loop until `slot` is answered (True) or `limit_s` passed (False, the slot left as is)."""
        if slot.done():
            return True
        future = self._loop.create_future()
        slot.when_done(lambda _slot: self._answered(future))
        guard = self._loop.call_later(limit_s, _give_up, future)
        try:
            return await future
        finally:
            guard.cancel()

    def _answered(self, future: asyncio.Future) -> None:
        """On the answering thread: a batcher worker (or this loop's thread, for a slot answered meanwhile)."""
        with self._lock:
            self._ready.append(future)
            if self._scheduled:
                return
            self._scheduled = True
        self._loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, []
            self._scheduled = False
        for future in ready:
            if not future.done():
                future.set_result(True)


def _give_up(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(False)
