"""The replica model of each measured deployment, fitted to what the lab measured and checked against it: p99 at
each measured rate and the highest rate under each SLO, off where the rate misses by more than OFF_BY."""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from pathlib import Path

import numpy as np

from latlab.common.machine import key as machine_key
from latlab.common.settings import BatcherSettings
from latlab.loadtest.results import Curve, Run
from latlab.loadtest.search import GENERATOR_BOUND_CPU, late_for, slo_verdict
from latlab.report.fleetplan.fleet import highest_rate
from latlab.report.fleetplan.lab_machine import CheckTerms, GeneratorFloor, SharedCores
from latlab.report.fleetplan.replica import ReplicaModel, simulate
from latlab.report.fleetplan.spread import service_spread
from latlab.report.fleetplan.traffic import gamma_arrivals
from latlab.report.inputs import load_inputs
from latlab.report.predict import BatchTimeFit, FitError, bench_fits, matching_fit, request_overheads
from latlab.report.rates import max_rate_under

OFF_BY = 0.20
"""A predicted rate further than this from the measured one (relative) is off, and the plan does not use it."""
SLOS_S = (0.010, 0.025, 0.050, 0.100)
VALIDATION_REQUESTS = 20_000
MIN_BATCH_SPAN = 0.5
"""Steps' mean batch sizes closer than this tell no slope apart: a stray batch of two in a batching-off sweep would
otherwise read as seconds of run time per sample."""
BENCH_SOURCE = "bench batch-time fit + the machine's serving work per request"
SPLIT_SOURCE = "bench batch-time fit + serving work split per request and per batch (the server's CPU per request)"
OWN_SOURCE = "fit of its own steps (server batch sizes and run times, capacity at its highest rate)"


def curve_models(
    curve: Curve, fits: list[dict], overheads: dict[str, float], splits: dict | None = None, spread: bool = True
) -> list[tuple[ReplicaModel, str]]:
    """The replica models of a deployment worth checking, each with where it comes from: the bench's batch-time fit
    of its model where the bench ran the same model (FP32 export) on its machine, with the machine's serving work
    per request (report/predict.py's), and with that work split per request and per batch (`splits`, from
    serving_splits); and a fit of its own steps' server figures. Each with its service spread (service_spread),
    unless `spread` is false."""
    batcher = curve.batcher or BatcherSettings()
    found = []
    bench = matching_fit(curve, fits) if curve.variant is None else None
    host = machine_key(curve.machine or {})
    if bench is not None and host in overheads:
        fit = bench["fit"]
        c_s = overheads[host]
        found.append((ReplicaModel.of(fit.a_s, fit.b_s, c_s, batcher), BENCH_SOURCE))
    split = (splits or {}).get((host, curve.model))
    if bench is not None and split is not None:
        per_request_s, per_batch_s = split
        fit = bench["fit"]
        found.append((ReplicaModel.of(fit.a_s + per_batch_s, fit.b_s, per_request_s, batcher), SPLIT_SOURCE))
    own = own_fit(curve)
    if own is not None:
        fit, c_s = own
        found.append((ReplicaModel.of(fit.a_s, fit.b_s, c_s, batcher), OWN_SOURCE))
    if not spread:
        return found
    return [(dataclasses.replace(model, spread=service_spread(curve, model)), source) for model, source in found]


def serving_splits(curves: list[Curve]) -> dict[tuple[str, str], tuple[float, float]]:
    """Per machine and model, the server's CPU per request split into a part per request and a part per batch (the
    batcher's hand-offs, a run's set-up), c_r + c_b / n fitted over the steps that kept up across its deployments'
    mean batch sizes n; batching amortises c_b, which one c calibrated with batching off charges to every request.
    Only where the steps span more than one batch size and both parts come out non-negative."""
    points: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for curve in curves:
        for s in curve.steps:
            cores = (s.server or {}).get("process_cpu_cores")
            if cores and s.avg_batch_size and s.achieved_rps > 0 and s.achieved_rps >= 0.9 * s.offered_rps:
                key = (machine_key(curve.machine or {}), curve.model)
                points.setdefault(key, []).append((1.0 / float(s.avg_batch_size), float(cores) / s.achieved_rps))
    splits = {}
    for key, found in points.items():
        x, y = np.asarray(found).T
        if np.ptp(x) < 0.1:  # batch sizes too alike to tell the parts apart
            continue
        per_batch, per_request = np.polyfit(x, y, 1)
        if per_batch >= 0 and per_request > 0:
            splits[key] = (float(per_request), float(per_batch))
    return splits


