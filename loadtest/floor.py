"""The generator's floor: what the load generator itself adds to every latency it reports, measured against the
server under test before a sweep.

Every latency counts from a request's intended send time, so the generator's punctuality, its HTTP client and the
loopback hop are part of every figure. Before the first deployment the sweep sends open-loop GETs of a trivial
route of the server (ROUTE: no body, no model) through the same users, client and recorder as the sweep, at two
rates: the sweep's lowest (raised so that the calibration's seconds hold MIN_SAMPLES_P99 requests) and its highest
(at most HIGH_PER_PROCESS per generator process, about where a process nears its limit on a trivial route). The
round trip there, from the intended send time, is the floor: what a reading holds besides the deployment's own
work (the generator's lateness and client, the hop, the server's HTTP layer). A step whose p99 is no more than
NEAR_FACTOR times the floor's p99 at its rate is marked "near the floor": up to half its p99 may be the instrument.

The calibration itself runs in calibrate.py; this module reads its record (the report imports it)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from latlab.loadtest.recorder import MIN_SAMPLES_P99

if TYPE_CHECKING:
    from latlab.loadtest.results import Step

ROUTE = "/v2/health/live"
"""The Open Inference Protocol's liveness route: every such server has it, and it touches no model."""
CALIBRATION = "(generator floor)"
"""The users' deployment label while they calibrate (no deployment is named so: a model name has no spaces)."""
HIGH_PER_PROCESS = 1000.0
"""The calibration's high rate per generator process, at most (the lean client costs about a third of a
millisecond of CPU per request: docs/performance.md)."""
NEAR_FACTOR = 2.0
"""A step's p99 within this factor of the floor's p99 at its rate is marked near the floor."""


def calibration_rates(loads: list[float], max_rate: float, processes: int, seconds: float) -> list[float]:
    """The two rates a calibration measures: the sweep's lowest (at least 1.5x MIN_SAMPLES_P99 requests expected
    in `seconds`, so that Poisson noise rarely leaves it short) and its highest, capped at HIGH_PER_PROCESS per
    process; one rate where they are within 2x of each other."""
    low = max(min(loads), 1.5 * MIN_SAMPLES_P99 / seconds)
    high = min(max(*loads, max_rate), HIGH_PER_PROCESS * max(processes, 1))
    return [low, high] if high >= 2 * low else [low]


def floor_at(floor: dict | None, rate: float | None) -> dict | None:
    """The calibrated row nearest `rate` (on a log scale); None without a floor or figures."""
    rows = [r for r in (floor or {}).get("rates", []) if r.get("p99_s") is not None and not r.get("errors")]
    if not rows:
        return None
    if not rate or rate <= 0:
        return rows[0]
    return min(rows, key=lambda r: abs(math.log(r["target_rps"] / rate)))


def near_floor(step: Step, floor: dict | None) -> bool:
    """Whether the floor at the step's rate could be half or more of its p99 (NEAR_FACTOR)."""
    row = floor_at(floor, step.target_rps or step.offered_rps)
    return bool(row and step.p99_s is not None and step.p99_s <= NEAR_FACTOR * row["p99_s"])


def floor_line(floor: dict | None) -> str:
    """'generator floor (GET /v2/health/live): this generator adds p50 0.41 ms, p99 0.88 ms at 50 req/s ...; ...',
    or that it was not measured."""
    if not floor:
        return "generator floor: not measured"
    return f"generator floor (GET {floor['route']}): this generator adds {floor_figures(floor)}"


def floor_figures(floor: dict) -> str:
    """The floor's figures at each calibrated rate (or why there are none), '; '-separated."""
    parts = []
    for row in floor.get("rates", []):
        if row.get("errors") or row.get("p99_s") is None:
            parts.append(f"GET {floor['route']} failed at {row['target_rps']:.0f} req/s ({row.get('errors')} errors)")
            continue
        parts.append(
            f"p50 {row['p50_s'] * 1e3:.2f} ms, p99 {row['p99_s'] * 1e3:.2f} ms at {row['target_rps']:.0f} req/s"
            f" (sent late p99 {(row['send_lateness_p99_s'] or 0) * 1e3:.2f} ms,"
            f" generator CPU {row['generator_cpu_percent']:.0f}%)"
        )
    return "; ".join(parts)


def only_the_floor_breaks(p99_s: float | None, slo_s: float, floor: dict | None, rate: float | None) -> dict | None:
    """The floor's row when a p99 over the bound would be within it without the floor (p99 - floor p99 <= the
    bound): then the generator, not the deployment, may be what breaks it."""
    row = floor_at(floor, rate)
    if row is None or p99_s is None or p99_s <= slo_s or p99_s - row["p99_s"] > slo_s:
        return None
    return row
