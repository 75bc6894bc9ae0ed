"""latlab.server.batching.batch_queue: the pure dispatch rule, BatchQueue on plain floats as the clock, and Slot."""

from __future__ import annotations

import threading
import time
from concurrent.futures import CancelledError

import numpy as np
import pytest

from latlab.server.batching.batch_queue import BatchQueue, Pending, Slot, batch_to_send
from latlab.server.config import BatcherSettings
from latlab.server.errors import BadRequest, ComputeError, QueueFull

RESULT_WAIT_S = 2.0  # generous bound on a waiting thread below


# --- batch_to_send: the pure rule ------------------------------------------------------------------


def test_empty_queue_gives_none() -> None:
    assert batch_to_send(5.0, [], 0.0, max_batch_size=8, max_queue_delay_s=0.01) is None


def test_full_batch_is_sent_at_once() -> None:
    assert batch_to_send(0.0, [1] * 8, 0.0, max_batch_size=8, max_queue_delay_s=10.0) == 8


def test_full_batch_from_mixed_sizes() -> None:
    assert batch_to_send(0.0, [3, 5], 0.0, max_batch_size=8, max_queue_delay_s=10.0) == 2


def test_more_than_a_batch_queued_sends_only_what_fits() -> None:
    assert batch_to_send(0.0, [1] * 12, 0.0, max_batch_size=8, max_queue_delay_s=10.0) == 8


def test_partial_batch_waits_until_oldest_plus_delay() -> None:
    decision = batch_to_send(1.0, [1, 1], oldest_enqueued_at=0.5, max_batch_size=8, max_queue_delay_s=2.0)
    assert isinstance(decision, float)
    assert decision == pytest.approx(2.5)


def test_partial_batch_is_sent_once_the_delay_has_passed() -> None:
    assert batch_to_send(2.5, [1, 1], 0.5, max_batch_size=8, max_queue_delay_s=2.0) == 2
    assert batch_to_send(9.0, [1, 1], 0.5, max_batch_size=8, max_queue_delay_s=2.0) == 2


def test_request_that_does_not_fit_ends_the_batch() -> None:
    # 3 + 4 = 7 fits, the next 2 would make 9 > 8: send the 2 that fit now, without waiting.
    assert batch_to_send(0.0, [3, 4, 2], 0.0, max_batch_size=8, max_queue_delay_s=10.0) == 2


def test_rule_does_not_skip_ahead_to_a_later_request_that_would_fit() -> None:
    # FIFO: the 6 does not fit after the 3, so the 1 behind it waits for the next batch.
    assert batch_to_send(0.0, [3, 6, 1], 0.0, max_batch_size=8, max_queue_delay_s=10.0) == 1


def test_zero_delay_sends_at_once() -> None:
    assert batch_to_send(0.0, [1], 0.0, max_batch_size=8, max_queue_delay_s=0.0) == 1
    assert batch_to_send(0.0, [2, 3], 0.0, max_batch_size=8, max_queue_delay_s=0.0) == 2


def test_max_batch_size_one_sends_each_request_alone() -> None:
    assert batch_to_send(0.0, [1, 1, 1], 0.0, max_batch_size=1, max_queue_delay_s=5.0) == 1


def test_count_is_an_int_and_wait_is_a_float() -> None:
    assert type(batch_to_send(0.0, [1] * 4, 0.0, 4, 1.0)) is int
    assert type(batch_to_send(0.0, [1], 0, 4, 1)) is float


# --- BatchQueue with plain floats as the clock -------------------------------------------------------


def settings(**overrides: object) -> BatcherSettings:
    base = dict(max_batch_size=4, max_queue_delay_ms=100.0, max_queue_size=16, timeout_ms=1000.0)
    base.update(overrides)
    return BatcherSettings(**base)


def pending(at: float, size: int = 1, deadline: float | None = None, tag: int = 0) -> Pending:
    return Pending({"x": np.full((size, 1), tag, np.float32)}, size, at, at + 10.0 if deadline is None else deadline)


def test_queue_dispatches_when_max_batch_size_samples_are_reached() -> None:
    queue = BatchQueue(settings(max_batch_size=4))
    items = [pending(0.0), pending(0.001, size=2), pending(0.002)]
    for item in items:
        queue.put(item)
    assert queue.take(0.002) == [*items]
    assert len(queue) == 0


def test_queue_waits_until_oldest_plus_delay_and_then_dispatches() -> None:
    queue = BatchQueue(settings(max_batch_size=4, max_queue_delay_ms=100.0))
    first, second = pending(1.0), pending(1.08)
    queue.put(first)
    assert queue.take(1.0) == pytest.approx(1.1)
    queue.put(second)
    # The newer request does not push the send time back: the delay counts from the oldest.
    assert queue.take(1.08) == pytest.approx(1.1)
    assert queue.take(1.0999) == pytest.approx(1.1)
    assert queue.take(1.1) == [first, second]
    assert queue.take(1.1) is None