def own_fit(curve: Curve) -> tuple[BatchTimeFit, float] | None:
    """t(n) = a + b·n from each step's mean batch size and the server's mean run time per request, and the serving
    work per request c that makes the model's capacity the highest rate the deployment achieved (where the sweep
    saturated it; else the server's time per request outside the queue and the run)."""
    steps = [s for s in curve.steps if s.server and s.server.get("compute_s") and s.avg_batch_size]
    if not steps:
        return None
    points = [(float(s.avg_batch_size), float(s.server["compute_s"])) for s in steps]
    constant = BatchTimeFit(statistics.median(t for _, t in points), 0.0, len(points), int(points[0][0]))
    try:
        if np.ptp([n for n, _ in points]) < MIN_BATCH_SPAN:
            raise FitError("batch sizes too alike for a slope")
        fit = BatchTimeFit.from_points(points)
    except FitError:  # one batch size (batching off): the run time is a constant
        fit = constant
    top = max(steps, key=lambda s: s.achieved_rps)
    instances = int((curve.batcher or BatcherSettings()).instances)
    if curve.saturated and top.achieved_rps > 0:
        n = float(top.avg_batch_size)
        c_s = instances / top.achieved_rps - fit.time_s(n) / n
    else:
        outside = [
            s.server["request_s"] - s.server.get("queue_s", 0.0) - s.server["compute_s"]
            for s in steps
            if s.server.get("request_s") is not None
        ]
        c_s = statistics.median(outside) if outside else 0.0
    return fit, max(c_s, 0.0)


def floor_p99_s(curve: Curve, rate: float) -> float:
    """The load generator's own p99 round trip at `rate` (its floor, measured before the sweep), interpolated; 0
    where the run did not measure it. Every measured latency includes it; the model's do not."""
    points = sorted(
        (r["achieved_rps"], r["p99_s"])
        for r in (curve.generator_floor or {}).get("rates", [])
        if r.get("p99_s") is not None and r.get("achieved_rps")
    )
    if not points:
        return 0.0
    return float(np.interp(rate, [p[0] for p in points], [p[1] for p in points]))


def sent_cv(curve: Curve, rate: float) -> float:
    """The burstiness the server was offered at `rate`: the CV of the gaps between requests as the generator sent
    them (a loaded generator sends burstier than it intends), interpolated over the steps; 1 (Poisson) unsaid."""
    points = sorted(
        (s.achieved_rps, s.arrival_cv or s.intended_cv) for s in curve.steps if s.arrival_cv or s.intended_cv
    )
    if not points:
        return 1.0
    return float(np.interp(rate, [p[0] for p in points], [p[1] for p in points]))


def predicted_p99_s(
    model: ReplicaModel, curve: Curve, rate: float, seed: int = 0, terms: CheckTerms = CheckTerms()
) -> float:
    """The model's p99 at `rate`, under the burstiness sent at that rate, on the lab's machine as `terms` say: the
    replica slowed where it and the generator ask more CPU than the machine has, and the generator's floor drawn
    per request (or its p99 added to the model's)."""
    cv = sent_cv(curve, rate)
    base = gamma_arrivals(1.0, cv, VALIDATION_REQUESTS * 1.02, np.random.default_rng(seed))[:VALIDATION_REQUESTS]
    cores = SharedCores.of(curve) if terms.shared_cores else None
    if cores is not None:
        model = model.slowed(cores.stretch(rate))
    # each draw from its own seed: one generator's stream for all would tie each gap to its service time
    served = simulate(base / rate, model, seed + 1)
    if terms.floor == "p99":
        return served.percentile_s(99) + floor_p99_s(curve, rate)
    floor = GeneratorFloor.of(curve) if terms.floor == "drawn" else None
    if floor is None:
        return served.percentile_s(99)
    latency = served.latency_s + floor.draw(rate, served.requests, np.random.default_rng(seed + 2))
    return float(np.percentile(latency, 99, method="higher"))


def validate_curve(
    curve: Curve,
    model: ReplicaModel,
    source: str,
    slos_s=SLOS_S,
    seed: int = 0,
    bracketed: bool = False,
    terms: CheckTerms = CheckTerms(),
) -> dict:
    """One deployment's check: p99 per measured step, the rate under each SLO, measured and predicted, and whether
    the model is off: any SLO's predicted rate further than OFF_BY from the measured one (the highest step that met
    it), or with `bracketed`, further than OFF_BY outside the measured bracket (measured_bracket)."""
    steps = [
        {
            "rate": s.achieved_rps,
            "measured_p99_s": s.p99_s,
            "predicted_p99_s": predicted_p99_s(model, curve, s.achieved_rps, seed, terms),
        }
        for s in curve.steps
        if s.p99_s is not None and s.achieved_rps > 0
    ]
    for step in steps:
        step["error"] = _error(step["predicted_p99_s"], step["measured_p99_s"])
    slos = []
    p99_at = functools.cache(lambda rate: predicted_p99_s(model, curve, rate, seed, terms))  # bisections share rates
    for slo_s in slos_s:
        measured, broke = measured_bracket(curve, slo_s)
        predicted = highest_rate(lambda r: p99_at(r) <= slo_s, model.capacity_rps())
        error, outside = _error(predicted, measured), _bracket_error(predicted, measured, broke)
        slos.append(
            {
                "slo_s": slo_s,
                "measured_rps": measured,
                "broke_rps": broke,
                "broke_by_generator": _generator_decided(curve, broke, slo_s),
                "predicted_rps": predicted,
                "error": error,
                "bracket_error": outside,
                "off": abs(outside if bracketed else error) > OFF_BY,
            }
        )
    return {
        "deployment": curve.name,
        "model": curve.model,
        "provider": curve.provider,
        "traffic": curve.traffic,
        "cv": sent_cv(curve, max((s.achieved_rps for s in curve.steps), default=0.0)),
        "source": source,
        "replica": model,
        "terms": terms,
        "stretch": _largest_stretch(curve, terms),
        "generator_bound": sum(
            1 for s in curve.steps if s.generator_bound and s.p99_s is not None and s.achieved_rps > 0
        ),
        "steps": steps,
        "slos": slos,
        "off": any(s["off"] for s in slos),
    }


