"""latlab.server.batching.batcher: DynamicBatcher on real threads (the queue and its rule: test_batch_queue.py)."""

from __future__ import annotations

import threading
import types
import time

import numpy as np
import pytest

from latlab.server.batching import batcher as batcher_module
from latlab.server.batching.batcher import DynamicBatcher
from latlab.server.config import BatcherSettings
from latlab.server.errors import BadRequest, ComputeError, ModelNotReady, QueueFull, RequestTimeout

RESULT_WAIT_S = 2.0  # generous bound on any future below; the batcher answers in milliseconds


# --- DynamicBatcher on real threads ----------------------------------------------------------------


def settings(**overrides: object) -> BatcherSettings:
    base = dict(max_batch_size=4, max_queue_delay_ms=100.0, max_queue_size=16, timeout_ms=1000.0)
    base.update(overrides)
    return BatcherSettings(**base)


class Recorder:
    """A run_batch that doubles x and records the batch sizes it was given."""

    def __init__(self, fail_when: object = None) -> None:
        self.sizes: list[int] = []
        self.fail_when = fail_when
        self.lock = threading.Lock()

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self.lock:
            self.sizes.append(len(inputs["x"]))
        if self.fail_when is not None and self.fail_when(inputs):
            raise RuntimeError("boom from the model")
        return {"y": inputs["x"] * 2}


class MetricsRecorder:
    def __init__(self) -> None:
        self.batches: list[tuple[int, int, bool]] = []
        self.rejections: list[str] = []
        self.depths: list[int] = []

    def queue_depth(self, depth: int) -> None:
        self.depths.append(depth)

    def rejected(self, reason: str) -> None:
        self.rejections.append(reason)

    def batch_done(self, size: int, queue_s, compute_s: float, ok: bool) -> None:
        assert compute_s >= 0 and all(q >= 0 for q in queue_s)
        self.batches.append((size, len(queue_s), ok))

    def positions_run(self, run: int, real: int) -> None:
        raise AssertionError("these batchers pad nothing")


@pytest.fixture
def batchers():
    """Builds DynamicBatchers and closes every one after the test, so no worker thread outlives it."""
    made: list[DynamicBatcher] = []

    def make(run_batch, metrics=None, **overrides: object) -> DynamicBatcher:
        batcher = DynamicBatcher(run_batch, settings(**overrides), metrics, name="test")
        made.append(batcher)
        return batcher

    yield make
    for batcher in made:
        batcher.close(timeout=RESULT_WAIT_S)


def x(n: int, start: float = 0.0) -> np.ndarray:
    return (np.arange(n * 2, dtype=np.float32) + start).reshape(n, 2)


def test_results_are_split_back_to_each_caller(batchers) -> None:
    run = Recorder()
    batcher = batchers(run, max_batch_size=6, max_queue_delay_ms=10_000.0)
    inputs = [x(1, 0), x(2, 100), x(3, 200)]  # 6 samples: one full batch
    futures = [batcher.submit({"x": a}, len(a)) for a in inputs]
    for future, a in zip(futures, inputs):
        np.testing.assert_array_equal(future.result(RESULT_WAIT_S)["y"], a * 2)
    assert run.sizes == [6]


def test_concurrent_single_sample_requests_run_as_one_batch(batchers) -> None:
    run = Recorder()
    batcher = batchers(run, max_batch_size=8, max_queue_delay_ms=10_000.0)
    results: dict[int, np.ndarray] = {}
    barrier = threading.Barrier(8)

    def client(i: int) -> None:
        barrier.wait()
        results[i] = batcher.infer({"x": x(1, 10 * i)}, 1)["y"]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(RESULT_WAIT_S)
    assert run.sizes == [8]
    assert sorted(results) == list(range(8))
    for i, y in results.items():
        np.testing.assert_array_equal(y, x(1, 10 * i) * 2)


def test_partial_batch_is_sent_after_the_delay(batchers) -> None:
    run = Recorder()
    delay_s = 0.05
    batcher = batchers(run, max_batch_size=8, max_queue_delay_ms=delay_s * 1e3)
    started = time.monotonic()
    futures = [batcher.submit({"x": x(1)}, 1) for _ in range(3)]
    for future in futures:
        future.result(RESULT_WAIT_S)
    assert time.monotonic() - started >= 0.9 * delay_s  # waited out the delay (a lower bound: no machine is faster)
    assert run.sizes == [3]


