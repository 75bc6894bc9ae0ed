"""Fleets over a day: cold replicas serve nothing, the cheapest fleet meeting the SLO wins, bad specs are refused."""

from __future__ import annotations

import numpy as np
import pytest

from latlab.report.fleetplan.autoscale import Autoscaler
from latlab.report.fleetplan.fleet import FleetSpec, ReplicaKind, Sizing, Slo, SloError, cheapest, plan_fleets, verdict
from latlab.report.fleetplan.plan import PlanError, check_target
from latlab.report.fleetplan.replica import ReplicaModel
from latlab.report.fleetplan.traffic import DayTraffic, TrafficError, parse_profile

SLO = Slo.parse("p99:50ms")
CPU = ReplicaKind("cpu", ReplicaModel(0.004, 0.0, max_batch=1), 0.10, "test")
GPU = ReplicaKind("gpu", ReplicaModel(0.002, 0.00001, max_batch=64, delay_s=0.002), 2.50, "test")


def two_hours(first: float, second: float, cv: float = 1.0) -> DayTraffic:
    """An hour at one rate, then an hour at another."""
    return DayTraffic(np.array([first] * 60 + [second] * 60), cv, "test")


def test_cold_replicas_serve_nothing():
    """Load rises past one replica's capacity: replicas that never finish starting leave the one overloaded."""
    traffic = two_hours(100.0, 600.0)
    sizing = {"cpu": Sizing(200.0, 150.0)}
    days = {}
    for cold in (0.0, 1e6):
        scaler = Autoscaler(upscale_delay_s=30, downscale_delay_s=600, cold_start_s=cold)
        [days[cold]], _ = plan_fleets([FleetSpec("CPU only", CPU)], traffic, SLO, sizing, scaler)
    warm, never = days[0.0], days[1e6]
    assert warm.timelines["cpu"].ready.max() == 4 and never.timelines["cpu"].ready.max() == 1
    assert never.timelines["cpu"].billed.max() == 4  # started, so paid for
    assert warm.meets and not never.meets
    assert never.attainment < 0.7 < 0.99 < warm.attainment


def test_the_cheapest_fleet_that_meets_the_slo_wins():
    traffic = two_hours(50.0, 150.0)
    sizing = {"cpu": Sizing(200.0, 120.0), "gpu": Sizing(20_000.0, 5_000.0)}
    specs = [FleetSpec("CPU only", CPU), FleetSpec("GPU only", GPU), FleetSpec("GPU base + CPU", CPU, GPU, 1)]
    days, _ = plan_fleets(specs, traffic, SLO, sizing, Autoscaler(cold_start_s=0))
    assert [d.meets for d in days] == [True, True, True]
    assert cheapest(days).spec.name == "CPU only"
    assert days[0].usd_per_day < days[2].usd_per_day < days[1].usd_per_day + days[0].usd_per_day
    assert verdict(days, SLO).startswith("The cheapest fleet that serves this day with 99% of requests within 50 ms")


def test_a_fleet_too_slow_for_the_slo_is_not_chosen_however_cheap():
    slow = ReplicaKind("cpu", ReplicaModel(0.06, 0.0, max_batch=1), 0.01, "test")  # 60 ms a request
    traffic = two_hours(5.0, 5.0)
    sizing = {"cpu": Sizing(0.0, 10.0), "gpu": Sizing(20_000.0, 5_000.0)}
    days, _ = plan_fleets([FleetSpec("CPU only", slow), FleetSpec("GPU only", GPU)], traffic, SLO, sizing, Autoscaler())
    assert not days[0].meets and days[0].attainment == 0.0
    assert cheapest(days).spec.name == "GPU only"


def test_no_fleet_meeting_the_slo_is_said_so():
    slow = ReplicaKind("cpu", ReplicaModel(0.06, 0.0, max_batch=1), 0.01, "test")
    days, _ = plan_fleets(
        [FleetSpec("CPU only", slow)], two_hours(5.0, 5.0), SLO, {"cpu": Sizing(0.0, 10.0)}, Autoscaler()
    )
    assert cheapest(days) is None
    assert verdict(days, SLO).startswith("No fleet met 99% of requests within 50 ms")


def test_a_day_of_diurnal_traffic_swings_from_trough_to_peak():
    day = parse_profile("diurnal:2000:200:2")
    assert day.rates_rps.size == 1440 and day.cv == 2.0
    assert day.rates_rps.min() == pytest.approx(200, rel=1e-3) and day.rates_rps.max() == pytest.approx(2000, rel=1e-3)
    arrivals = day.arrivals(720, np.random.default_rng(0))
    assert (
        arrivals.size == pytest.approx(2000 * 60, rel=0.05) and 720 * 60 <= arrivals.min() < arrivals.max() < 721 * 60
    )


def test_a_trace_is_scaled_to_its_busiest_minute():
    day = parse_profile("trace:traces/AzureLLMInferenceTrace_conv.csv", trace_peak_rps=2000)
    assert day.rates_rps.max() == pytest.approx(2000) and day.rates_rps.size == 1440
    assert 0.5 < day.rates_rps.mean() / 2000 < 0.8 and 0.8 < day.cv < 1.3


@pytest.mark.parametrize(
    "spec, rate, match",
    [
        ("diurnal:10", None, "not one of"),
        ("diurnal:5:10", None, "TROUGH <= PEAK"),
        ("diurnal:a:b", None, "not one of"),
        ("diurnal:10:5:0", None, "CV > 0"),
        ("sine:10:5", None, "not one of"),
        ("trace:", None, "needs a file"),
        ("trace:traces/AzureLLMInferenceTrace_conv.csv", None, "--trace-rate"),
        ("trace:traces/AzureLLMInferenceTrace_conv.csv", -5.0, "--trace-rate"),
    ],
)
def test_bad_traffic_specs_are_refused_with_what_is_expected(spec, rate, match):
    with pytest.raises(TrafficError, match=match):
        parse_profile(spec, rate)


@pytest.mark.parametrize("spec", ["p99:50", "p100:50ms", "attain:99.9:50ms", "p99:-1ms", "50ms"])
def test_bad_slos_are_refused(spec):
    with pytest.raises(SloError, match="write p99:50ms"):
        Slo.parse(spec)


def test_slos_read_as_a_share_within_a_bound():
    assert (Slo.parse("attain:99.9%:50ms").share, Slo.parse("attain:99.9%:50ms").bound_s) == (0.999, 0.05)
    assert (Slo.parse("p99:0.1s").share, Slo.parse("p99:0.1s").bound_s) == (0.99, 0.1)


@pytest.mark.parametrize("target", ["inflight:0", "util:1.5", "busy:2", "inflight"])
def test_bad_autoscaler_targets_are_refused(target):
    with pytest.raises(PlanError, match="--target"):
        check_target(target)
