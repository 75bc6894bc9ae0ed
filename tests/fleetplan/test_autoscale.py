"""The autoscaler's timing: delays before acting, cold starts before serving, the newest stopped first."""

from __future__ import annotations

import numpy as np

from latlab.report.fleetplan.autoscale import Autoscaler, scale, wanted

SCALER = Autoscaler(upscale_delay_s=30, downscale_delay_s=600, cold_start_s=60, tick_s=10)


def test_a_step_in_load_adds_replicas_after_the_delay_and_the_cold_start_and_removes_them_later():
    desired = np.array([1] * 100 + [4] * 100 + [1] * 100)  # up at 1000 s, down at 2000 s
    timeline = scale(desired, SCALER)
    assert timeline.billed[102] == 1 and timeline.billed[103] == 4  # started 30 s after the step
    assert timeline.ready[108] == 1 and timeline.ready[109] == 4  # ready 60 s after their start
    assert timeline.billed[259] == 4 and timeline.billed[260] == 1  # stopped 600 s after the load fell
    assert timeline.ready[260] == 1
    assert timeline.machine_hours == (103 * 1 + 157 * 4 + 40 * 1) * 10 / 3600


def test_a_spike_shorter_than_the_upscale_delay_starts_nothing():
    desired = np.array([1] * 10 + [5] * 2 + [1] * 10)
    timeline = scale(desired, SCALER)
    assert set(timeline.billed.tolist()) == {1}


def test_a_dip_shorter_than_the_downscale_delay_stops_nothing():
    desired = np.array([3] * 10 + [1] * 50 + [3] * 10)
    timeline = scale(desired, SCALER)
    assert set(timeline.billed.tolist()) == {3}


def test_the_fleet_starts_warm():
    timeline = scale(np.array([3, 3, 3]), SCALER)
    assert timeline.ready.tolist() == [3, 3, 3]


def test_replicas_wanted_follow_the_rate_within_bounds():
    scaler = Autoscaler(min_replicas=1, max_replicas=5)
    assert wanted(np.array([0.0, 100.0, 101.0, 450.0, 10_000.0]), 100.0, scaler).tolist() == [1, 1, 2, 5, 5]
