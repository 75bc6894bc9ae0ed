"""Dynamic request batcher: worker threads that run batches from a BatchQueue and answer each request's future.

It knows nothing of Flask or ONNX Runtime: it is given a `run_batch` callable, plain settings and a clock.
The queue and Triton's dispatch rule live in batch_queue.py, adaptive waiting in latency_model.py, merging,
splitting and padding tensors in tensors.py.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Protocol, Sequence

from latlab.server.batching.batch_queue import BatchQueue, Pending, Slot
from latlab.server.batching.tensors import Tensors, merge, request_length, shape_key, split
from latlab.common.settings import BatcherSettings, PaddingSettings
from latlab.server.errors import ComputeError, ModelNotReady, QueueFull, RequestTimeout, public_message

__all__ = ["BatchMetrics", "DynamicBatcher", "requested_outputs"]
log = logging.getLogger("latlab.server.batching.batcher")
WAIT_MARGIN_S = 5.0
"""How long past the deployment's timeout a caller still waits for its slot (see DynamicBatcher.wait_limit_s)."""


class BatchMetrics(Protocol):
    """What the batcher reports to its metrics (metrics.DeploymentMetrics implements it)."""

    def queue_depth(self, depth: int) -> None: ...
    def rejected(self, reason: str) -> None: ...
    def batch_done(self, size: int, queue_s: Sequence[float], compute_s: float, ok: bool) -> None: ...
    def positions_run(self, run: int, real: int) -> None: ...


class _NoMetrics:
    def queue_depth(self, depth: int) -> None: ...
    def rejected(self, reason: str) -> None: ...
    def batch_done(self, size: int, queue_s: Sequence[float], compute_s: float, ok: bool) -> None: ...
    def positions_run(self, run: int, real: int) -> None: ...


