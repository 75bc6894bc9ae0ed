"""Dynamic request batcher: a bounded priority queue, Triton's dispatch rule, worker threads and futures.

It knows nothing of Flask or ONNX Runtime: it is given a `run_batch` callable, plain settings and a clock.
Adaptive waiting lives in latency_model.py, merging, splitting and padding tensors in tensors.py.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from itertools import chain
from typing import Callable, Iterator, Protocol, Sequence

from latlab.server.config import BatcherSettings, PaddingSettings
from latlab.server.errors import BadRequest, ComputeError, ModelNotReady, QueueFull, RequestTimeout, public_message
from latlab.server.latency_model import ArrivalRate, LatencyModel, adaptive_wait
from latlab.server.tensors import Tensors, merge, request_length, shape_key, split

__all__ = ["BatchQueue", "DynamicBatcher", "Pending", "Slot", "batch_to_send", "merge", "split"]
log = logging.getLogger("latlab.server.batcher")


_TRANSITIONS = threading.Lock()  # a slot's state changes are atomic; held for a few bytecodes


class Slot:
    """The future a request thread waits on: the part of concurrent.futures.Future the batcher uses, made
    cheap. Future waits on a Condition (a new lock per wait, and an RLock the waking thread must take back
    from the worker still notifying); a Slot is one lock, held until the answer is in. Releasing it wakes
    the caller with a single hand-over, which matters at thousands of requests per second under the GIL."""

    __slots__ = ("_done", "_state", "_value", "_error")
    PENDING, RUNNING, CANCELLED, FINISHED = range(4)

    def __init__(self) -> None:
        self._done = threading.Lock()
        self._done.acquire()
        self._state = Slot.PENDING
        self._value = None
        self._error: BaseException | None = None

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
        self._done.release()

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


def batch_to_send(now: float, sizes: Sequence[int], oldest_enqueued_at: float, max_batch_size: int,
                  max_queue_delay_s: float, preferred: Sequence[int] = ()) -> int | float | None:
    """Triton's rule. Returns how many queued requests to send now (int), when to look again (float),
    or None when the queue is empty. `sizes` are the batch dimensions of the queued requests that may
    join one batch, in queue order (priority, then arrival). Send at once when the batch is full, the next request does not fit,
    a preferred size is reached, or the oldest request has waited the delay."""
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
        self._delay_s = settings.max_queue_delay_ms / 1000.0
        self.latency = LatencyModel()
        self.arrivals = ArrivalRate()

    def __len__(self) -> int:
        return self._count

    @property
    def full(self) -> bool:
        return self._count >= self.settings.max_queue_size

    def full_error(self) -> QueueFull:
        return QueueFull(f"queue is full ({self.settings.max_queue_size} requests waiting)")

    def _ordered(self) -> Iterator[Pending]:
        """Highest priority first, arrival order within a level."""
        return chain.from_iterable(self._levels)

    def level_of(self, priority: int) -> int:
        """The queue level (1-based) of a request's `priority`; BadRequest names a value out of range."""
        levels = self.settings.priority_levels
        if type(priority) is not int or not 0 <= priority <= levels:
            raise BadRequest(f"parameters.priority must be an integer in 0..{levels} (1 = highest, 0 = default), "
                             f"got {priority!r}")
        return priority or self.settings.default_priority_level

    def put(self, pending: Pending) -> None:
        level = self._admissible(pending)
        if self.full:
            raise self.full_error()
        self._enqueue(pending, level)
        self.arrivals.arrived(pending.enqueued_at)

    def sends_alone(self, pending: Pending, free_instances: int) -> bool:
        """For a request that finds the queue empty: True when the dispatch rule sends it alone at its arrival
        (max_batch_size 1, no delay, or adaptive mode predicting no gain in waiting); it is then not queued
        and is the caller's to run. Otherwise it is queued as by put. Either way its arrival is counted."""
        if self._count:
            raise RuntimeError("sends_alone is for an empty queue")
        level = self._admissible(pending)
        now = pending.enqueued_at
        self.arrivals.arrived(now)
        if isinstance(self._decide(now, [pending], now, self._delay_s, free_instances), float):
            self._enqueue(pending, level)
            return False
        return True

    def _enqueue(self, pending: Pending, level: int) -> None:
        self._levels[level - 1].append(pending)
        self._count += 1

    def _admissible(self, pending: Pending) -> int:
        """The request's queue level; BadRequest for a priority out of range or a batch over max_batch_size."""
        level = self.level_of(pending.priority)
        if pending.size > self.settings.max_batch_size:
            raise BadRequest(f"batch of {pending.size} exceeds this deployment's max_batch_size "
                             f"{self.settings.max_batch_size}")
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

    def _decide(self, now: float, group: list[Pending], oldest: float, delay_s: float,
                free_instances: int) -> int | float:
        """How many of `group` (one shape, queue order) to send now, or when to look again: Triton's rule,
        then, where it would wait, adaptive mode's prediction of whether waiting pays."""
        decision = batch_to_send(now, [p.size for p in group], oldest, self.settings.max_batch_size, delay_s,
                                 self.settings.preferred_batch_sizes)
        if isinstance(decision, float) and self.settings.adaptive:
            decision = self._adaptive(now, group, oldest, free_instances)
        return decision

    def _adaptive(self, now: float, group: list[Pending], oldest: float, free_instances: int) -> int | float:
        last = self.arrivals.last_arrival
        until = adaptive_wait(now, [p.size for p in group], oldest, self.latency.fit(),
                              self.arrivals.expected_gap(now), now if last is None else last, free_instances,
                              self._delay_s, min(p.deadline for p in group))
        return len(group) if until is None else until

    def _remove(self, items: list[Pending]) -> None:
        gone = {id(p) for p in items}
        for i, level in enumerate(self._levels):
            while level and id(level[0]) in gone:  # the usual case: the front of a level
                gone.discard(id(level.popleft()))
            if gone and any(id(p) in gone for p in level):
                self._levels[i] = deque(p for p in level if id(p) not in gone)
        self._count -= len(items)

