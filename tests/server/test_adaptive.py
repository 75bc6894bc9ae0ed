"""Adaptive batching: the latency model, the arrival rate, the pure wait rule, a fake-clock simulation and
an idle adaptive batcher that costs no CPU."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest

from latlab.server.batching.batch_queue import BatchQueue, Pending
from latlab.server.batching.batcher import DynamicBatcher
from latlab.server.batching.latency_model import ArrivalRate, LatencyModel, adaptive_wait
from latlab.server.config import BatcherSettings, parse_config
from latlab.server.errors import ConfigError

A, B = 0.0001, 0.002  # synthetic batch time: 0.1 ms per sample + 2 ms per batch


# --- LatencyModel and ArrivalRate --------------------------------------------------------------------


def test_latency_model_fits_a_line_and_needs_two_sizes() -> None:
    model = LatencyModel()
    assert model.fit() is None
    model.record(4, 4 * A + B)
    model.record(4, 4 * A + B)
    assert model.fit() is None  # one size says nothing about the slope: behave like delay 0
    model.record(16, 16 * A + B)
    a, b = model.fit()
    assert a == pytest.approx(A) and b == pytest.approx(B)


def test_latency_model_shrugs_off_a_slow_first_run_and_clamps_at_zero() -> None:
    model = LatencyModel()
    for samples, seconds in [(1, 0.5), (1, A + B), (1, A + B), (8, 8 * A + B), (8, 3.0), (8, 8 * A + B)]:
        model.record(samples, seconds)  # 0.5 s and 3 s: ORT's first run at a new size
    a, b = model.fit()
    assert a == pytest.approx(A) and b == pytest.approx(B)
    falling = LatencyModel()
    falling.record(1, 0.01)
    falling.record(2, 0.001)
    assert falling.fit() == (0.0, pytest.approx(0.0055))


def test_latency_model_window_is_bounded_and_follows_a_change() -> None:
    model = LatencyModel(window=4)
    for samples in (1, 2, 1, 2):
        model.record(samples, samples * A + B)
    for samples in (1, 2, 1, 2):
        model.record(samples, samples * 2 * A + 10 * B)  # the machine got slower
    a, b = model.fit()
    assert a == pytest.approx(2 * A) and b == pytest.approx(10 * B)


def test_latency_model_refits_every_few_batches_once_it_has_a_line() -> None:
    model = LatencyModel(refit_every=4)
    for samples in (1, 2):
        model.record(samples, samples * A + B)
    assert model.fit() == (pytest.approx(A), pytest.approx(B))
    for _ in range(3):
        model.record(4, 4 * 3 * A + B)  # three batches of a steeper line: the fit stands until the fourth
        assert model.fit() == (pytest.approx(A), pytest.approx(B))
    model.record(4, 4 * 3 * A + B)
    assert model.fit() != (pytest.approx(A), pytest.approx(B))


def test_latency_model_drops_its_fit_when_the_window_holds_one_size() -> None:
    model = LatencyModel(window=3)
    model.record(1, A + B)
    model.record(2, 2 * A + B)
    assert model.fit() is not None
    for _ in range(3):
        model.record(8, 8 * A + B)  # the window now holds only batches of 8: no slope to speak of
    assert model.fit() is None
    model.record(1, A + B)
    assert model.fit() == (pytest.approx(A), pytest.approx(B))  # a fresh fit, not the stale one


def test_arrival_rate_is_a_moving_average_that_notices_silence() -> None:
    rate = ArrivalRate(alpha=0.5)
    assert rate.expected_gap(0.0) is None
    rate.arrived(0.0)
    assert rate.expected_gap(0.0) is None
    for at in (0.01, 0.02, 0.03):
        rate.arrived(at)
    assert rate.expected_gap(0.03) == pytest.approx(0.01)
    rate.arrived(0.07)  # a gap of 40 ms moves the mean half way
    assert rate.mean_gap == pytest.approx(0.025)
    assert rate.expected_gap(1.07) == pytest.approx(1.0)  # a second of silence: the burst is over


# --- the pure rule -----------------------------------------------------------------------------------


def rule(
    now: float = 0.0,
    sizes=(1,),
    gap: float | None = 0.0002,
    free: int = 1,
    delay: float = 0.01,
    fit=(A, B),
    deadline: float = math.inf,
    oldest: float = 0.0,
    last: float = 0.0,
) -> float | None:
    return adaptive_wait(now, list(sizes), oldest, fit, gap, last, free, delay, deadline)


def test_low_rate_sends_at_once() -> None:
    assert rule(gap=0.02) is None  # next request in 20 ms: waiting can save at most b = 2 ms


def test_cold_start_sends_at_once() -> None:
    assert rule(fit=None) is None
    assert rule(gap=None) is None


def test_high_rate_waits_until_the_break_even_time() -> None:
    # q = 1: waiting pays while the gap < (b - a) / 2 = 0.95 ms after the last arrival
    assert rule(gap=0.0002, last=0.0) == pytest.approx((B - A) / 2)
    assert rule(now=0.0003, gap=0.0002, last=0.0001) == pytest.approx(0.0001 + (B - A) / 2)


def test_waiting_stops_paying_as_the_batch_grows() -> None:
    # b > (q+1)*gap + q*a  <=>  q < (b - gap) / (gap + a) = 6 for a 0.2 ms gap
    assert rule(sizes=[1] * 5) is not None
    assert rule(sizes=[1] * 6) is None


def test_another_free_instance_means_send_now() -> None:
    assert rule(free=2) is None


def test_wait_never_exceeds_the_max_delay_or_a_deadline() -> None:
    assert rule(delay=0.0005, oldest=0.0) == pytest.approx(0.0005)
    assert rule(deadline=0.0025) == pytest.approx(0.0025 - (A + B))  # the run must end by the deadline
    assert rule(deadline=0.001) is None  # no time left to wait: send now


# --- BatchQueue on a fake clock: a single-instance server simulated event by event -----------------


def settings(**overrides: object) -> BatcherSettings:
    base = dict(max_batch_size=32, max_queue_delay_ms=10.0, max_queue_size=10_000, timeout_ms=60_000.0)
    return BatcherSettings(**{**base, **overrides})


def simulate(batcher: BatcherSettings, gap: float, count: int = 400) -> tuple[list[int], list[float], list[float]]:
    """Arrivals every `gap` seconds, one instance whose batch of n takes A*n + B. Returns the batch sizes,
    every request's wait in the queue, and per batch how long the batcher held its oldest request while
    the instance was free (what max_queue_delay bounds; the rest of a wait is the busy instance)."""
    queue = BatchQueue(batcher)
    queue.record_batch(1, A + B)  # what a server that ran for a while has learnt: its batch times ...
    queue.record_batch(8, 8 * A + B)
    for k in range(10, 0, -1):
        queue.arrivals.arrived(-k * gap)  # ... and the rate requests came at
    arrivals = [i * gap for i in range(count)]
    batches, waits, holds = [], [], []
    now, free_at, next_arrival = 0.0, 0.0, 0
    while next_arrival < count or len(queue):
        while next_arrival < count and arrivals[next_arrival] <= now:
            at = arrivals[next_arrival]
            queue.put(Pending({"x": np.zeros((1, 1))}, 1, at, at + 60.0, shape_key=(("x", (1,)),)))
            next_arrival += 1
        decision = queue.take(now) if now >= free_at else None
        if isinstance(decision, list):
            batches.append(len(decision))
            waits += [now - p.enqueued_at for p in decision]
            holds.append(now - max(free_at, decision[0].enqueued_at))
            free_at = now + A * len(decision) + B
            continue
        candidates = [arrivals[next_arrival]] if next_arrival < count else []
        candidates += [free_at] if free_at > now else []
        candidates += [decision] if isinstance(decision, float) else []
        now = min(candidates)
    return batches, waits, holds


def test_low_rate_adaptive_sends_lone_requests_at_once_where_a_fixed_delay_waits() -> None:
    batches, waits, _ = simulate(settings(adaptive=True), gap=0.02)
    assert set(batches) == {1} and max(waits) == 0.0
    fixed_batches, fixed_waits, _ = simulate(settings(max_queue_delay_ms=2.0), gap=0.02)
    assert set(fixed_batches) == {1} and min(fixed_waits) == pytest.approx(0.002)


def test_high_rate_adaptive_waits_and_batches_grow_within_the_bound() -> None:
    batches, _, holds = simulate(settings(adaptive=True), gap=0.0002)
    low_batches, _, _ = simulate(settings(adaptive=True), gap=0.02)
    assert batches[0] > 1 and holds[0] > 0  # an idle server that expects more requests waits for them
    assert np.mean(batches) > 5 * np.mean(low_batches)
    assert max(holds) <= 0.010 + 1e-12
    no_wait_batches, _, _ = simulate(settings(max_queue_delay_ms=0.0), gap=0.0002)
    assert no_wait_batches[0] == 1  # delay 0 sends the first request alone


def test_adaptive_wait_is_capped_by_max_queue_delay() -> None:
    batches, _, holds = simulate(settings(adaptive=True, max_queue_delay_ms=0.3), gap=0.0002)
    assert max(holds) <= 0.0003 + 1e-12
    assert batches[0] == 2  # 0 ms and 0.2 ms arrived; the 0.4 ms one is past the 0.3 ms bound


# --- real threads, config -------------------------------------------------------------------------


def test_idle_adaptive_batcher_uses_almost_no_cpu() -> None:
    batcher = DynamicBatcher(
        lambda inputs: {"y": inputs["x"] * 2}, settings(adaptive=True, max_queue_delay_ms=50.0, instances=2)
    )
    try:
        for _ in range(20):  # teach it a rate and give it a queue history, then leave it idle
            batcher.infer({"x": np.ones((1, 2), np.float32)}, 1)
        cpu_before, wall_before = time.process_time(), time.monotonic()
        time.sleep(1.0)
        cpu, wall = time.process_time() - cpu_before, time.monotonic() - wall_before
    finally:
        batcher.close(5.0)
    assert cpu < 0.05 * wall


def test_lone_requests_wake_no_worker() -> None:
    """At low load each request runs alone on its caller; waking a worker after it (which finds an empty
    queue and sleeps again) would cost a thread switch and the interpreter lock per request."""
    for adaptive in (True, False):
        batcher = DynamicBatcher(
            lambda inputs: {"y": inputs["x"] * 2},
            settings(adaptive=adaptive, max_queue_delay_ms=0.0 if not adaptive else 2.0),
        )
        notified = []
        notify = batcher._cond.notify
        batcher._cond.notify = lambda n=1: (notified.append(n), notify(n))[1]
        try:
            for _ in range(20):
                batcher.infer({"x": np.ones((1, 2), np.float32)}, 1)
            assert notified == [], f"adaptive={adaptive}"
        finally:
            batcher.close(5.0)


def test_adaptive_batcher_answers_every_request_and_reports_its_state() -> None:
    batcher = DynamicBatcher(lambda inputs: {"y": inputs["x"] * 2}, settings(adaptive=True, max_queue_delay_ms=20.0))
    try:
        assert batcher.adaptive_state() == {"a_s": None, "b_s": None, "arrival_rate": None}
        futures = [batcher.submit({"x": np.full((n, 2), n, np.float32)}, n) for n in (1, 2, 3, 1, 4)]
        for n, future in zip((1, 2, 3, 1, 4), futures):
            np.testing.assert_array_equal(future.result(5.0)["y"], np.full((n, 2), 2 * n, np.float32))
        assert batcher.adaptive_state()["arrival_rate"] > 0
    finally:
        batcher.close(5.0)


def test_adaptive_setting_is_parsed_and_type_checked(tmp_path: Path) -> None:
    doc = {"deployments": [{"name": "m", "model_path": str(tmp_path / "m.onnx"), "batcher": {"adaptive": True}}]}
    assert parse_config(doc).deployments[0].batcher.adaptive is True
    doc["deployments"][0]["batcher"] = {"adaptive": "yes"}
    with pytest.raises(ConfigError, match="adaptive must be true or false"):
        parse_config(doc)