def test_queue_take_on_empty_is_none() -> None:
    assert BatchQueue(settings()).take(0.0) is None


def test_queue_request_that_does_not_fit_ends_the_batch() -> None:
    queue = BatchQueue(settings(max_batch_size=4, max_queue_delay_ms=1000.0))
    a, b, c = pending(0.0, 3), pending(0.0, 2), pending(0.0, 1)
    for item in (a, b, c):
        queue.put(item)
    assert queue.take(0.0) == [a]  # 3 + 2 > 4: a goes alone, at once
    assert queue.take(0.0) == pytest.approx(1.0)  # b + c = 3 < 4 and nothing is left over: wait
    assert queue.take(1.0) == [b, c]
    assert len(queue) == 0


def test_queue_waits_for_the_rest_of_a_partial_batch() -> None:
    queue = BatchQueue(settings(max_batch_size=4, max_queue_delay_ms=1000.0))
    a, b = pending(0.0, 3), pending(0.5, 2)
    queue.put(a)
    queue.put(b)
    assert queue.take(0.5) == [a]
    # b is now the oldest: it waits its own delay from when it was enqueued.
    assert queue.take(0.5) == pytest.approx(1.5)
    assert queue.take(1.5) == [b]


def test_queue_zero_delay_dispatches_at_once() -> None:
    queue = BatchQueue(settings(max_batch_size=8, max_queue_delay_ms=0.0))
    item = pending(3.0)
    queue.put(item)
    assert queue.take(3.0) == [item]


def test_queue_flush_sends_at_once() -> None:
    queue = BatchQueue(settings(max_batch_size=8, max_queue_delay_ms=10_000.0))
    items = [pending(0.0), pending(0.0)]
    for item in items:
        queue.put(item)
    assert isinstance(queue.take(0.0), float)
    assert queue.take(0.0, flush=True) == items


def test_queue_flush_still_respects_max_batch_size() -> None:
    queue = BatchQueue(settings(max_batch_size=2, max_queue_delay_ms=10_000.0))
    items = [pending(0.0, tag=i) for i in range(5)]
    for item in items:
        queue.put(item)
    assert queue.take(0.0, flush=True) == items[:2]
    assert queue.take(0.0, flush=True) == items[2:4]
    assert queue.take(0.0, flush=True) == items[4:]


def test_queue_full_raises_queue_full() -> None:
    queue = BatchQueue(settings(max_queue_size=2))
    queue.put(pending(0.0))
    queue.put(pending(0.0))
    with pytest.raises(QueueFull, match=r"queue is full \(2 requests waiting\)"):
        queue.put(pending(0.0))
    assert len(queue) == 2
    queue.take(10.0)
    queue.put(pending(10.0))  # room again once a batch left


def test_requests_a_free_instance_will_take_are_not_counted_as_waiting() -> None:
    """The deployment admits max_queue_size + instances x max_batch_size; requests that complete a batch a free
    instance takes at once must not be refused by the queue's bound for them (they arrived before the worker
    dequeued the first). Requests an idle instance holds while its batch fills do count, as in Triton."""
    queue = BatchQueue(settings(max_queue_size=2, max_batch_size=2))
    for _ in range(2 + 2):  # a full batch a free instance takes, and two waiting
        queue.put(pending(0.0), free_instances=1)
    with pytest.raises(QueueFull):
        queue.put(pending(0.0), free_instances=1)
    assert queue.full_for(1) and not queue.full_for(2)  # a second free instance would take the next batch too
    filling = BatchQueue(settings(max_queue_size=1, max_batch_size=4))
    filling.put(pending(0.0), free_instances=1)
    with pytest.raises(QueueFull):  # a batch still filling: max_queue_size is the bound
        filling.put(pending(0.0), free_instances=1)
    assert len(queue) == 4 and len(filling) == 1


def test_queue_refuses_a_request_larger_than_max_batch_size() -> None:
    queue = BatchQueue(settings(max_batch_size=4))
    with pytest.raises(BadRequest, match="batch of 5 exceeds this deployment's max_batch_size 4"):
        queue.put(pending(0.0, size=5))
    assert len(queue) == 0
    queue.put(pending(0.0, size=4))  # exactly max_batch_size is fine


def test_queue_expire_removes_only_requests_past_their_deadline() -> None:
    queue = BatchQueue(settings(max_batch_size=8))
    late, on_time, at_deadline = pending(0.0, deadline=1.0), pending(0.0, deadline=5.0), pending(0.0, deadline=2.0)
    for item in (late, on_time, at_deadline):
        queue.put(item)
    assert queue.expire(0.5) == []
    assert queue.expire(2.0) == [late, at_deadline]
    assert len(queue) == 1
    assert queue.take(10.0) == [on_time]