def test_zero_delay_runs_without_waiting(batchers) -> None:
    run = Recorder()
    batcher = batchers(run, max_batch_size=8, max_queue_delay_ms=0.0)
    np.testing.assert_array_equal(batcher.infer({"x": x(2)}, 2)["y"], x(2) * 2)
    assert run.sizes == [2]


def test_model_failure_fails_only_its_batch_and_serving_goes_on(batchers) -> None:
    run = Recorder(fail_when=lambda inputs: bool((inputs["x"] < 0).any()))
    metrics = MetricsRecorder()
    batcher = batchers(run, metrics, max_batch_size=2, max_queue_delay_ms=10_000.0)
    bad = [batcher.submit({"x": -x(1, 1)}, 1), batcher.submit({"x": x(1)}, 1)]  # one full, failing batch
    for future in bad:
        with pytest.raises(ComputeError, match="model run failed: boom from the model"):
            future.result(RESULT_WAIT_S)
    good = [batcher.submit({"x": x(1, 5)}, 1), batcher.submit({"x": x(1, 7)}, 1)]
    np.testing.assert_array_equal(good[0].result(RESULT_WAIT_S)["y"], x(1, 5) * 2)
    np.testing.assert_array_equal(good[1].result(RESULT_WAIT_S)["y"], x(1, 7) * 2)
    assert run.sizes == [2, 2]
    assert metrics.batches == [(2, 2, False), (2, 2, True)]


def test_output_without_batch_dimension_is_a_compute_error(batchers) -> None:
    batcher = batchers(lambda inputs: {"y": np.float32(1.0)}, max_batch_size=2, max_queue_delay_ms=10_000.0)
    futures = [batcher.submit({"x": x(1)}, 1) for _ in range(2)]
    for future in futures:
        with pytest.raises(ComputeError):
            future.result(RESULT_WAIT_S)


def test_close_drains_queued_work(batchers) -> None:
    run = Recorder()
    metrics = MetricsRecorder()
    batcher = batchers(run, metrics, max_batch_size=2, max_queue_delay_ms=60_000.0)
    inputs = [x(1, 10 * i) for i in range(5)]
    futures = [batcher.submit({"x": a}, 1) for a in inputs]
    assert not any(f.done() for f in futures[4:])  # a partial batch is waiting on its long delay
    batcher.close(timeout=RESULT_WAIT_S)
    assert all(f.done() for f in futures)
    for future, a in zip(futures, inputs):
        np.testing.assert_array_equal(future.result(0)["y"], a * 2)
    assert sorted(run.sizes) == [1, 2, 2]
    assert sum(size for size, _, _ in metrics.batches) == 5


def test_submit_after_close_is_refused(batchers) -> None:
    batcher = batchers(Recorder())
    batcher.close(timeout=RESULT_WAIT_S)
    with pytest.raises(ModelNotReady, match="shutting down"):
        batcher.submit({"x": x(1)}, 1)
    with pytest.raises(ModelNotReady):
        batcher.infer({"x": x(1)}, 1)


def test_close_of_an_idle_batcher_returns_promptly(batchers) -> None:
    batcher = batchers(Recorder(), instances=3)
    started = time.monotonic()
    batcher.close(timeout=RESULT_WAIT_S)
    assert time.monotonic() - started < RESULT_WAIT_S / 2  # woken at once, never waiting out the close timeout


def test_metrics_record_batch_sizes_and_queue_depth(batchers) -> None:
    metrics = MetricsRecorder()
    batcher = batchers(Recorder(), metrics, max_batch_size=3, max_queue_delay_ms=10_000.0)
    for future in [batcher.submit({"x": x(1)}, 1) for _ in range(3)]:  # fills one batch
        future.result(RESULT_WAIT_S)
    for future in [batcher.submit({"x": x(2)}, 2), batcher.submit({"x": x(1)}, 1)]:  # fills another
        future.result(RESULT_WAIT_S)
    assert [size for size, _, _ in metrics.batches] == [3, 3]
    assert [count for _, count, _ in metrics.batches] == [3, 2]
    assert all(ok for _, _, ok in metrics.batches)
    assert metrics.depths[:3] == [1, 2, 3]
    assert metrics.depths[-1] == 0