class DynamicBatcher:
    """Runs batches from a BatchQueue on `settings.instances` worker threads; callers get futures.

    Workers sleep on a condition variable until a request arrives, a batch finishes (adaptive mode) or
    the computed send time comes: no polling, so an idle deployment costs no CPU. With `padding`,
    requests of different lengths on the padded axis share a batch (see server/batching/tensors.py).

    `run_batch(inputs)` runs one merged batch; when every request of a batch named the same outputs it is
    called as `run_batch(inputs, outputs)` and need only return those."""

    def __init__(
        self,
        run_batch: Callable[..., Tensors],
        settings: BatcherSettings,
        metrics: BatchMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        name: str = "batcher",
        padding: PaddingSettings | None = None,
    ) -> None:
        self._run_batch = run_batch
        self._settings = settings
        self._padding = padding if padding and padding.values else None
        self._queue = BatchQueue(settings)
        self._metrics = metrics or _NoMetrics()
        self._clock = clock
        self._timeout_s = settings.timeout_ms / 1000.0
        self._cond = threading.Condition()
        self._closing = False
        self._busy = 0
        self._parked_until: float | None = None
        """When the lone worker, parked, looks again at a queue it would only wait on (None: it is not parked so,
        and every arrival wakes it). See _must_wake."""
        self._may_park = (
            settings.instances == 1
            and settings.priority_levels == 1
            and not settings.adaptive
            and not settings.preferred_batch_sizes
        )
        self._workers = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(settings.instances)
        ]
        for worker in self._workers:
            worker.start()

    def submit(
        self,
        inputs: Tensors,
        size: int,
        timeout_s: float | None = None,
        priority: int = 0,
        outputs: Sequence[str] | None = None,
        run_here: bool = False,
        wake: bool = True,
        requests: int = 1,
    ) -> Slot:
        """Queue one request of `size` samples; raises QueueFull/ModelNotReady/BadRequest at once instead of
        waiting. `timeout_s` may only shorten the deployment's timeout; `priority` 1 is the highest level,
        0 the deployment's default; `outputs` names the outputs the request needs (None: all).

        `run_here`: a request that finds the queue empty, an instance free and the dispatch rule sending it alone
        at once runs on the calling thread (the slot is answered on return): the batch it would have formed is
        itself, and the hand-over to a worker and back (two thread wake-ups, dear where idle cores sleep:
        docs/performance.md) is saved.

        `wake` False: the workers are not woken for this arrival; the caller calls `wake` soon after (an event loop
        that queues several requests in one pass wakes a worker once for all of them).

        `requests`: how many clients' requests these inputs stack (Pending.requests), answered together."""
        pending = self._pending(inputs, size, timeout_s, priority, outputs, requests)
        with self._cond:
            free = self._settings.instances - self._busy
            if not run_here or self._queue or free < 1 or self._closing:
                direct = False
                self._put(pending, free)
            else:  # decided at arrival, never queued: the queue stays empty and its gauge untouched
                direct = self._queue.sends_alone(pending, free)
                if not direct:
                    self._metrics.queue_depth(len(self._queue))
            if direct:
                self._busy += 1
            elif wake and self._must_wake((pending,)):
                self._cond.notify()
        if direct:
            run_s = None
            try:
                run_s = self._run([pending])
            finally:
                self._finish_batch([pending], run_s)
        return pending.future

    def submit_many(self, requests: Sequence[tuple], wake: bool = True) -> list[Slot | Exception]:
        """Queue a group of requests, each given as `submit`'s first five arguments (inputs, size, timeout_s,
        priority, outputs) and optionally the requests they stack, in the order given, under one lock, with one
        write of the queue-depth gauge (a file write in multiprocess mode) and one worker wake-up for the whole
        group instead of one of each per request: the engine process submits together what it read from the front
        ends together.

        Returns each request's outcome in the order given: its slot, or the error `submit` would have raised for it
        (QueueFull, BadRequest, ModelNotReady); a request's error is its own, never its group's. Nothing runs on
        the calling thread (see `submit`'s run_here for a lone request)."""
        pendings: list[Pending | Exception] = []
        for arguments in requests:
            try:
                pendings.append(self._pending(*arguments))
            except Exception as exc:  # noqa: BLE001 - the request's error is its outcome, not its group's
                pendings.append(exc)
        with self._cond:
            free = self._settings.instances - self._busy
            outcomes = [p if isinstance(p, Exception) else self._queued(p, free) for p in pendings]
            if any(isinstance(outcome, Slot) for outcome in outcomes):
                self._metrics.queue_depth(len(self._queue))
                if wake and self._must_wake([p for p in pendings if not isinstance(p, Exception)]):
                    self._cond.notify()
        return outcomes

    def _queued(self, pending: Pending, free_instances: int) -> Slot | Exception:
        """submit_many's queueing of one request (the caller holds the lock): its slot, or its error."""
        try:
            self._queue_one(pending, free_instances)
        except Exception as exc:  # noqa: BLE001 - the request's error is its outcome, not its group's
            return exc
        return pending.future

    def wake(self) -> None:
        """Wake a worker to look at the queue: for arrivals submitted with `wake` False."""
        with self._cond:
            self._parked_until = None
            self._cond.notify()

    def _must_wake(self, arrivals: Sequence[Pending]) -> bool:
        """Whether queued arrivals must wake the worker (the caller holds the lock). A lone worker parked until
        the send time of a batch that is not full would, woken, only compute that time again, unless the arrivals
        fill a batch (or leave one that no longer fits: more samples than max_batch_size in all) or expire before
        it. With one priority level the batch it waits for keeps its oldest request whatever arrives, so its send
        time cannot come earlier; adaptive waits and preferred sizes decide from what arrived, so they always
        wake. Each wake-up saved is a thread switch and an interpreter hand-over."""
        until = self._parked_until
        if until is None or self._closing or self._queue.samples >= self._settings.max_batch_size:
            self._parked_until = None  # woken: it looks at everything queued
            return True
        if any(p.deadline < until for p in arrivals):
            self._parked_until = None
            return True
        return False

    def infer(
        self,
        inputs: Tensors,
        size: int,
        timeout_s: float | None = None,
        priority: int = 0,
        outputs: Sequence[str] | None = None,
    ) -> Tensors:
        """Submit (running a lone request here: `submit`'s run_here) and wait for the result: the request
        thread's call."""
        slot = self.submit(inputs, size, timeout_s, priority, outputs, run_here=True)
        try:
            return slot.result(timeout=self.wait_limit_s)
        except TimeoutError:
            slot.cancel()
            raise self.gave_up() from None

    @property
    def wait_limit_s(self) -> float:
        """How long a caller waits on a slot before giving up: the worker expires a request at its deadline, and
        the margin past it only guards a stuck model run."""
        return self._timeout_s + WAIT_MARGIN_S

    def gave_up(self) -> RequestTimeout:
        """The error of a caller that waited wait_limit_s in vain (it cancels its slot)."""
        return RequestTimeout(f"no result within {self._timeout_s:.3f} s")

    def _pending(
        self,
        inputs: Tensors,
        size: int,
        timeout_s: float | None,
        priority: int,
        outputs: Sequence[str] | None,
        requests: int = 1,
    ) -> Pending:
        now = self._clock()
        timeout_s = self._timeout_s if timeout_s is None else min(timeout_s, self._timeout_s)
        return Pending(
            inputs,
            size,
            now,
            now + timeout_s,
            shape_key=shape_key(inputs, self._padding),
            priority=priority,
            length=request_length(inputs, self._padding),
            outputs=None if outputs is None else tuple(outputs),
            requests=requests,
        )

    def _put(self, pending: Pending, free_instances: int = 0) -> None:
        """Queue it and show the queue's depth (the caller holds the lock)."""
        self._queue_one(pending, free_instances)
        self._metrics.queue_depth(len(self._queue))

    def _queue_one(self, pending: Pending, free_instances: int) -> None:
        """Queue it, counting a refusal, without touching the depth gauge (the caller holds the lock). A stack that
        does not fit whole is refused uncounted: its submitter (the engine) queues its requests one by one, so that
        those that fit get in and each refused one counts once."""
        if self._closing:
            raise ModelNotReady("deployment is shutting down")
        try:
            self._queue.put(pending, free_instances)
        except QueueFull:
            if pending.requests == 1:
                self._metrics.rejected("queue_full")
            raise

    def refuse_if_full(self) -> None:
        """Raise QueueFull, counting the rejection, when the queue is full right now. Read without the lock:
        a racy snapshot, enough to refuse a request before its body is read; submit's own check, under the
        lock, stays the authority for the requests let through."""
        if self._queue.full_for(self._settings.instances - self._busy):
            self._metrics.rejected("queue_full")
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
            self._parked_until = None
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
                    self._metrics.queue_depth(len(self._queue))
                free = self._settings.instances - self._busy
                if free <= 0:  # every instance runs a batch (a request thread may run its own): wait for one
                    self._cond.wait()
                    continue
                decision = self._queue.take(now, flush=self._closing, free_instances=free)
                if isinstance(decision, list):
                    self._busy += 1
                    self._metrics.queue_depth(len(self._queue))
                    if self._queue:
                        self._cond.notify()  # another worker may start the next batch
                    return decision
                if decision is None and self._closing and not self._busy:
                    return None
                if decision is not None and self._may_park and not self._closing:
                    self._parked_until = decision
                self._cond.wait(None if decision is None else max(0.0, decision - now))
                self._parked_until = None

    def _fail(self, pending: Pending, error: Exception) -> None:
        if pending.future.set_running_or_notify_cancel():
            pending.future.set_exception(error)
        for _ in range(pending.requests):
            self._metrics.rejected("timeout")

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
            self._metrics.batch_done(sum(sizes), queue_times(batch, started), self._clock() - started, ok=False)
            return None
        compute_s = self._clock() - started
        for pending, part in zip(batch, parts):
            pending.future.set_result(part)
        self._metrics.batch_done(sum(sizes), queue_times(batch, started), compute_s, ok=True)
        if self._padding:  # what mixing lengths cost: positions computed, never asked for
            lengths = [p.length for p in batch]
            self._metrics.positions_run(sum(sizes) * max(lengths), sum(s * n for s, n in zip(sizes, lengths)))
        return run_s


def queue_times(batch: list[Pending], started: float) -> list[float]:
    """Each request's time in the queue until its batch started (a stack's requests each count)."""
    return [started - p.enqueued_at for p in batch for _ in range(p.requests)]


def requested_outputs(batch: list[Pending]) -> tuple[str, ...] | None:
    """The outputs to compute for a batch: those its requests asked for when they all asked for the same
    ones, else None (all outputs)."""
    first = batch[0].outputs
    return first if all(p.outputs == first for p in batch) else None
