"""latlab.loadtest.fleet_cpu: a distributed generator's CPU from the readings its workers ship."""

from __future__ import annotations

import time

import pytest

from latlab.loadtest.fleet_cpu import FleetCpu, cpu_reading


def test_each_worker_gets_its_share_between_two_reads() -> None:
    fleet = FleetCpu()
    fleet.reported("a", (100.0, 5.0))
    fleet.reported("b", (100.2, 1.0))
    assert fleet.since_last_read(["a", "b"]) == {}  # the first read only marks where the span begins
    fleet.reported("a", (102.0, 5.5))  # 0.5 CPU s in 2 s
    fleet.reported("b", (103.2, 3.4))  # 2.4 CPU s in 3 s: more than a core's worth is not clipped
    assert fleet.since_last_read(["a", "b"]) == pytest.approx({"a": 25.0, "b": 80.0})
    fleet.reported("a", (104.0, 6.5))
    assert fleet.since_last_read(["a", "b"]) == pytest.approx({"a": 50.0})  # b sent nothing new


def test_workers_not_asked_about_or_never_heard_from_are_left_out() -> None:
    fleet = FleetCpu()
    fleet.reported("gone", (1.0, 1.0))
    assert fleet.since_last_read(["silent"]) == {}
    fleet.reported("gone", (2.0, 2.0))
    assert fleet.since_last_read(["silent"]) == {}


def test_a_reading_is_this_process_s_cpu_seconds() -> None:
    before = cpu_reading()
    deadline = time.monotonic() + 0.2
    while time.monotonic() < deadline:  # burn some CPU
        sum(range(1000))
    after = cpu_reading()
    assert after[0] > before[0] and 0.05 < after[1] - before[1] <= after[0] - before[0] + 0.05
