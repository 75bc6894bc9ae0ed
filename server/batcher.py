"""Dynamic request batcher: a bounded queue, Triton's dispatch rule, worker threads and futures.

It knows nothing of Flask or ONNX Runtime: it is given a `run_batch` callable, plain settings and a clock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np

from latlab.server.config import BatcherSettings
from latlab.server.errors import BadRequest, ComputeError, ModelNotReady, QueueFull, RequestTimeout, public_message

Tensors = dict[str, np.ndarray]
log = logging.getLogger("latlab.server.batcher")


@dataclass
class Pending:
    """One queued request: its inputs, its batch dimension and the future its caller waits on."""

    inputs: Tensors
    size: int
    enqueued_at: float
    deadline: float
    future: Future = field(default_factory=Future)
    shape_key: tuple = ()
    """Every input's trailing dimensions: only requests with the same key are batched together."""


def batch_to_send(now: float, sizes: Sequence[int], oldest_enqueued_at: float, max_batch_size: int,
                  max_queue_delay_s: float, preferred: Sequence[int] = ()) -> int | float | None:
    """Triton's rule. Returns how many queued requests to send now (int), when to look again (float),
    or None when the queue is empty. `sizes` are the batch dimensions of the queued requests that may
    join one batch, oldest first. Send at once when the batch is full, the next request does not fit,
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
    """The batcher's state without threads: bounded FIFO, expiry and batch formation at a given time."""

    def __init__(self, settings: BatcherSettings) -> None:
        self.settings = settings
        self._queue: deque[Pending] = deque()
        self._delay_s = settings.max_queue_delay_ms / 1000.0

    def __len__(self) -> int:
        return len(self._queue)

    def put(self, pending: Pending) -> None:
        if pending.size > self.settings.max_batch_size:
            raise BadRequest(f"batch of {pending.size} exceeds this deployment's max_batch_size "
                             f"{self.settings.max_batch_size}")
        if len(self._queue) >= self.settings.max_queue_size:
            raise QueueFull(f"queue is full ({self.settings.max_queue_size} requests waiting)")
        self._queue.append(pending)

    def expire(self, now: float) -> list[Pending]:
        """Remove and return the requests whose deadline has passed; they must never be computed."""
        expired = [p for p in self._queue if p.deadline <= now]
        if expired:
            self._queue = deque(p for p in self._queue if p.deadline > now)
        return expired

    def take(self, now: float, flush: bool = False) -> list[Pending] | float | None:
        """The batch to run now, or the time to look again, or None when empty.
        `flush` sends whatever is queued without waiting (used while draining)."""
        if not self._queue:
            return None
        limit = self.settings.max_batch_size
        oldest = self._queue[0]
        # Requests of other trailing shapes cannot share a tensor: group the oldest's shape (from
        # anywhere in the queue, in arrival order); the others form the next batches.
        group = [p for p in self._queue if p.shape_key == oldest.shape_key][:limit]
        decision = batch_to_send(now, [p.size for p in group], oldest.enqueued_at, limit,
                                 0.0 if flush else self._delay_s, self.settings.preferred_batch_sizes)
        if isinstance(decision, float):
            # Wake for the first deadline too, so an expired request is answered at its deadline.
            return min(decision, min(p.deadline for p in self._queue))
        chosen = group[:decision]
        if all(a is b for a, b in zip(chosen, self._queue)):
            for _ in chosen:
                self._queue.popleft()
        else:
            taken = {id(p) for p in chosen}
            self._queue = deque(p for p in self._queue if id(p) not in taken)
        return chosen


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

    Workers sleep on a condition variable until a request arrives or the oldest one's delay runs out:
    no polling, so an idle deployment costs no CPU."""

    def __init__(self, run_batch: Callable[[Tensors], Tensors], settings: BatcherSettings,
                 observer: BatchObserver | None = None, clock: Callable[[], float] = time.monotonic,
                 name: str = "batcher") -> None:
        self._run_batch = run_batch
        self._queue = BatchQueue(settings)
        self._observer = observer or _NoObserver()
        self._clock = clock
        self._timeout_s = settings.timeout_ms / 1000.0
        self._cond = threading.Condition()
        self._closing = False
        self._workers = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
                         for i in range(settings.instances)]
        for worker in self._workers:
            worker.start()

    def submit(self, inputs: Tensors, size: int, timeout_s: float | None = None) -> Future:
        """Queue one request of `size` samples; raises QueueFull/ModelNotReady at once instead of waiting.
        `timeout_s` may only shorten the deployment's timeout."""
        now = self._clock()
        timeout_s = self._timeout_s if timeout_s is None else min(timeout_s, self._timeout_s)
        shape_key = tuple((name, array.shape[1:]) for name, array in sorted(inputs.items()))
        pending = Pending(inputs, size, now, now + timeout_s, shape_key=shape_key)
        with self._cond:
            if self._closing:
                raise ModelNotReady("deployment is shutting down")
            try:
                self._queue.put(pending)
            except QueueFull:
                self._observer.rejected("queue_full")
                raise
            self._observer.queue_depth(len(self._queue))
            self._cond.notify()
        return pending.future

    def infer(self, inputs: Tensors, size: int, timeout_s: float | None = None) -> Tensors:
        """Submit and wait for the result (the request thread's call)."""
        future = self.submit(inputs, size, timeout_s)
        try:
            # The worker expires the request at its deadline; the margin only guards a stuck model run.
            return future.result(timeout=self._timeout_s + 5.0)
        except TimeoutError:
            future.cancel()
            raise RequestTimeout(f"no result within {self._timeout_s:.3f} s") from None

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
            self._run(batch)

    def _next_batch(self) -> list[Pending] | None:
        with self._cond:
            while True:
                now = self._clock()
                expired = self._queue.expire(now)
                for pending in expired:
                    self._fail(pending, RequestTimeout(f"expired after {now - pending.enqueued_at:.3f} s in the queue"))
                if expired:
                    self._observer.queue_depth(len(self._queue))
                decision = self._queue.take(now, flush=self._closing)
                if isinstance(decision, list):
                    self._observer.queue_depth(len(self._queue))
                    if self._queue:
                        self._cond.notify()  # another worker may start the next batch
                    return decision
                if decision is None and self._closing:
                    return None
                self._cond.wait(None if decision is None else max(0.0, decision - now))

    def _fail(self, pending: Pending, error: Exception) -> None:
        if pending.future.set_running_or_notify_cancel():
            pending.future.set_exception(error)
        self._observer.rejected("timeout")

    def _run(self, batch: list[Pending]) -> None:
        started = self._clock()
        batch = [p for p in batch if p.future.set_running_or_notify_cancel()]  # callers that gave up
        if not batch:
            return
        sizes = [p.size for p in batch]
        try:
            outputs = self._run_batch(merge([p.inputs for p in batch]))
            parts = split(outputs, sizes)
        except Exception as exc:  # the model's failure belongs to this batch only
            log.error("batch of %d request(s) failed", len(batch), exc_info=True)  # the trace stays here
            error = ComputeError(f"model run failed: {public_message(exc)}")
            for pending in batch:
                pending.future.set_exception(error)
            self._observer.batch_done(sum(sizes), [started - p.enqueued_at for p in batch],
                                      self._clock() - started, ok=False)
            return
        compute_s = self._clock() - started
        for pending, part in zip(batch, parts):
            pending.future.set_result(part)
        self._observer.batch_done(sum(sizes), [started - p.enqueued_at for p in batch], compute_s, ok=True)


def merge(requests: list[Tensors]) -> Tensors:
    """Concatenate the requests' inputs along the batch axis (no copy for a single request)."""
    if len(requests) == 1:
        return requests[0]
    return {name: np.concatenate([r[name] for r in requests]) for name in requests[0]}


def split(outputs: Tensors, sizes: list[int]) -> list[Tensors]:
    """Cut each batched output back into the requests' parts, in order."""
    if len(sizes) == 1:
        return [outputs]
    cuts = np.cumsum(sizes)[:-1]
    per_output = {name: np.split(array, cuts) for name, array in outputs.items()}
    return [{name: parts[i] for name, parts in per_output.items()} for i in range(len(sizes))]
