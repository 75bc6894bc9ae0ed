"""The fleet plan of a lab run: the replica kinds it validated (or the committed GPU reference), the fleets made of
them, each over the day of traffic, and the verdict."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from latlab.common.settings import BatcherSettings
from latlab.common.user_input import UserError
from latlab.loadtest.results import read_results
from latlab.report.fleetplan.autoscale import Autoscaler
from latlab.report.fleetplan.fleet import (
    SECONDS_PER_FLEET,
    FleetDay,
    FleetSpec,
    ReplicaKind,
    Sizing,
    Slo,
    plan_fleets,
    size_replica,
    verdict,
)
from latlab.report.fleetplan.replica import ReplicaModel
from latlab.report.fleetplan.traffic import DayTraffic
from latlab.report.fleetplan.validate import validation_rows
from latlab.report.inputs import REFERENCE_DIR, read_bench
from latlab.report.predict import bench_fits

GPU_BATCHER = BatcherSettings(max_batch_size=64, max_queue_delay_ms=2.0, max_queue_size=256)
"""The batcher of a GPU replica planned from the reference bench (no GPU deployment measured): batches of up to
64 formed within 2 ms."""
REFERENCE_SOURCE = "reference bench"
"""The end of a reference kind's source: 'H100 reference bench', named after the GPU whose bench it is."""
TARGET_HELP = "inflight:N (Ray Serve's target_ongoing_requests, default 2) or util:U (U x one replica's SLO rate)"


class PlanError(UserError):
    """A plan that cannot be made from what it is given; the message says what is missing."""


@dataclass
class Plan:
    """Everything the plan found, for the CLI and the report to show."""

    traffic: DayTraffic
    slo: Slo
    kinds: list[ReplicaKind]
    sizing: dict[str, Sizing]
    days: list[FleetDay]
    stride: int
    validation: list[dict]
    notes: list[str] = field(default_factory=list)
    simulate_s: float = 0.0
    """How long the fleets' day took to simulate (wall clock, to tell the simulator's speed)."""

    @property
    def verdict(self) -> str:
        return verdict(self.days, self.slo)


@dataclass(frozen=True)
class PlanRequest:
    """What a plan is asked, checked before any work (latlab plan's options, and latlab report's and lab's
    --plan-* ones); the prices and the run come from where it is made."""

    traffic: DayTraffic
    slo: Slo
    scaler: Autoscaler = field(default_factory=Autoscaler)
    target: str = "inflight:2"
    """inflight:N or util:U (TARGET_HELP)."""
    model: str | None = None
    """Which of the run's models to plan for (None: the first)."""
    use_off: bool = False
    """Plan with replica models the validation found off."""
    budget_s: float = SECONDS_PER_FLEET
    """About how long one fleet's day may take to simulate."""
    cold_start_s: float | None = None
    """Every replica's start to ready (--cold-start), over what the run measured; None: the run's measurement, or
    the scaler's assumption where it measured none."""

    def make(self, run_dir: Path, prices: dict[str, float], rows: list[dict] | None = None) -> Plan:
        """The plan of this request for a run (its validation `rows` where already made)."""
        return make_plan(
            run_dir,
            self.traffic,
            self.slo,
            prices,
            self.scaler,
            self.target,
            self.model,
            self.use_off,
            self.budget_s,
            rows,
            self.cold_start_s,
        )


def check_target(target: str) -> str:
    """The autoscaler target as given, once checked; PlanError otherwise."""
    kind, _, value = target.partition(":")
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if kind not in ("inflight", "util") or not 0 < number < math.inf or (kind == "util" and number > 1):
        raise PlanError(f"--target {target!r}: write {TARGET_HELP}")
    return target


def make_plan(
    run_dir: Path,
    traffic: DayTraffic,
    slo: Slo,
    prices: dict[str, float],
    scaler: Autoscaler | None = None,
    target: str = "inflight:2",
    model: str | None = None,
    use_off: bool = False,
    budget_s: float = SECONDS_PER_FLEET,
    rows: list[dict] | None = None,
    cold_start_s: float | None = None,
) -> Plan:
    """The plan for one model of a run: validate its deployments (unless their `rows` are given, as
    validate.validation_rows returns them), take the best usable one per provider (the committed H100 reference where
    no GPU deployment was measured), size each, and run the fleets over the day. Each kind's replicas start in
    `cold_start_s` where given, else in what the run measured for its deployment, else in the scaler's assumed one."""
    check_target(target)
    notes: list[str] = []
    rows = validation_rows(run_dir) if rows is None else rows
    models = sorted({r["model"] for r in rows if r["model"]})
    if not rows:
        raise PlanError(f"{run_dir}: no deployment with server figures or a bench fit to model")
    model = model or models[0]
    if model not in models:
        raise PlanError(f"--model {model!r}: the run measured {', '.join(models)}")
    if len(models) > 1 and model == models[0]:
        notes.append(f"planned for {model}, the first of the run's models ({', '.join(models)}); choose with --model")
    kinds = []
    cold = _measured_cold_starts(run_dir)
    mine = [r for r in rows if r["model"] == model]
    cpu = _kind("cpu", [r for r in mine if r["provider"] == "cpu"], prices, use_off, notes, cold)
    if cpu is not None:
        kinds.append(cpu)
    gpu = _kind("gpu", [r for r in mine if r["provider"] == "cuda"], prices, use_off, notes, cold)
    if gpu is None:
        gpu = _reference_gpu(model, cpu, prices, notes)
    if gpu is not None:
        kinds.append(gpu)
    if not kinds:
        raise PlanError(f"no usable replica model for {model}: every deployment's model is off (see --use-off)")
    scaler = scaler or Autoscaler()
    kinds = [_cold_start(k, scaler, cold_start_s, notes) for k in kinds]
    sizing = {k.name: size_replica(k.model, slo, traffic.cv, target) for k in kinds}
    specs = fleet_specs(kinds, traffic, sizing)
    started = time.perf_counter()
    days, stride = plan_fleets(specs, traffic, slo, sizing, scaler, budget_s=budget_s)
    return Plan(traffic, slo, kinds, sizing, days, stride, rows, notes, time.perf_counter() - started)


