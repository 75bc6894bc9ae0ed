"""Fleets of CPU and GPU replicas over a day of traffic: SLO attainment, replicas over time, machine-hours and cost,
and the cheapest fleet that meets the SLO."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

import numpy as np

from latlab.common.user_input import UserError
from latlab.report.fleetplan.autoscale import Autoscaler, Timeline, scale, wanted
from latlab.report.fleetplan.replica import ReplicaModel, simulate
from latlab.report.fleetplan.traffic import INTERVAL_S, DayTraffic, gamma_arrivals

SIZING_REQUESTS = 20_000
"""Requests per simulated rate when one replica is sized: enough for a p99.9 of 20 requests beyond it."""
SECONDS_PER_FLEET = 8.0
"""What the day's simulation may cost per fleet on one core; beyond it only every k-th minute is simulated."""
# Rough cost of the simulator per request (batches of one, vectorised) and per batch (the batch loop), seconds.
COST_UNBATCHED_S = 2e-7
COST_PER_BATCH_S = 3e-6


class SloError(UserError):
    """An SLO the plan cannot read."""


@dataclass(frozen=True)
class Slo:
    """A share of requests that must be answered within a bound: p99 <= 50 ms is 99% within 50 ms."""

    bound_s: float
    share: float
    text: str

    @classmethod
    def parse(cls, spec: str) -> Slo:
        """`p99:50ms`, `p99.9:0.05s` or `attain:99.9%:50ms`."""
        text = spec.strip().lower()
        match = re.fullmatch(r"p(\d+(?:\.\d+)?):(.+)", text) or re.fullmatch(r"attain:(\d+(?:\.\d+)?)%:(.+)", text)
        bound = _seconds(match.group(2)) if match else None
        share = round(float(match.group(1)) / 100, 12) if match else math.nan  # 99.9 / 100 is not 0.999
        if bound is None or not (0 < share < 1 and 0 < bound < math.inf):
            raise SloError(f"--slo {spec!r}: write p99:50ms or attain:99.9%:50ms (a share below 100% and a bound)")
        return cls(bound, share, f"{share * 100:g}% of requests within {bound * 1e3:g} ms")


def _seconds(text: str) -> float | None:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|s)", text.strip())
    return None if not match else float(match.group(1)) / (1e3 if match.group(2) == "ms" else 1.0)


@dataclass(frozen=True)
class ReplicaKind:
    """One kind of replica a fleet can use: its model, the price of its machine and where its model comes from."""

    name: str
    model: ReplicaModel
    usd_per_hour: float
    source: str
    cold_start_s: float | None = None
    """Its start to ready when the autoscaler adds one (None: the autoscaler's own cold_start_s)."""
    cold_start_from: str = "assumed"
    """Where cold_start_s comes from: "lab" (measured), "given" (--cold-start) or "assumed"."""

    @property
    def cold_start_text(self) -> str:
        """The cold start as the plan says it: "measured 3.1 s (lab)", "given 30 s", "assumed 60 s"."""
        seconds = self.cold_start_s if self.cold_start_s is not None else math.nan
        if self.cold_start_from == "lab":
            return f"measured {seconds:.1f} s (lab)"
        return f"{self.cold_start_from} {seconds:g} s"


@dataclass(frozen=True)
class Sizing:
    """What one replica sustains under the day's burstiness: within the SLO, and at the autoscaler's target."""

    slo_rps: float
    """The highest rate at which one replica meets the SLO (0: at none)."""
    target_rps: float
    """The rate per replica the autoscaler aims for."""


def _base_gaps(cv: float, seed: int) -> np.ndarray:
    """Arrival times at a mean rate of 1/s: divided by a rate they are that rate's (the same draws for every rate,
    so the measured latency moves smoothly with the rate and a bisection converges)."""
    return gamma_arrivals(1.0, cv, SIZING_REQUESTS * 1.02, np.random.default_rng(seed))[:SIZING_REQUESTS]