def test_queue_full_is_refused_at_once_and_observed(batchers) -> None:
    """max_queue_size waiting, besides the batch a free instance will take (the deployment's admission bound,
    max_queue_size + instances x max_batch_size, admits as many): here the one instance waits out its delay for
    a batch of 3, so 2 + 3 fit and the 6th is refused, at once, whether or not the worker took its batch yet."""
    metrics, held = MetricsRecorder(), threading.Event()

    def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        held.wait(RESULT_WAIT_S)  # the first batch stays in flight while the test submits
        return {"y": inputs["x"] * 2}

    batcher = batchers(run, metrics, max_batch_size=3, max_queue_delay_ms=60_000.0, max_queue_size=2)
    try:
        for _ in range(2 + 3):
            batcher.submit({"x": x(1)}, 1)
        with pytest.raises(QueueFull):
            batcher.submit({"x": x(1)}, 1)
    finally:
        held.set()
    assert metrics.rejections == ["queue_full"]


def test_oversized_request_is_a_bad_request(batchers) -> None:
    batcher = batchers(Recorder(), max_batch_size=4)
    with pytest.raises(BadRequest, match="exceeds"):
        batcher.submit({"x": x(5)}, 5)


def test_expired_request_is_answered_with_timeout_and_never_computed(batchers) -> None:
    gate = threading.Event()
    calls: list[int] = []

    def slow(inputs):
        calls.append(len(inputs["x"]))
        gate.wait(RESULT_WAIT_S)
        return {"y": inputs["x"] * 2}

    metrics = MetricsRecorder()
    batcher = batchers(slow, metrics, max_batch_size=1, max_queue_delay_ms=0.0, timeout_ms=50.0)
    first = batcher.submit({"x": x(1)}, 1)  # occupies the only worker until the gate opens
    second = batcher.submit({"x": x(1)}, 1)  # waits in the queue past its deadline
    time.sleep(0.1)
    gate.set()
    np.testing.assert_array_equal(first.result(RESULT_WAIT_S)["y"], x(1) * 2)
    with pytest.raises(RequestTimeout, match="expired after"):
        second.result(RESULT_WAIT_S)
    assert calls == [1]
    assert "timeout" in metrics.rejections


def test_several_instances_run_batches_in_parallel(batchers) -> None:
    both_running = threading.Barrier(2, timeout=RESULT_WAIT_S)

    def run(inputs):
        both_running.wait()  # only returns if two batches are in flight at once
        return {"y": inputs["x"] * 2}

    batcher = batchers(run, max_batch_size=1, max_queue_delay_ms=0.0, instances=2)
    futures = [batcher.submit({"x": x(1, i)}, 1) for i in range(2)]
    for i, future in enumerate(futures):
        np.testing.assert_array_equal(future.result(RESULT_WAIT_S)["y"], x(1, i) * 2)


def test_cancelled_request_is_not_computed(batchers) -> None:
    run = Recorder()
    batcher = batchers(run, max_batch_size=2, max_queue_delay_ms=10_000.0)
    cancelled = batcher.submit({"x": x(1, 100)}, 1)
    assert cancelled.cancel()
    kept = batcher.submit({"x": x(1, 5)}, 1)
    np.testing.assert_array_equal(kept.result(RESULT_WAIT_S)["y"], x(1, 5) * 2)
    assert run.sizes == [1]


# --- variable lengths, per-request timeouts -----------------------------------------------------


def test_variable_length_requests_get_the_same_results_as_alone():
    calls = []

    def run_batch(inputs):
        calls.append(inputs["x"].shape)
        return {"y": inputs["x"].sum(axis=1, keepdims=True)}

    batcher = DynamicBatcher(run_batch, BatcherSettings(max_batch_size=16, max_queue_delay_ms=100.0))
    try:
        rng = np.random.default_rng(0)
        requests = [rng.standard_normal((1, length)).astype(np.float32) for length in (3, 5, 3, 7, 5, 3)]
        futures = [batcher.submit({"x": x}, 1) for x in requests]
        for x, future in zip(requests, futures):
            np.testing.assert_allclose(future.result(5)["y"], x.sum(axis=1, keepdims=True), rtol=1e-6)
    finally:
        batcher.close()
    assert sorted(calls) == [(1, 7), (2, 5), (3, 3)]  # one batch per length, each of one length