def test_queue_expire_keeps_order_of_the_survivors() -> None:
    queue = BatchQueue(settings(max_batch_size=8, max_queue_delay_ms=0.0))
    items = [pending(0.0, deadline=d, tag=i) for i, d in enumerate([3.0, 1.0, 4.0, 1.0, 5.0])]
    for item in items:
        queue.put(item)
    queue.expire(2.0)
    assert queue.take(2.0) == [items[0], items[2], items[4]]


def test_queue_delay_counts_from_the_new_oldest_after_expiry() -> None:
    queue = BatchQueue(settings(max_batch_size=8, max_queue_delay_ms=1000.0))
    queue.put(pending(0.0, deadline=0.2))
    queue.put(pending(0.5))
    queue.expire(0.3)
    assert queue.take(0.3) == pytest.approx(1.5)


def test_sends_alone_queues_a_request_the_rule_holds() -> None:
    queue = BatchQueue(settings(max_batch_size=4, max_queue_delay_ms=10.0))
    held = pending(at=1.0)
    assert queue.sends_alone(held, free_instances=1) is False
    assert len(queue) == 1 and queue.take(1.005) == pytest.approx(1.010)
    assert queue.take(1.010) == [held]
    queue.put(pending(at=2.0))
    with pytest.raises(RuntimeError):  # only for an empty queue: otherwise it would overtake the queued
        queue.sends_alone(pending(at=2.1), free_instances=1)
    alone = BatchQueue(settings(max_batch_size=1))
    assert alone.sends_alone(pending(at=3.0), free_instances=1) is True and len(alone) == 0


# --- preferred sizes, shapes that cannot share a batch ------------------------------------------


def test_a_preferred_size_is_sent_without_waiting_out_the_delay():
    assert batch_to_send(0.0, [1, 1, 1], 0.0, 8, 1.0, preferred=(2, 3)) == 3
    assert batch_to_send(0.0, [1, 1, 1], 0.0, 8, 1.0, preferred=(2,)) == 2
    assert batch_to_send(0.0, [1, 1, 1], 0.0, 8, 1.0, preferred=(4,)) == 1.0  # not reached: wait


def test_requests_of_another_shape_are_grouped_apart_and_never_mixed():
    queue = BatchQueue(BatcherSettings(max_batch_size=8, max_queue_delay_ms=1000.0))
    short = {"x": np.zeros((1, 3), np.float32)}
    long = {"x": np.zeros((1, 5), np.float32)}
    for inputs in [short, long, short, short]:
        queue.put(Pending(inputs, 1, 0.0, 100.0, shape_key=(("x", inputs["x"].shape[1:]),)))
    assert queue.take(0.5) == 1.0  # the oldest's group waits for company as usual
    first = queue.take(1.0)
    assert [p.inputs["x"].shape[1] for p in first] == [3, 3, 3]  # gathered past the long one
    second = queue.take(1.0)
    assert [p.inputs["x"].shape[1] for p in second] == [5]  # its delay has run out too
    assert queue.take(1.0) is None


# --- Slot: the request's future ---------------------------------------------------------------------


def test_slot_answers_every_call_and_only_once() -> None:
    slot = Slot()
    assert not slot.done() and slot.set_running_or_notify_cancel()
    slot.set_result({"y": 1})
    assert slot.done() and slot.result(0) == {"y": 1} and slot.result() == {"y": 1}
    with pytest.raises(RuntimeError, match="already finished"):
        slot.set_exception(ValueError("late"))
    failed = Slot()
    failed.set_exception(ComputeError("model run failed"))
    for _ in range(2):
        with pytest.raises(ComputeError):
            failed.result(0)


def test_slot_timeout_and_cancel() -> None:
    slot = Slot()
    started = time.monotonic()
    wait_s = 0.05
    with pytest.raises(TimeoutError):
        slot.result(wait_s)
    assert time.monotonic() - started >= 0.8 * wait_s  # waited (a lower bound: no machine is faster)
    assert slot.cancel() and slot.cancel() and slot.done()
    assert not slot.set_running_or_notify_cancel()  # a worker must not compute it
    with pytest.raises(CancelledError):
        slot.result(0)
    running = Slot()
    assert running.set_running_or_notify_cancel() and not running.cancel()  # too late to cancel


def test_slot_wakes_a_waiting_thread() -> None:
    slot, got = Slot(), []
    waiter = threading.Thread(target=lambda: got.append(slot.result(RESULT_WAIT_S)))
    waiter.start()
    time.sleep(0.02)
    slot.set_result(42)
    waiter.join(RESULT_WAIT_S)
    assert got == [42]