class BatchObserver(Protocol):
    """What the batcher reports (metrics implement it)."""

    def queue_depth(self, depth: int) -> None: ...
    def rejected(self, reason: str) -> None: ...
    def batch_done(self, size: int, queue_s: Sequence[float], compute_s: float, ok: bool) -> None: ...


class _NoObserver:
    def queue_depth(self, depth: int) -> None: ...
    def rejected(self, reason: str) -> None: ...
    def batch_done(self, size: int, queue_s: Sequence[float], compute_s: float, ok: bool) -> None: ...


class DynamicBatcher:
    """Runs batches from a BatchQueue on `settings.instances` worker threads; callers get futures.

    Workers sleep on a condition variable until a request arrives, a batch finishes (adaptive mode) or
    the computed send time comes: no polling, so an idle deployment costs no CPU. With `padding`,
    requests of different lengths on the padded axis share a batch (see server/tensors.py).

    `run_batch(inputs)` runs one merged batch; when every request of a batch named the same outputs it is
    called as `run_batch(inputs, outputs)` and need only return those."""

    def __init__(self, run_batch: Callable[..., Tensors], settings: BatcherSettings,
                 observer: BatchObserver | None = None, clock: Callable[[], float] = time.monotonic,
                 name: str = "batcher", padding: PaddingSettings | None = None) -> None:
        self._run_batch = run_batch
        self._settings = settings
        self._padding = padding if padding and padding.values else None
        self._queue = BatchQueue(settings)
        self._observer = observer or _NoObserver()
        self._clock = clock
        self._timeout_s = settings.timeout_ms / 1000.0
        self._cond = threading.Condition()
        self._closing = False
        self._busy = 0
        self._workers = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
                         for i in range(settings.instances)]
        for worker in self._workers:
            worker.start()

    def submit(self, inputs: Tensors, size: int, timeout_s: float | None = None, priority: int = 0,
               outputs: Sequence[str] | None = None) -> Slot:
        """Queue one request of `size` samples; raises QueueFull/ModelNotReady/BadRequest at once instead of
        waiting. `timeout_s` may only shorten the deployment's timeout; `priority` 1 is the highest level,
        0 the deployment's default; `outputs` names the outputs the request needs (None: all)."""
        pending = self._pending(inputs, size, timeout_s, priority, outputs)
        with self._cond:
            self._put(pending)
            self._cond.notify()
        return pending.future

    def infer(self, inputs: Tensors, size: int, timeout_s: float | None = None, priority: int = 0,
              outputs: Sequence[str] | None = None) -> Tensors:
        """Submit and wait for the result (the request thread's call).

        A request that finds the queue empty, an instance free and the dispatch rule sending it alone at
        once runs on the calling thread: the batch it would have formed is itself, and the hand-over to a
        worker and back (two thread wake-ups, ~0.1-0.5 ms on a VM whose idle vCPUs sleep) is saved."""
        pending = self._pending(inputs, size, timeout_s, priority, outputs)
        with self._cond:
            free = self._settings.instances - self._busy
            if self._queue or free < 1 or self._closing:
                direct = False
                self._put(pending)
            else:  # decided at arrival, never queued: the queue stays empty and its gauge untouched
                direct = self._queue.sends_alone(pending, free)
                if not direct:
                    self._observer.queue_depth(len(self._queue))
            if direct:
                self._busy += 1
            else:
                self._cond.notify()
        if direct:
            run_s = None
            try:
                run_s = self._run([pending])
            finally:
                self._finish_batch([pending], run_s)
        try:
            # The worker expires the request at its deadline; the margin only guards a stuck model run.
            return pending.future.result(timeout=self._timeout_s + 5.0)
        except TimeoutError:
            pending.future.cancel()
            raise RequestTimeout(f"no result within {self._timeout_s:.3f} s") from None

    def _pending(self, inputs: Tensors, size: int, timeout_s: float | None, priority: int,
                 outputs: Sequence[str] | None) -> Pending:
        now = self._clock()
        timeout_s = self._timeout_s if timeout_s is None else min(timeout_s, self._timeout_s)
        return Pending(inputs, size, now, now + timeout_s, shape_key=shape_key(inputs, self._padding),
                       priority=priority, length=request_length(inputs, self._padding),
                       outputs=None if outputs is None else tuple(outputs))

    def _put(self, pending: Pending) -> None:
        """Queue it (the caller holds the lock)."""
        if self._closing:
            raise ModelNotReady("deployment is shutting down")
        try:
            self._queue.put(pending)
        except QueueFull:
            self._observer.rejected("queue_full")
            raise
        self._observer.queue_depth(len(self._queue))

    def refuse_if_full(self) -> None:
        """Raise QueueFull, counting the rejection, when the queue is full right now. Read without the lock:
        a racy snapshot, enough to refuse a request before its body is read; submit's own check, under the
        lock, stays the authority for the requests let through."""
        if self._queue.full:
            self._observer.rejected("queue_full")
            raise self._queue.full_error()

    def adaptive_state(self) -> dict[str, float | None]:
        """What adaptive mode currently believes: a (s/sample), b (s/batch), the arrival rate (1/s)."""
        with self._cond:
            fit = self._queue.latency.fit()
            gap = self._queue.arrivals.mean_gap
        return {"a_s": fit and fit[0], "b_s": fit and fit[1], "arrival_rate": 1.0 / gap if gap else None}

    def close(self, timeout: float | None = None) -> None:
        """Stop taking requests, finish everything queued and in flight, then stop the workers."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        for worker in self._workers:
            worker.join(timeout)

    def _work(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            run_s = None
            try:
                run_s = self._run(batch)
            finally:
                self._finish_batch(batch, run_s)

    def _finish_batch(self, batch: list[Pending], run_s: float | None) -> None:
        """An instance is free again: feed the latency model and wake a worker that may use it."""
        with self._cond:
            self._busy -= 1
            if run_s is not None and self._settings.adaptive:  # only adaptive mode reads the latency model
                self._queue.record_batch(sum(p.size for p in batch), run_s)
            if self._closing:
                self._cond.notify_all()  # workers waiting for the last batch in flight may now stop
            elif self._queue:
                self._cond.notify()  # a queued batch can start, or (adaptive) a waiting worker's decision may change

    def _next_batch(self) -> list[Pending] | None:
        with self._cond:
            while True:
                now = self._clock()
                expired = self._queue.expire(now)
                for pending in expired:
                    self._fail(pending, RequestTimeout(f"expired after {now - pending.enqueued_at:.3f} s in the queue"))
                if expired:
                    self._observer.queue_depth(len(self._queue))
                free = self._settings.instances - self._busy
                if free <= 0:  # every instance runs a batch (a request thread may run its own): wait for one
                    self._cond.wait()
                    continue
                decision = self._queue.take(now, flush=self._closing, free_instances=free)
                if isinstance(decision, list):
                    self._busy += 1
                    self._observer.queue_depth(len(self._queue))
                    if self._queue:
                        self._cond.notify()  # another worker may start the next batch
                    return decision
                if decision is None and self._closing and not self._busy:
                    return None
                self._cond.wait(None if decision is None else max(0.0, decision - now))

    def _fail(self, pending: Pending, error: Exception) -> None:
        if pending.future.set_running_or_notify_cancel():
            pending.future.set_exception(error)
        self._observer.rejected("timeout")

    def _run(self, batch: list[Pending]) -> float | None:
        """Run one batch and answer its futures; returns the model's run time (None when not run or failed)."""
        started = self._clock()
        batch = [p for p in batch if p.future.set_running_or_notify_cancel()]  # callers that gave up
        if not batch:
            return None
        sizes = [p.size for p in batch]
        try:
            inputs = merge([p.inputs for p in batch], self._padding)
            wanted = requested_outputs(batch)
            run_started = self._clock()
            outputs = self._run_batch(inputs) if wanted is None else self._run_batch(inputs, wanted)
            run_s = self._clock() - run_started
            parts = split(outputs, sizes, [p.length for p in batch], self._padding)
        except Exception as exc:  # the model's failure belongs to this batch only
            log.error("batch of %d request(s) failed", len(batch), exc_info=True)  # the trace stays here
            error = ComputeError(f"model run failed: {public_message(exc)}")
            for pending in batch:
                pending.future.set_exception(error)
            self._observer.batch_done(sum(sizes), [started - p.enqueued_at for p in batch],
                                      self._clock() - started, ok=False)
            return None
        compute_s = self._clock() - started
        for pending, part in zip(batch, parts):
            pending.future.set_result(part)
        self._observer.batch_done(sum(sizes), [started - p.enqueued_at for p in batch], compute_s, ok=True)
        return run_s


def requested_outputs(batch: list[Pending]) -> tuple[str, ...] | None:
    """The outputs to compute for a batch: those its requests asked for when they all asked for the same
    ones, else None (all outputs)."""
    first = batch[0].outputs
    return first if all(p.outputs == first for p in batch) else None