def test_a_request_timeout_can_only_shorten_the_deployments():
    delay_s = 0.5
    batcher = DynamicBatcher(
        lambda inputs: inputs, BatcherSettings(max_batch_size=4, max_queue_delay_ms=delay_s * 1e3, timeout_ms=10_000.0)
    )
    try:
        started = time.monotonic()
        with pytest.raises(RequestTimeout):
            batcher.infer({"x": np.zeros((1, 2), np.float32)}, 1, timeout_s=delay_s / 10)
        assert time.monotonic() - started < 0.8 * delay_s  # answered at its own deadline, not after the delay
        shorter = batcher.submit({"x": np.zeros((1, 2), np.float32)}, 1, timeout_s=100.0)
        assert shorter.result(2)["x"].shape == (1, 2)
    finally:
        batcher.close()


# --- the caller runs a request alone on its own thread when nothing else could join it --------------


class ThreadRecorder:
    """A run_batch that records which thread ran each batch, and can hold a batch until released."""

    def __init__(self, hold_first: bool = False) -> None:
        self.threads: list[str] = []
        self.running = 0
        self.most_running = 0
        self.entered = threading.Event()
        self.release = threading.Event()
        self.hold_first = hold_first
        self.lock = threading.Lock()

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self.lock:
            self.threads.append(threading.current_thread().name)
            self.running += 1
            self.most_running = max(self.most_running, self.running)
            first = len(self.threads) == 1
        self.entered.set()
        if first and self.hold_first:
            self.release.wait(RESULT_WAIT_S)
        with self.lock:
            self.running -= 1
        return {"y": inputs["x"] * 2}


def test_a_lone_request_runs_on_the_calling_thread(batchers) -> None:
    run = ThreadRecorder()
    batcher = batchers(run, max_batch_size=1, max_queue_delay_ms=0.0)
    np.testing.assert_array_equal(batcher.infer({"x": x(1)}, 1)["y"], x(1) * 2)
    assert run.threads == [threading.current_thread().name]
    assert batcher.submit({"x": x(1)}, 1).result(RESULT_WAIT_S) is not None
    assert run.threads[1].startswith("test-")  # submit() never runs it itself: a worker does