def _kind(
    name: str, rows: list[dict], prices: dict, use_off: bool, notes: list[str], cold_starts: dict[str, float]
) -> ReplicaKind | None:
    """The best usable deployment of a provider (the highest predicted rate under the loosest SLO checked), with
    its server's start to ready where the run measured it (`cold_starts` by deployment)."""
    usable = [r for r in rows if not r["off"]] or (rows if use_off else [])
    if rows and not [r for r in rows if not r["off"]]:
        said = "used anyway (--use-off)" if use_off else "not used"
        notes.append(f"every {name} deployment's model is off by more than 20% of a measured rate: {said}")
    if not usable:
        return None
    best = max(usable, key=lambda r: r["slos"][-1]["predicted_rps"])
    price = _price(prices, name)
    source = f"{best['deployment']}: {best['source']}"
    cold = cold_starts.get(best["deployment"])
    return ReplicaKind(name, best["replica"], price, source, cold, "lab" if cold is not None else "assumed")


def _measured_cold_starts(run_dir: Path) -> dict[str, float]:
    """Each deployment's server start to ready as the run recorded it (Run.cold_start_s), where it did."""
    try:
        runs = read_results(run_dir)
    except (FileNotFoundError, ValueError):  # the validation has already said what is wrong with the run
        return {}
    return {c.name: r.cold_start_s for r in runs if r.cold_start_s is not None for c in r.deployments}


def _cold_start(kind: ReplicaKind, scaler: Autoscaler, given: float | None, notes: list[str]) -> ReplicaKind:
    """The kind with its cold start: `given`, else its deployment's measured one (a reference kind has none), else
    the scaler's assumption; said in the notes."""
    if given is not None:
        kind = replace(kind, cold_start_s=given, cold_start_from="given")
    elif kind.cold_start_s is None:
        kind = replace(kind, cold_start_s=scaler.cold_start_s, cold_start_from="assumed")
    said = {
        "lab": f"{kind.name} replica cold start {kind.cold_start_text}: `latlab serve` start to ready, every "
        "deployment of the lab's config",
        "given": f"{kind.name} replica cold start {kind.cold_start_text}",
        "assumed": f"{kind.name} replica cold start {kind.cold_start_text}, an assumption: "
        + (
            f"the {kind.source} carries no measurement"
            if kind.source.endswith(REFERENCE_SOURCE)
            else "the run measured none"
        ),
    }
    notes.append(said[kind.cold_start_from])
    return kind


def _price(prices: dict, name: str) -> float:
    value = prices.get(name, prices.get("cuda" if name == "gpu" else name))
    if not isinstance(value, (int, float)):
        raise PlanError(f"--price needs {name}=USD per machine-hour (per-core prices do not price a replica)")
    return float(value)


def _reference_gpu(model: str, cpu: ReplicaKind | None, prices: dict, notes: list[str]) -> ReplicaKind | None:
    """A GPU replica from the committed GPU bench of the same model (the first in report/reference/'s order), with
    the CPU deployment's serving work."""
    found = next(
        (f for f in bench_fits(read_bench(REFERENCE_DIR)) if f["model"] == model and f["backend"] == "ort-cuda"),
        None,
    )
    if found is None:
        notes.append(f"no GPU data: the run measured no GPU deployment and the GPU references have no {model}")
        return None
    fit, source = found["fit"], f"{_gpu_short(found['machine'])} {REFERENCE_SOURCE}"
    c_s = cpu.model.c_s if cpu is not None else 0.0
    notes.append(
        f"GPU replica from the committed {source} of {model} (report/reference/), not a measured "
        "deployment: batches of up to 64 within 2 ms, the CPU deployment's serving work per request"
    )
    replica = ReplicaModel.of(fit.a_s, fit.b_s, c_s, GPU_BATCHER)
    return ReplicaKind("gpu", replica, _price(prices, "gpu"), source)


def _gpu_short(machine: dict) -> str:
    """'H100' of 'NVIDIA H100 80GB HBM3': the GPU a reference bench ran on, in a word."""
    words = str(machine.get("gpu") or "GPU").removeprefix("NVIDIA ").split()
    return words[0] if words else "GPU"


def fleet_specs(kinds: list[ReplicaKind], traffic: DayTraffic, sizing: dict[str, Sizing]) -> list[FleetSpec]:
    """Each kind alone, autoscaled; and each as a fixed base sized to the day's trough with the other autoscaled
    for the rest (MArk's shape: a batching GPU base, elastic capacity for the peaks), and the reverse."""
    specs = [FleetSpec(f"{k.name.upper()} only", k) for k in kinds]
    trough = float(traffic.rates_rps.min())
    for base in kinds:
        for elastic in kinds:
            if base is elastic or sizing[base.name].target_rps <= 0:
                continue
            count = max(1, math.floor(trough / sizing[base.name].target_rps))
            name = f"{count} {base.name.upper()} base + {elastic.name.upper()} for peaks"
            specs.append(FleetSpec(name, elastic, base, count))
    return specs
