"""What the lab's own machine adds where the replica model is checked against a lab run: the load generator's round
trip (its floor), drawn per request, and the cores the generator and other work on the machine share with the
server it loads. A fleet's
replicas run without the generator beside them, so the plan's simulations leave both out."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from latlab.loadtest.results import Curve

Z99 = 2.3263
"""The standard normal's 99th percentile: a log-normal's p99 is its median times exp(Z99 * sigma)."""
FLOOR_WAYS = ("drawn", "p99", "none")


@dataclass(frozen=True)
class CheckTerms:
    """Which terms the check adds to each deployment's replica model; each can be left out, to compare."""

    spread: bool = True
    """The service-time spread fitted from the run's one-at-a-time probe (spread.service_spread); off: sigma 0."""
    floor: str = "drawn"
    """The generator's floor: "drawn" per request from a log-normal fitted to it, "p99" (its p99 added to the
    model's p99), or "none"."""
    shared_cores: bool = True
    """Slow the replica where the server and the generator ask more CPU than the machine has (SharedCores)."""

    def __post_init__(self) -> None:
        if self.floor not in FLOOR_WAYS:
            raise ValueError(f"floor must be one of {', '.join(FLOOR_WAYS)}, not {self.floor!r}")


@dataclass(frozen=True)
class GeneratorFloor:
    """The load generator's own round trip to a trivial route, measured at a few rates before the sweep
    (Run.generator_floor): per request a log-normal of the measured median and p99, both interpolated in rate."""

    rates_rps: tuple[float, ...]
    p50_s: tuple[float, ...]
    p99_s: tuple[float, ...]

    @classmethod
    def of(cls, curve: Curve) -> GeneratorFloor | None:
        """The run's floor; None where it was not measured."""
        points = sorted(
            (float(r["achieved_rps"]), float(r["p50_s"]), float(r["p99_s"]))
            for r in (curve.generator_floor or {}).get("rates", [])
            if r.get("achieved_rps") and r.get("p50_s") and r.get("p99_s")
        )
        return cls(*(tuple(column) for column in zip(*points))) if points else None

    def median_s(self, rate: float) -> float:
        return float(np.interp(rate, self.rates_rps, self.p50_s))

    def p99_at_s(self, rate: float) -> float:
        return float(np.interp(rate, self.rates_rps, self.p99_s))

    def sigma(self, rate: float) -> float:
        """The log-normal sigma whose p99 over its median is the floor's at this rate (0 where p99 <= p50)."""
        return max(math.log(self.p99_at_s(rate) / self.median_s(rate)), 0.0) / Z99

    def draw(self, rate: float, count: int, rng: np.random.Generator) -> np.ndarray:
        """`count` requests' floors at `rate`, each drawn on its own."""
        return self.median_s(rate) * np.exp(self.sigma(rate) * rng.standard_normal(count))


@dataclass(frozen=True)
class SharedCores:
    """The lab machine's cores, shared by the server and the load generator. Where at some rate both together ask
    more CPU than there is, each gets its share (the scheduler's fair share): the replica's batches take longer by
    the ratio of the CPU asked to the cores. The CPU per request of each is interpolated in rate."""

    cores: float
    rates_rps: tuple[float, ...]
    server_cpu_s: tuple[float, ...]
    """The server process's CPU seconds per request (its threads and ORT's together) at each rate."""
    generator_cpu_s: tuple[float, ...]
    """The load generator's CPU seconds per request at each rate."""
    other_cores: tuple[float, ...] = ()
    """Other work on the machine at each rate, in cores (Step.other_load_cores; 0 where a run did not record it):
    the same cores, taken from both."""

    def __post_init__(self) -> None:
        if self.cores <= 0 or not self.rates_rps:
            raise ValueError("shared cores need a positive number of cores and at least one rate")

    @classmethod
    def of(cls, curve: Curve) -> SharedCores | None:
        """From what the run recorded: the machine's cores, the server's process CPU per request over the steps
        (its CPU, not its latency) and the generator's CPU per request from its floor (measured before the sweep;
        the steps' own record where the run has no floor). None where the run lacks any of them."""
        cores = (curve.machine or {}).get("cores")
        server = sorted(
            (s.achieved_rps, float(s.server["process_cpu_cores"]) / s.achieved_rps)
            for s in curve.steps
            if s.server and s.server.get("process_cpu_cores") and s.achieved_rps > 0
        )
        generator = _generator_cpu(curve)
        if not cores or not server or not generator:
            return None
        rates = [r for r, _ in server]
        g_rates, g_cpu = zip(*generator)
        other = {s.achieved_rps: s.other_load_cores or 0.0 for s in curve.steps if s.achieved_rps > 0}
        return cls(
            float(cores),
            tuple(rates),
            tuple(c for _, c in server),
            tuple(float(np.interp(r, g_rates, g_cpu)) for r in rates),
            tuple(other.get(r, 0.0) for r in rates),
        )

    def demand_cores(self, rate: float) -> float:
        """The cores the server, the generator and other work on the machine together ask for at `rate`."""
        per_request = np.interp(rate, self.rates_rps, self.server_cpu_s) + np.interp(
            rate, self.rates_rps, self.generator_cpu_s
        )
        other = float(np.interp(rate, self.rates_rps, self.other_cores)) if self.other_cores else 0.0
        return float(per_request * rate) + other

    def stretch(self, rate: float) -> float:
        """How much longer each batch takes at `rate`: 1 while the cores suffice, else demand over cores."""
        return max(1.0, self.demand_cores(rate) / self.cores)


def _generator_cpu(curve: Curve) -> list[tuple[float, float]]:
    """(rate, the generator's CPU seconds per request): from its floor, else from the steps' record of it."""
    floor = sorted(
        (float(r["achieved_rps"]), float(r["cpu_per_request_s"]))
        for r in (curve.generator_floor or {}).get("rates", [])
        if r.get("achieved_rps") and r.get("cpu_per_request_s")
    )
    if floor:
        return floor
    return sorted(
        (s.achieved_rps, s.generator_cpu_percent / 100.0 / s.achieved_rps)
        for s in curve.steps
        if s.generator_cpu_percent and s.achieved_rps > 0
    )