def test_a_request_that_may_wait_for_others_is_left_to_the_worker(batchers) -> None:
    run = ThreadRecorder()
    batcher = batchers(run, max_batch_size=4, max_queue_delay_ms=30.0)
    results = []
    callers = [threading.Thread(target=lambda: results.append(batcher.infer({"x": x(1)}, 1))) for _ in range(2)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(RESULT_WAIT_S)
    assert len(results) == 2 and len(run.threads) == 1  # both in one batch, as with any queue delay
    assert run.threads[0].startswith("test-")


def test_a_lone_request_is_decided_at_arrival_and_never_queued(batchers) -> None:
    """Batching off: each lone request runs at once without entering the queue, so the depth gauge is never
    moved; its refusals are those of the queue."""
    metrics = MetricsRecorder()
    batcher = batchers(Recorder(), metrics, max_batch_size=1, max_queue_delay_ms=0.0)
    for i in range(5):
        np.testing.assert_array_equal(batcher.infer({"x": x(1, i)}, 1)["y"], x(1, i) * 2)
    assert metrics.depths == [] and metrics.batches == [(1, 1, True)] * 5
    with pytest.raises(BadRequest, match="exceeds this deployment's max_batch_size 1"):
        batcher.infer({"x": x(2)}, 2)
    with pytest.raises(BadRequest, match="parameters.priority"):
        batcher.infer({"x": x(1)}, 1, priority=3)
    assert len(metrics.batches) == 5


def test_a_run_on_the_calling_thread_holds_an_instance(batchers) -> None:
    """instances=1: while a caller runs its own request, the worker must not start another batch."""
    run = ThreadRecorder(hold_first=True)
    batcher = batchers(run, max_batch_size=1, max_queue_delay_ms=0.0, instances=1)
    first = threading.Thread(target=batcher.infer, args=({"x": x(1)}, 1))
    first.start()
    assert run.entered.wait(RESULT_WAIT_S)
    queued = batcher.submit({"x": x(1, 5)}, 1)
    time.sleep(0.05)
    assert not queued.done() and run.most_running == 1
    run.release.set()
    np.testing.assert_array_equal(queued.result(RESULT_WAIT_S)["y"], x(1, 5) * 2)
    first.join(RESULT_WAIT_S)
    assert run.most_running == 1 and len(run.threads) == 2


def test_close_waits_for_a_run_on_a_calling_thread(batchers) -> None:
    run = ThreadRecorder(hold_first=True)
    batcher = batchers(run, max_batch_size=1, max_queue_delay_ms=0.0)
    caller = threading.Thread(target=batcher.infer, args=({"x": x(1)}, 1))
    caller.start()
    assert run.entered.wait(RESULT_WAIT_S)
    closer = threading.Thread(target=batcher.close)
    closer.start()
    time.sleep(0.05)
    assert closer.is_alive(), "close() returned while a batch was still running"
    run.release.set()
    closer.join(RESULT_WAIT_S)
    caller.join(RESULT_WAIT_S)
    assert not closer.is_alive() and not caller.is_alive()


# --- groups submitted at once (submit_many: the engine process's submit) ----------------------------


def test_a_group_submitted_at_once_gets_each_request_its_own_answer_or_error(batchers) -> None:
    """Good requests around bad ones: each bad one gets its own error, in its place, and the rest are batched
    and answered as if submitted one by one; the queue bound counts the group's requests one by one (2 waiting
    besides the batch of 3 the free instance takes: the 6th good request is refused)."""
    metrics, run = MetricsRecorder(), Recorder()
    batcher = batchers(run, metrics, max_batch_size=3, max_queue_delay_ms=60_000.0, max_queue_size=2)
    good = [x(1, 10 * i) for i in range(6)]
    group = [({"x": a}, 1, None, 0, None) for a in good]
    group[1:1] = [({"x": x(4)}, 4, None, 0, None), ({"x": x(1)}, 1, None, 3, None)]  # too large; no such priority
    outcomes = batcher.submit_many(group)
    assert metrics.depths[:1] == [5]  # one gauge write for the group, before the worker takes a batch
    assert isinstance(outcomes[1], BadRequest) and "max_batch_size" in str(outcomes[1])
    assert isinstance(outcomes[2], BadRequest) and "priority" in str(outcomes[2])
    assert isinstance(outcomes[-1], QueueFull) and metrics.rejections == ["queue_full"]
    batcher.close(RESULT_WAIT_S)  # sends the batch still waiting out its delay
    slots = [outcomes[0], *outcomes[3:-1]]
    for slot, a in zip(slots, good):
        np.testing.assert_array_equal(slot.result(RESULT_WAIT_S)["y"], a * 2)
    assert run.sizes == [3, 2]


def test_a_group_submitted_after_close_is_refused_request_by_request(batchers) -> None:
    batcher = batchers(Recorder())
    batcher.close(RESULT_WAIT_S)
    outcomes = batcher.submit_many([({"x": x(1)}, 1, None, 0, None)] * 3)
    assert len(outcomes) == 3 and all(isinstance(outcome, ModelNotReady) for outcome in outcomes)


class CountingCondition(threading.Condition):
    """threading.Condition counting its notify calls: each is a worker woken when one waits."""

    notified = 0

    def notify(self, n: int = 1) -> None:
        CountingCondition.notified += 1
        super().notify(n)


@pytest.fixture
def counted_notifies(monkeypatch: pytest.MonkeyPatch) -> type[CountingCondition]:
    """Batchers built in the test use CountingCondition (only the batcher module's view of threading changes)."""
    counting = types.SimpleNamespace(Thread=threading.Thread, Condition=CountingCondition)
    monkeypatch.setattr(batcher_module, "threading", counting)
    monkeypatch.setattr(CountingCondition, "notified", 0)
    return CountingCondition


class WorkerLooks:
    """A clock stopped at 0 that counts the worker's reads of it: one each time it looks at the queue."""

    def __init__(self) -> None:
        self.looks = 0
        self._cond = threading.Condition()

    def __call__(self) -> float:
        if threading.current_thread().name.startswith("looked-"):
            with self._cond:
                self.looks += 1
                self._cond.notify_all()
        return 0.0

    def parked(self, batcher: DynamicBatcher, looks: int) -> None:
        """Return once the worker has looked `looks` times and waits again (it waits holding no lock)."""
        with self._cond:
            assert self._cond.wait_for(lambda: self.looks >= looks, RESULT_WAIT_S)
        batcher.adaptive_state()  # takes the batcher's lock: the worker, having looked, is back in its wait


def one(n: int = 1, timeout_s: float | None = None) -> tuple:
    return {"x": x(n)}, n, timeout_s, 0, None


def test_a_group_wakes_a_worker_once_and_arrivals_that_change_nothing_wake_none(counted_notifies) -> None:
    """A group notifies the worker once (none with `wake` False until `wake`). Parked until a batch's send time,
    the worker is not woken by arrivals that leave the batch short and expire after that time; it is by one
    that expires sooner, and by those that fill the batch."""
    clock = WorkerLooks()
    limits = settings(max_batch_size=16, max_queue_delay_ms=60_000.0, max_queue_size=64, timeout_ms=600_000.0)
    batcher = DynamicBatcher(Recorder(), limits, clock=clock, name="looked")
    try:
        clock.parked(batcher, 1)  # an empty queue: waiting with no time set
        batcher.submit_many([one()] * 5)
        assert counted_notifies.notified == 1
        clock.parked(batcher, 2)  # parked until the batch's send time, 60 s on
        batcher.submit_many([one()] * 5)
        for _ in range(3):
            batcher.submit(*one())
        assert counted_notifies.notified == 1  # 13 samples of 16, all expiring after the send time
        batcher.submit(*one(timeout_s=1.0))
        assert counted_notifies.notified == 2  # it expires first: the worker must look at it by then
        clock.parked(batcher, 3)
        batcher.submit_many([one(2)])
        assert counted_notifies.notified == 3  # 16 samples: a full batch
        counted_notifies.notified = 0
        batcher.submit_many([one()] * 3, wake=False)
        assert counted_notifies.notified == 0
        batcher.wake()
        assert counted_notifies.notified == 1
    finally:
        batcher.close(RESULT_WAIT_S)


def test_a_stack_counts_as_the_requests_it_stands_for(batchers) -> None:
    """A stack (a front end's requests joined, Pending.requests) is one entry of the batch but its requests count
    one by one: the queue's depth, each request's queue time, the bound (refused whole, uncounted: its submitter
    queues its requests one by one) and expiry."""
    metrics, held = MetricsRecorder(), threading.Event()

    def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        held.wait(RESULT_WAIT_S)  # a batch the worker takes stays in flight while the test submits
        return {"y": inputs["x"] * 2}

    batcher = batchers(run, metrics, max_batch_size=4, max_queue_delay_ms=60_000.0, max_queue_size=3)
    (slot,) = batcher.submit_many([({"x": x(3)}, 3, None, 0, None, 3)])
    assert metrics.depths[-1] == 3
    fits = batcher.submit_many([({"x": x(2)}, 2, None, 0, None, 2)])  # 3 + 2 waiting, a batch of 4 taken: 1 left
    assert not isinstance(fits[0], Exception)
    over = batcher.submit_many([({"x": x(3)}, 3, None, 0, None, 3)])  # 5 + 3 waiting, 4 taken: 4 > 3
    assert isinstance(over[0], QueueFull) and metrics.rejections == []
    held.set()
    batcher.close(RESULT_WAIT_S)
    np.testing.assert_array_equal(slot.result(RESULT_WAIT_S)["y"], x(3) * 2)
    assert sum(count for _, count, _ in metrics.batches) == 3 + 2  # a queue time for each request
    assert metrics.depths[-1] == 0


def test_an_expired_stack_counts_each_request_timed_out(batchers) -> None:
    metrics = MetricsRecorder()
    batcher = batchers(Recorder(), metrics, max_batch_size=8, max_queue_delay_ms=60_000.0, timeout_ms=1.0)
    (slot,) = batcher.submit_many([({"x": x(3)}, 3, None, 0, None, 3)])
    with pytest.raises(RequestTimeout):
        slot.result(RESULT_WAIT_S)
    assert metrics.rejections == ["timeout"] * 3
