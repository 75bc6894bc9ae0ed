"""How much a replica's batch time varies, fitted from a lab run: the sigma of the replica's log-normal batch-time
factor (ReplicaModel.spread) from the run's one-at-a-time probe."""

from __future__ import annotations

import math

from latlab.loadtest.results import Curve
from latlab.report.fleetplan.lab_machine import Z99
from latlab.report.fleetplan.replica import ReplicaModel

MAX_SPREAD = 2.0
"""The widest batch-time spread fitted: p99 - p50 of a mean-1 log-normal grows with sigma up to about Z99."""


def service_spread(curve: Curve, model: ReplicaModel) -> float:
    """How much a request's service varies, as the sigma of the model's log-normal batch-time factor: the one that
    gives the model's lone request (mean service_s(1)) the p99 - p50 of the run's one-at-a-time probe, or where it
    has none, of the lowest-rate step less the generator floor's own p99 - p50 at its lowest rate. The probe's
    spread is taken as the server's, which holds the request meanwhile; 0 where the run says nothing of it."""
    lone = curve.single_request or {}
    if lone.get("p99_s") is not None and lone.get("p50_s") is not None:
        excess = lone["p99_s"] - lone["p50_s"]
    else:
        lowest = min((s for s in curve.steps if s.p99_s is not None and s.p50_s is not None), key=_rate, default=None)
        if lowest is None:
            return 0.0
        excess = lowest.p99_s - lowest.p50_s - _floor_spread_s(curve)
    return spread_for(max(excess, 0.0) / model.service_s(1))


def spread_for(relative_excess: float) -> float:
    """The sigma whose mean-1 log-normal has p99 - p50 = relative_excess, by bisection over [0, MAX_SPREAD] (where
    p99 - p50 still grows with sigma); MAX_SPREAD past what that range reaches."""

    def excess(sigma: float) -> float:
        return math.exp(-(sigma**2) / 2) * (math.exp(Z99 * sigma) - 1)

    if relative_excess <= 0:
        return 0.0
    if excess(MAX_SPREAD) <= relative_excess:
        return MAX_SPREAD
    low, high = 0.0, MAX_SPREAD
    for _ in range(40):
        low, high = ((low + high) / 2, high) if excess((low + high) / 2) < relative_excess else (low, (low + high) / 2)
    return (low + high) / 2


def _floor_spread_s(curve: Curve) -> float:
    """The generator floor's p99 - p50 at the lowest rate it was measured at (0 where not measured)."""
    rates = [r for r in (curve.generator_floor or {}).get("rates", []) if r.get("p99_s") and r.get("p50_s")]
    lowest = min(rates, key=lambda r: r.get("achieved_rps") or 0.0, default=None)
    return lowest["p99_s"] - lowest["p50_s"] if lowest else 0.0


def _rate(step) -> float:
    return step.achieved_rps
