"""The plan's replica model and fleet simulator against a real fleet of N replicas behind a balancer: the p99 each
predicts at the rates the fleet was loaded with, and the highest rate under an SLO, beside what was measured."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from latlab.loadtest.results import Step
from latlab.report.fleetplan.fleet import highest_rate
from latlab.report.fleetplan.replica import ReplicaModel, simulate
from latlab.report.fleetplan.traffic import gamma_arrivals
from latlab.report.rates import max_rate_under

SPLITS = ("roundrobin", "random")
"""How a fleet's arrivals reach its replicas: in turn (HAProxy's roundrobin), or each to a replica drawn at random
(the plan's fleet simulator: one replica given a random 1/N of its kind's share)."""
REQUESTS = 20_000
"""Requests per predicted rate, all replicas together: a p99 of 200 requests beyond it."""


def split_arrivals(arrivals: np.ndarray, replicas: int, how: str, rng: np.random.Generator) -> list[np.ndarray]:
    """Each replica's arrivals (in time order) when `how` (SPLITS) routes them over `replicas`."""
    if how == "roundrobin":
        return [arrivals[k::replicas] for k in range(replicas)]
    if how == "random":
        pick = rng.integers(0, replicas, arrivals.size)
        return [arrivals[pick == k] for k in range(replicas)]
    raise ValueError(f"split {how!r}: one of {', '.join(SPLITS)}")


def fleet_p99_s(
    model: ReplicaModel,
    rate: float,
    replicas: int,
    how: str = "roundrobin",
    cv: float = 1.0,
    added_s: float = 0.0,
    seed: int = 0,
) -> float:
    """The p99 of every request of a fleet of `replicas` alike replicas offered `rate` in all (gamma gaps of CV
    `cv`, split by `how`), plus `added_s` that every measured latency holds and the model does not (the load
    generator's floor through the proxy); inf where more than 1% are rejected."""
    rng = np.random.default_rng(seed)
    arrivals = gamma_arrivals(rate, cv, REQUESTS / rate, rng)
    latencies = np.concatenate(
        [simulate(part, model).latency_s for part in split_arrivals(arrivals, replicas, how, rng)]
    )
    return float(np.percentile(latencies, 99, method="higher")) + added_s


def fleet_rate_under(model: ReplicaModel, slo_s: float, replicas: int, p99_at: Callable[[float], float]) -> float:
    """The highest rate whose predicted p99 (`p99_at(rate)`) meets `slo_s`, below the fleet's capacity."""
    return highest_rate(lambda r: p99_at(r) <= slo_s, replicas * model.capacity_rps())


@dataclass(frozen=True)
class Checked:
    """One prediction beside its measurement: (predicted - measured) / measured."""

    measured: float
    predicted: float

    @property
    def error(self) -> float:
        if self.measured == 0 or not math.isfinite(self.predicted):
            return 0.0 if self.predicted == self.measured else math.inf
        return (self.predicted - self.measured) / self.measured


def p99_rows(steps: list[Step], predict: dict[str, Callable[[float], float]]) -> list[dict]:
    """Per measured step (its achieved rate, in the order of the rates offered), the measured p99 and each
    predictor's (by name) with its error; and whether the load generator's own lateness bounds the step (then its
    p99 measures the instrument more than the fleet, and median_error leaves it out)."""
    rows = []
    for step in sorted(steps, key=lambda s: s.target):
        if step.p99_s is None or step.achieved_rps <= 0:
            continue
        row = {"target": step.target, "rate": step.achieved_rps, "measured_p99_s": step.p99_s}
        row |= {"sent_late_p99_s": step.send_lateness_p99_s, "generator_bound": step.generator_bound}
        for name, p99_at in predict.items():
            row[name] = Checked(step.p99_s, p99_at(step.achieved_rps))
        rows.append(row)
    return rows


def median_error(rows: list[dict], name: str) -> float:
    """The median absolute error of predictor `name` over the rows the generator did not bound (nan: none); the
    median, as a model that calls a rate past its capacity is infinitely late at that one rate."""
    errors = [abs(r[name].error) for r in rows if not r.get("generator_bound")]
    return float(np.median(errors)) if errors else math.nan


def rate_rows(steps: list[Step], slos_s: tuple[float, ...], predict: dict[str, Callable[[float], float]]) -> list[dict]:
    """Per SLO, the highest measured rate that met it (report/rates.py's rule; 0 where none did), the lowest rate
    offered above that step's (`next_rps`, none of which met it: the measurement's resolution), and each
    predictor's highest rate under it with its error."""
    rows = []
    for slo_s in slos_s:
        best = max_rate_under(steps, slo_s)
        measured = best.achieved_rps if best is not None else 0.0
        above = [s.target for s in steps if best is None or s.target > best.target]
        row = {"slo_s": slo_s, "measured_rps": measured, "next_rps": min(above, default=None)}
        for name, rate_under in predict.items():
            row[name] = Checked(measured, rate_under(slo_s))
        rows.append(row)
    return rows


def error_text(checked: Checked) -> str:
    """An error as the benchmark prints it: +12%, or "n/a" where nothing was measured to compare with."""
    return f"{checked.error * 100:+.0f}%" if math.isfinite(checked.error) else "n/a"
