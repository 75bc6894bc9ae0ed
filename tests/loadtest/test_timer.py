"""The open-loop sender's timerfd (loadtest/timer.py): never wakes before the send time, wakes closer to it than
the event loop's own timer does (measured side by side), sleeps rather than spins, and returns at once for a time
that has passed."""

from __future__ import annotations

import random
import statistics
import time

import gevent
import pytest

from latlab.loadtest.timer import Timer


def lateness(wait, n: int = 300) -> list[float]:
    """How late `wait(when)` returned, for n send times a few milliseconds ahead."""
    rng, late = random.Random(1), []
    for _ in range(n):
        when = time.time() + rng.uniform(0.0005, 0.004)
        wait(when)
        late.append(time.time() - when)
    return late


def loop_wait(when: float) -> None:
    while (delay := when - time.time()) > 0:
        gevent.sleep(delay)


@pytest.fixture
def timer():
    made = Timer.make()
    assert made is not None, "Linux has timerfd: the generator must use it here"
    yield made
    made.close()


def test_the_timer_never_wakes_early_and_wakes_closer_than_the_event_loops_timer(timer):
    for _ in range(3):  # alternated, so that a noisy moment of the machine does not favour one
        mine, loops = lateness(timer.wait_until), lateness(loop_wait)
        assert min(mine) >= 0
        if statistics.median(mine) < statistics.median(loops):
            return
    pytest.fail(f"timerfd median lateness {statistics.median(mine):.6f} s, the loop's {statistics.median(loops):.6f} s")


def test_waiting_on_the_timer_sleeps_rather_than_spins(timer):
    wall, cpu = time.perf_counter(), time.process_time()
    lateness(timer.wait_until, n=200)
    assert time.process_time() - cpu < 0.5 * (time.perf_counter() - wall)


def test_a_passed_time_returns_at_once_and_other_greenlets_run_while_one_waits(timer):
    timer.wait_until(time.time() - 1.0)  # would hang were the past not at once
    ran = []
    other = gevent.spawn(ran.append, "other")
    timer.wait_until(time.time() + 0.002)
    assert ran == ["other"]
    other.join()


def test_loop_in_the_environment_keeps_the_event_loops_timer(monkeypatch):
    monkeypatch.setenv("LATLAB_TIMER", "loop")
    assert Timer.make() is None
