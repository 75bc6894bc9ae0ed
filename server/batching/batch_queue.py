"""The batcher's state without threads: Triton's dispatch rule as a pure function, the bounded priority
queue that applies it on a given clock reading, and the cheap future (Slot) a queued request is answered by.

DynamicBatcher (batcher.py) drives it from worker threads; adaptive waiting lives in latency_model.py.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from itertools import chain
from typing import Iterator, Sequence

from latlab.server.batching.latency_model import ArrivalRate, LatencyModel, adaptive_wait
from latlab.server.batching.tensors import Tensors
from latlab.common.settings import BatcherSettings
from latlab.server.errors import BadRequest, QueueFull

__all__ = ["BatchQueue", "Pending", "Slot", "batch_to_send"]


_TRANSITIONS = threading.Lock()  # a slot's state changes are atomic; held for a few bytecodes


class Slot:
    """The future a request thread waits on: the part of concurrent.futures.Future the batcher uses, made
    cheap. Future waits on a Condition (a new lock per wait, and an RLock the waking thread must take back
    from the worker still notifying); a Slot is one lock, held until the answer is in. Releasing it wakes
    the caller with a single hand-over, which matters at thousands of requests per second under the GIL."""

    __slots__ = ("_done", "_state", "_value", "_error", "_callback")
    PENDING, RUNNING, CANCELLED, FINISHED = range(4)

    def __init__(self) -> None:
        self._done = threading.Lock()
        self._done.acquire()
        self._state = Slot.PENDING
        self._value = None
        self._error: BaseException | None = None
        self._callback = None

    def when_done(self, callback) -> None:
        """Call `callback(slot)` once the answer is in (at once when it already is), on the thread that answers
        it: how the engine process (server/processes/engine.py) hears of results without a thread waiting on each."""
        with _TRANSITIONS:
            if self._state not in (Slot.CANCELLED, Slot.FINISHED):
                self._callback = callback
                return
        callback(self)

    def set_running_or_notify_cancel(self) -> bool:
        """Mark it running; False when the caller already cancelled (then it must not be computed)."""
        with _TRANSITIONS:
            if self._state == Slot.CANCELLED:
                return False
            self._state = Slot.RUNNING
            return True

    def cancel(self) -> bool:
        """Give up on a request not yet running; True when it is (now) cancelled."""
        with _TRANSITIONS:
            if self._state == Slot.PENDING:
                self._state = Slot.CANCELLED
                self._done.release()
            return self._state == Slot.CANCELLED

    def set_result(self, value) -> None:
        self._finish(value, None)

    def set_exception(self, error: BaseException) -> None:
        self._finish(None, error)

    def _finish(self, value, error: BaseException | None) -> None:
        with _TRANSITIONS:
            if self._state in (Slot.CANCELLED, Slot.FINISHED):
                raise RuntimeError(f"slot already {'cancelled' if self._state == Slot.CANCELLED else 'finished'}")
            self._value, self._error, self._state = value, error, Slot.FINISHED
            callback = self._callback
        self._done.release()
        if callback is not None:
            callback(self)

    def done(self) -> bool:
        return self._state in (Slot.CANCELLED, Slot.FINISHED)

    def result(self, timeout: float | None = None):
        """The answer, or its exception raised; TimeoutError when none came within `timeout` seconds."""
        if not self._done.acquire(True, -1 if timeout is None else timeout):
            raise TimeoutError(f"no result within {timeout} s")
        self._done.release()  # stays open for later calls
        if self._state == Slot.CANCELLED:
            raise CancelledError()
        if self._error is not None:
            raise self._error
        return self._value


@dataclass
class Pending:
    """One queued request: its inputs, its batch dimension and the future its caller waits on."""

    inputs: Tensors
    size: int
    enqueued_at: float
    deadline: float
    future: Slot = field(default_factory=Slot)
    shape_key: tuple = ()
    """Every input's trailing dimensions: only requests with the same key are batched together."""
    priority: int = 0
    """Triton's request priority: 1 is the highest level; 0 means the deployment's default level."""
    length: int = 0
    """The request's length on the padded axis (0 without padding); outputs are cut back to it."""
    outputs: tuple[str, ...] | None = None
    """The outputs the request asked for; None: all of them."""
    requests: int = 1
    """The clients' requests it stands for: a front end stacks requests of one shape into one (engine.py), queued,
    run and answered as one, and counted as they were sent (queue bound, depth, arrivals, queue times)."""