def size_replica(model: ReplicaModel, slo: Slo, cv: float, target: str, seed: int = 0) -> Sizing:
    """One replica's SLO rate and the autoscaler's rate per replica for target `inflight:N` (N requests in flight
    per replica, by Little's law from the simulated mean latency: Ray Serve's target_ongoing_requests) or
    `util:U` (U times the SLO rate: an RPS target such as KServe's scaleTarget, set from the replica's SLO rate)."""
    base = _base_gaps(cv, seed)
    capacity = model.capacity_rps()

    def served(rate: float):
        return simulate(base / rate, model)

    slo_rps = highest_rate(lambda r: served(r).attainment(slo.bound_s) >= slo.share, capacity)
    kind, _, value = target.partition(":")
    number = float(value)
    if kind == "util":
        return Sizing(slo_rps, number * slo_rps)
    inflight = highest_rate(lambda r: r * float(np.mean(np.minimum(served(r).latency_s, 1e3))) <= number, capacity)
    return Sizing(slo_rps, inflight)


def highest_rate(ok, capacity: float) -> float:
    """The highest rate in (0, capacity) where ok(rate) holds, by bisection on a log scale (0 if the lowest fails)."""
    low, high = capacity * 1e-3, capacity * 0.999
    if not ok(low):
        return 0.0
    if ok(high):
        return high
    for _ in range(14):  # the rate to within 0.05%
        middle = math.sqrt(low * high)
        low, high = (middle, high) if ok(middle) else (low, middle)
    return low


@dataclass(frozen=True)
class FleetSpec:
    """A fleet: a fixed base of one kind (or none) and an autoscaled part of another (or none)."""

    name: str
    elastic: ReplicaKind | None
    base: ReplicaKind | None = None
    base_count: int = 0


@dataclass
class FleetDay:
    """What a fleet did over the day."""

    spec: FleetSpec
    attainment: float
    worst_minute: float
    """The lowest attainment of any simulated minute."""
    timelines: dict[str, Timeline]
    """Per kind: ready and billed replicas per tick."""
    machine_hours: dict[str, float]
    usd_per_day: float
    usd_per_million: float
    meets: bool
    simulated_requests: int = 0
    hits: float = 0.0
    weight: float = 0.0
    minutes: list[float] = field(default_factory=list)


def plan_fleets(
    specs: list[FleetSpec],
    traffic: DayTraffic,
    slo: Slo,
    sizing: dict[str, Sizing],
    scaler: Autoscaler,
    seed: int = 0,
    budget_s: float = SECONDS_PER_FLEET,
) -> tuple[list[FleetDay], int]:
    """Each fleet over the day; and the stride of the minutes simulated (1: every minute; more where simulating
    every minute would take more than about budget_s per fleet). Every fleet sees the same
    arrivals; each minute starts with empty replicas; a fleet of N replicas of a kind is simulated as one of them
    given a random 1/N of the kind's share (replicas behind a random balancer are alike), its requests counting N
    times."""
    ticks = np.repeat(traffic.rates_rps, int(round(INTERVAL_S / scaler.tick_s)))
    routes = [_route(spec, ticks, sizing, scaler) for spec in specs]
    stride = max(1, math.ceil(max(_cost_s(spec, r, traffic, scaler) for spec, r in zip(specs, routes)) / budget_s))
    days = [_empty_day(spec, timelines, traffic, slo) for spec, (timelines, _) in zip(specs, routes)]
    for minute in range(0, traffic.rates_rps.size, stride):
        rng = np.random.default_rng([seed, minute])
        arrivals = traffic.arrivals(minute, rng)
        pick = rng.random((2, arrivals.size))
        for day, (timelines, base_rps) in zip(days, routes):
            _serve_minute(day, timelines, base_rps, arrivals, pick, ticks, slo)
    for day in days:
        day.attainment = day.hits / day.weight if day.weight else 1.0
        day.worst_minute = min(day.minutes, default=1.0)
        day.meets = day.attainment >= slo.share
    return days, stride


def _route(spec: FleetSpec, ticks: np.ndarray, sizing: dict[str, Sizing], scaler: Autoscaler):
    """Replicas over the day per kind, and the rate the base takes before the rest overflows to the elastic part."""
    timelines: dict[str, Timeline] = {}
    base_rps = 0.0
    if spec.base is not None:
        base_rps = spec.base_count * sizing[spec.base.name].target_rps
        count = np.full(ticks.size, spec.base_count)
        timelines[spec.base.name] = Timeline(count, count, scaler.tick_s)
    if spec.elastic is not None:
        lower = 0 if spec.base is not None else max(1, scaler.min_replicas)
        cold = spec.elastic.cold_start_s
        own = replace(scaler, min_replicas=lower, cold_start_s=scaler.cold_start_s if cold is None else cold)
        desired = wanted(np.maximum(ticks - base_rps, 0), sizing[spec.elastic.name].target_rps, own)
        timelines[spec.elastic.name] = scale(desired, own)
    return timelines, base_rps