def measured_bracket(curve: Curve, slo_s: float) -> tuple[float, float]:
    """What the run measured of the highest rate under an SLO: the highest achieved rate of a step that met it (0:
    none did) and the lowest above it of a step that broke it (inf: none did). The truth lies between; a sweep's
    steps are its resolution apart."""
    best = max_rate_under(curve.steps, slo_s)
    met = best.achieved_rps if best is not None else 0.0
    broke = min(
        (s.achieved_rps for s in curve.steps if s.achieved_rps > met and slo_verdict(s, slo_s) == "broken"),
        default=math.inf,
    )
    return met, broke


def _generator_decided(curve: Curve, rate: float, slo_s: float) -> bool:
    """Whether the generator may have broken the bound at the step of this rate, by loadtest.search's rules: its CPU
    saturated, or its send lateness alone could have broken this bound."""
    return any(
        (s.generator_cpu_percent or 0.0) > GENERATOR_BOUND_CPU or late_for(s.send_lateness_p99_s, s.p99_s, (slo_s,))
        for s in curve.steps
        if s.achieved_rps == rate
    )


def _bracket_error(predicted: float, met: float, broke: float) -> float:
    """Relative error of a predicted rate against the measured bracket [met, broke]: 0 inside it, else from the
    nearer end; infinite where the run measured no step at all."""
    if met == 0 and broke == math.inf:
        return 0.0 if predicted == 0 else math.inf
    if predicted < met:
        return (predicted - met) / met
    if predicted > broke:
        return (predicted - broke) / broke
    return 0.0


def _error(predicted: float, measured: float | None) -> float:
    """Relative error of a prediction; 0 when both are 0, infinite when only the measurement is."""
    if measured is None or not math.isfinite(predicted):
        return math.inf
    if measured == 0:
        return 0.0 if predicted == 0 else math.inf
    return (predicted - measured) / measured


def _largest_stretch(curve: Curve, terms: CheckTerms) -> float:
    """How much the shared cores slowed the replica at the busiest measured step (1: never, or the term is off)."""
    cores = SharedCores.of(curve) if terms.shared_cores else None
    return max((cores.stretch(s.achieved_rps) for s in curve.steps), default=1.0) if cores else 1.0


def validation_rows(
    results: Path | str | tuple[list[Run], list[dict]],
    slos_s=SLOS_S,
    bracketed: bool = False,
    terms: CheckTerms = CheckTerms(),
) -> list[dict]:
    """Every deployment of a lab run (a run folder, or its runs and bench documents as report.inputs.load_inputs
    returns them) with its replica model and how far it is from what was measured (validate_curve's rows; off as
    `bracketed` says; the lab machine's terms as `terms` say)."""
    if isinstance(results, (str, Path)):
        runs, bench = load_inputs([Path(results)], None)
    else:
        runs, bench = results
    curves = [c for run in runs for c in run.deployments if c.steps]
    fits = bench_fits(bench)
    overheads = request_overheads(curves, fits)
    splits = serving_splits(curves)
    rows = []
    for curve in curves:
        checked = [
            validate_curve(curve, model, source, slos_s=slos_s, bracketed=bracketed, terms=terms)
            for model, source in curve_models(curve, fits, overheads, splits, spread=terms.spread)
        ]
        if checked:  # kept: the fit within OFF_BY for the most SLOs (then the least worst error); the others beside it
            checked.sort(key=lambda r: (sum(s["off"] for s in r["slos"]), _worst(r)))
            rows.append(
                {**checked[0], "others": [{"source": r["source"], "worst_error": _worst(r)} for r in checked[1:]]}
            )
    return rows


def _worst(row: dict) -> float:
    """The largest relative error of a row's SLO rates."""
    return max((abs(s["error"]) for s in row["slos"]), default=math.inf)