def batch_to_send(
    now: float,
    sizes: Sequence[int],
    oldest_enqueued_at: float,
    max_batch_size: int,
    max_queue_delay_s: float,
    preferred: Sequence[int] = (),
) -> int | float | None:
    """Triton's rule. Returns how many queued requests to send now (int), when to look again (float),
    or None when the queue is empty. `sizes` are the batch dimensions of the queued requests that may
    join one batch, in queue order (priority, then arrival). Send at once when the batch is full, the next
    request does not fit, a preferred size is reached, or the oldest request has waited the delay."""
    if not sizes:
        return None
    blocked = False
    count = samples = best_preferred = 0
    for size in sizes:
        if samples + size > max_batch_size:
            blocked = True
            break
        count, samples = count + 1, samples + size
        if samples in preferred:
            best_preferred = count
    if samples >= max_batch_size or blocked or max_queue_delay_s <= 0:
        return count
    if best_preferred:
        return best_preferred
    send_at = oldest_enqueued_at + max_queue_delay_s
    return count if now >= send_at else float(send_at)


class BatchQueue:
    """The batcher's state without threads: bounded queue per priority level, expiry, batch formation at a
    given time and, in adaptive mode, the latency model and arrival rate the wait decision uses."""

    def __init__(self, settings: BatcherSettings) -> None:
        self.settings = settings
        self._levels: list[deque[Pending]] = [deque() for _ in range(settings.priority_levels)]
        self._count = 0
        self._samples = 0
        self._delay_s = settings.max_queue_delay_ms / 1000.0
        self.latency = LatencyModel()
        self.arrivals = ArrivalRate()

    def __len__(self) -> int:
        return self._count

    @property
    def samples(self) -> int:
        """The samples of every queued request (a request of size n counts n)."""
        return self._samples

    @property
    def full(self) -> bool:
        return self.full_for(0)

    def full_for(self, free_instances: int, arriving: int = 1) -> bool:
        """Whether `arriving` more requests would leave more than max_queue_size waiting, not counting those that
        complete full batches free instances take at once (one sample per request assumed; larger requests only
        make it stricter). As in Triton, requests an idle instance holds while waiting out its delay for a
        batch to fill do count: max_queue_size bounds them. Without the allowance for full batches the queue
        refused requests the deployment's admission bound (max_queue_size + instances x max_batch_size) had let
        in, when they arrived before a free instance dequeued the first of them."""
        after = self._count + arriving
        taken = min(max(0, free_instances), after // self.settings.max_batch_size) * self.settings.max_batch_size
        return after - taken > self.settings.max_queue_size

    def full_error(self) -> QueueFull:
        return QueueFull(f"queue is full ({self.settings.max_queue_size} requests waiting)")

    def _ordered(self) -> Iterator[Pending]:
        """Highest priority first, arrival order within a level."""
        return chain.from_iterable(self._levels)

    def level_of(self, priority: int) -> int:
        """The queue level (1-based) of a request's `priority`; BadRequest names a value out of range."""
        levels = self.settings.priority_levels
        if type(priority) is not int or not 0 <= priority <= levels:
            raise BadRequest(
                f"parameters.priority must be an integer in 0..{levels} (1 = highest, 0 = default), got {priority!r}"
            )
        return priority or self.settings.default_priority_level

    def put(self, pending: Pending, free_instances: int = 0) -> None:
        level = self._admissible(pending)
        if self.full_for(free_instances, pending.requests):
            raise self.full_error()
        self._enqueue(pending, level)
        self._arrived(pending)

    def sends_alone(self, pending: Pending, free_instances: int) -> bool:
        """For a request that finds the queue empty: True when the dispatch rule sends it alone at its arrival
        (max_batch_size 1, no delay, or adaptive mode predicting no gain in waiting); it is then not queued
        and is the caller's to run. Otherwise it is queued as by put. Either way its arrival is counted."""
        if self._count:
            raise RuntimeError("sends_alone is for an empty queue")
        level = self._admissible(pending)
        now = pending.enqueued_at
        self._arrived(pending)
        if isinstance(self._decide(now, [pending], now, self._delay_s, free_instances), float):
            self._enqueue(pending, level)
            return False
        return True

    def _enqueue(self, pending: Pending, level: int) -> None:
        self._levels[level - 1].append(pending)
        self._count += pending.requests
        self._samples += pending.size

    def _arrived(self, pending: Pending) -> None:
        for _ in range(pending.requests):  # a stack's requests arrived together
            self.arrivals.arrived(pending.enqueued_at)

    def _admissible(self, pending: Pending) -> int:
        """The request's queue level; BadRequest for a priority out of range or a batch over max_batch_size."""
        level = self.level_of(pending.priority)
        if pending.size > self.settings.max_batch_size:
            raise BadRequest(
                f"batch of {pending.size} exceeds this deployment's max_batch_size {self.settings.max_batch_size}"
            )
        return level

    def expire(self, now: float) -> list[Pending]:
        """Remove and return the requests whose deadline has passed; they must never be computed."""
        expired = [p for p in self._ordered() if p.deadline <= now]
        if expired:
            self._remove(expired)
        return expired

    def record_batch(self, samples: int, compute_s: float) -> None:
        """Feed one finished batch's run time to the latency model (adaptive mode's a*n + b)."""
        self.latency.record(samples, compute_s)

    def take(self, now: float, flush: bool = False, free_instances: int = 1) -> list[Pending] | float | None:
        """The batch to run now, or the time to look again, or None when empty.
        `flush` sends whatever is queued without waiting (used while draining). `free_instances` counts
        the idle workers, the caller included (adaptive mode sends at once when another one is idle)."""
        if not self._count:
            return None
        limit = self.settings.max_batch_size
        ordered = list(self._ordered())
        # Requests of other trailing shapes cannot share a tensor: group the first's shape (from anywhere
        # in the queue, in priority then arrival order); the others form the next batches.
        key = ordered[0].shape_key
        group = [p for p in ordered if p.shape_key == key][:limit]
        oldest = min(p.enqueued_at for p in group)  # the delay counts from the batch's oldest request
        decision = self._decide(now, group, oldest, 0.0 if flush else self._delay_s, free_instances)
        if isinstance(decision, float):
            # Wake for the first deadline too, so an expired request is answered at its deadline.
            return min(decision, min(p.deadline for p in ordered))
        chosen = group[:decision]
        self._remove(chosen)
        return chosen

    def _decide(
        self, now: float, group: list[Pending], oldest: float, delay_s: float, free_instances: int
    ) -> int | float:
        """How many of `group` (one shape, queue order) to send now, or when to look again: Triton's rule,
        then, where it would wait, adaptive mode's prediction of whether waiting pays."""
        decision = batch_to_send(
            now,
            [p.size for p in group],
            oldest,
            self.settings.max_batch_size,
            delay_s,
            self.settings.preferred_batch_sizes,
        )
        if isinstance(decision, float) and self.settings.adaptive:
            decision = self._adaptive(now, group, oldest, free_instances)
        return decision

    def _adaptive(self, now: float, group: list[Pending], oldest: float, free_instances: int) -> int | float:
        last = self.arrivals.last_arrival
        until = adaptive_wait(
            now,
            [p.size for p in group],
            oldest,
            self.latency.fit(),
            self.arrivals.expected_gap(now),
            now if last is None else last,
            free_instances,
            self._delay_s,
            min(p.deadline for p in group),
        )
        return len(group) if until is None else until

    def _remove(self, items: list[Pending]) -> None:
        gone = {id(p) for p in items}
        for i, level in enumerate(self._levels):
            while level and id(level[0]) in gone:  # the usual case: the front of a level
                gone.discard(id(level.popleft()))
            if gone and any(id(p) in gone for p in level):
                self._levels[i] = deque(p for p in level if id(p) not in gone)
        self._count -= sum(p.requests for p in items)
        self._samples -= sum(p.size for p in items)