def _cost_s(spec: FleetSpec, route, traffic: DayTraffic, scaler: Autoscaler) -> float:
    """A rough estimate of the simulator's time for this fleet's day, every minute simulated: one replica's share of
    the requests, in batches of about 1 + rate x delay at its mean rate."""
    timelines, _ = route
    total = 0.0
    for kind in (spec.base, spec.elastic):
        if kind is not None:
            replicas = float(np.maximum(timelines[kind.name].ready, 1).mean())
            share = traffic.requests / replicas
            if kind.model.max_batch == 1:
                total += share * COST_UNBATCHED_S
            else:
                batch = min(kind.model.max_batch, 1 + traffic.rates_rps.mean() / replicas * kind.model.delay_s)
                total += share / batch * COST_PER_BATCH_S
    return total


def _empty_day(spec: FleetSpec, timelines: dict[str, Timeline], traffic: DayTraffic, slo: Slo) -> FleetDay:
    kinds = [k for k in (spec.base, spec.elastic) if k is not None]
    hours = {k.name: timelines[k.name].machine_hours for k in kinds}
    usd = sum(hours[k.name] * k.usd_per_hour for k in kinds) * (86_400 / traffic.duration_s)
    per_million = usd / (traffic.requests / 1e6) if traffic.requests else math.inf
    return FleetDay(spec, 1.0, 1.0, timelines, hours, usd, per_million, False)


def _serve_minute(
    day: FleetDay,
    timelines: dict[str, Timeline],
    base_rps: float,
    arrivals: np.ndarray,
    pick: np.ndarray,
    ticks: np.ndarray,
    slo: Slo,
) -> None:
    """One minute of one fleet: route the arrivals, serve one replica of each kind's share, count who was on time."""
    spec = day.spec
    tick = np.minimum((arrivals // timelines[next(iter(timelines))].tick_s).astype(int), ticks.size - 1)
    elastic_ready = timelines[spec.elastic.name].ready[tick] if spec.elastic is not None else np.zeros(tick.size)
    if spec.base is None:
        to_base = np.zeros(tick.size, dtype=bool)
    else:
        share = np.where(elastic_ready > 0, np.minimum(1.0, base_rps / np.maximum(ticks[tick], 1e-9)), 1.0)
        to_base = pick[0] < share
    hits = weight = 0.0
    for kind, mine, replicas in (
        (spec.base, to_base, np.full(tick.size, spec.base_count)),
        (spec.elastic, ~to_base, elastic_ready),
    ):
        if kind is None or not mine.any():
            continue
        sample = mine & (pick[1] * np.maximum(replicas, 1) < 1)  # one replica's random 1/N of the kind's share
        served = simulate(arrivals[sample], kind.model)
        counts = replicas[sample].astype(float)
        hits += float(np.sum(counts * (served.latency_s <= slo.bound_s)))
        weight += float(counts.sum())
        day.simulated_requests += served.requests
    day.hits += hits
    day.weight += weight
    if weight:
        day.minutes.append(hits / weight)


def cheapest(days: list[FleetDay]) -> FleetDay | None:
    """The fleet that meets the SLO at the lowest cost per day (None: none meets it)."""
    return min((d for d in days if d.meets), key=lambda d: d.usd_per_day, default=None)


def verdict(days: list[FleetDay], slo: Slo) -> str:
    """The answer in one plain sentence."""
    best = cheapest(days)
    if best is None:
        top = max(days, key=lambda d: d.attainment)
        return (
            f"No fleet met {slo.text}: the closest, {top.spec.name}, answered {top.attainment * 100:.3f}% in time "
            f"at ${top.usd_per_day:,.2f} a day."
        )
    others = [d for d in days if d.meets and d is not best]
    than = ""
    if others:
        runner = min(others, key=lambda d: d.usd_per_day)
        ratio = runner.usd_per_day / best.usd_per_day if best.usd_per_day else math.inf
        than = f", {ratio:.2g}x less than {runner.spec.name}" if ratio >= 1.05 else f", as cheap as {runner.spec.name}"
    return (
        f"The cheapest fleet that serves this day with {slo.text} is {best.spec.name}: "
        f"${best.usd_per_day:,.2f} a day (${best.usd_per_million:.3f} per million requests){than}, "
        f"{best.attainment * 100:.3f}% of requests in time."
    )
