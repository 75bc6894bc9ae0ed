"""`latlab tune` on a real server: each round of the search (search.py) is one server serving every candidate
of the round as its own deployment, and one load test (a child started from its plan) whose SLO search finds, per
deployment, the highest rate that meets the bound (coarse: the probes rank, they do not report). Deployments idle
while another is measured cost no CPU, so candidates of a round do not disturb each other's figures."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from latlab.common import procs
from latlab.lab.children import model_workload, start_server, step_schedule, write_samples
from latlab.lab.plan import LabPlan, ModelPlan
from latlab.loadtest import child
from latlab.loadtest.plan import SweepPlan
from latlab.loadtest.results import read_results
from latlab.loadtest.schedule import SloSearch
from latlab.server.config import dumps_config, save_config
from latlab.tune.search import FINALISTS, FINE_COST, Candidate, SearchLog, Space, confirm, quick_search

PROBE_RESOLUTION = 0.1
"""The SLO search of a screening probe stops once its bracket is this narrow: a few steps each. At 20% (the first
version) a round's rates fell on two or three levels and a notch's gain of 10-20% hid in them: ffn's climb
stopped after one round with all seven candidates at 2344 or 2812 req/s, at 0.87 of the brute-force best."""
CONFIRM_RESOLUTION = 0.05
"""The finalists' SLO searches (tune.confirm) go this fine: a step or two more each, and a screening bracket no
longer hides which of two close configurations holds more."""
FLOOR_SHARE = 0.25
"""A probe stops halving the rate below this share of the best rate so far: a configuration that cannot hold a
quarter of the best is out of the running, and resolving it costs the slowest steps (at a few req/s a step
needs tens of seconds for its requests)."""


NEAR_GROWTH = 1.25
"""Once a round has measured a rate, the next probes start at the best so far and raise by a quarter, not double:
a step at twice a 2-core machine's ceiling overloaded it so that each bisection step after it broke the bound at
rates that had met it, and every finalist of mlp "held" just its start rate (a tie decided by noise)."""


@dataclass
class TuneJob:
    """One model on one provider under one SLO, and where the search writes its rounds."""

    plan: LabPlan
    """The lab plan of the one model (its step timing; the model's rates, request encoding and samples)."""
    model: ModelPlan
    paths: dict[str, Path]
    """The model's file per variant ("fp32" always)."""
    provider: str
    slo_s: float
    work: Path
    base: dict = field(default_factory=dict)
    """Settings every candidate keeps (the tuned deployment's table of the user's config, or {"model": name})."""
    rounds: list[dict] = field(default_factory=list)
    start_rate: float = 0.0

    def deployment_name(self, k: int) -> str:
        return f"{self.model.name}-tune-{k}"


def round_config(job: TuneJob, candidates: list[Candidate], port: int) -> dict:
    """The server config of one round: every candidate as a deployment of its own."""
    deployments = [
        c.deployment(job.deployment_name(k), job.paths[c.variant], job.provider, job.base)
        for k, c in enumerate(candidates)
    ]
    return {"server": {"host": "127.0.0.1", "port": port}, "deployments": deployments}


def probe_round(job: TuneJob, candidates: list[Candidate], resolution: float = PROBE_RESOLUTION) -> list[float | None]:
    """Serve the round's candidates and return each one's highest rate under the SLO, to `resolution` (None:
    none met it)."""
    k = len(job.rounds)
    folder = job.work / f"round-{k}"
    folder.mkdir(parents=True, exist_ok=True)
    port = procs.free_port()
    config = save_config(round_config(job, candidates, port), folder / "server.toml")
    host = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    server, _ = start_server(config, port, folder / "server.log")
    try:
        plan = probe_plan(job, host, len(candidates), resolution)
        probes = child.start(plan, folder, log_path=folder / "loadtest.log")
        try:
            if probes.wait() != 0:
                raise RuntimeError(f"the probes of round {k} failed: see {folder / 'loadtest.log'}")
        finally:
            procs.stop(probes)
    finally:
        procs.stop(server)
    (run,) = read_results(folder)
    found = {d.name: (d.search or {}).get("rate") for d in run.deployments}
    rates = [found.get(job.deployment_name(i)) for i in range(len(candidates))]
    job.rounds.append(
        {
            "round": k,
            "seconds": time.monotonic() - started,
            "candidates": [c.label() for c in candidates],
            "rates": rates,
            "resolution": resolution,
        }
    )
    held = [r for r in rates if r]
    if held:
        job.start_rate = max(held)  # the next round's probes start near the best so far
    return rates


def probe_plan(job: TuneJob, host: str, count: int, resolution: float = PROBE_RESOLUTION) -> SweepPlan:
    """The round's load test: an SLO search over each of its `count` deployments, from the best rate so far."""
    plan, model = job.plan, job.model
    start = job.start_rate or max(model.rates)  # the listed rates reach towards saturation
    deployments = [job.deployment_name(k) for k in range(count)]
    return SweepPlan(
        workload=model_workload(model, job.work, host, deployments),
        # probes rank configurations side by side: the generator's floor is the same for all of them, and
        # measuring it in each probe would spend the search's budget
        schedule=step_schedule(plan, [start], calibrate_seconds=0.0),
        slo=SloSearch(
            p99_s=job.slo_s,
            search=True,
            resolution=resolution,
            floor=max(1.0, start * FLOOR_SHARE),  # from the first round on: its start stands for the best
            growth=NEAR_GROWTH if job.start_rate else 2.0,
            confidence=plan.confidence,
        ),
    )


def run_tune(job: TuneJob, space: Space, budget_s: float, variants_first: bool = False) -> SearchLog:
    """The quick search over `space` with real probes, then its best few measured again side by side, finer
    (the climb keeps their cost from its budget); writes tune.json (every round, every configuration tried).
    `variants_first`: see tune.quick_search."""
    job.work.mkdir(parents=True, exist_ok=True)
    write_samples(job.work, job.plan)
    began = time.monotonic()
    reserve = math.ceil(FINALISTS * FINE_COST)
    log = quick_search(
        space,
        lambda candidates: probe_round(job, candidates),
        budget_s,
        reserve_probes=reserve,
        variants_first=variants_first,
        first_probe=fine_probe(job),
    )
    left = budget_s - (time.monotonic() - began)
    confirm(log, fine_probe(job), left, probe_cost_s=log.probe_cost_s * FINE_COST, first_owed=True)
    (job.work / "tune.json").write_text(json.dumps(tune_record(job, log), indent=2) + "\n")
    return log


def fine_probe(job: TuneJob):
    """The probe of the finalists: CONFIRM_RESOLUTION, from the best rate so far."""
    return lambda candidates: probe_round(job, candidates, CONFIRM_RESOLUTION)


def tune_record(job: TuneJob, log: SearchLog) -> dict:
    return {
        "model": job.model.name,
        "provider": job.provider,
        "slo_p99_s": job.slo_s,
        "variants": {k: str(v) for k, v in job.paths.items()},
        "stopped": log.stopped,
        "seconds": log.seconds,
        "tried": [t.as_dict() for t in log.tried],
        "confirmed": [t.as_dict() for t in log.confirmed],
        "configurations": [t.as_dict() for t in log.best(len(log.tried))],
        "rounds": job.rounds,
    }


def best_block(job: TuneJob, best: Candidate) -> str:
    """The best configuration as a [[deployments]] TOML block to paste into a serving config."""
    entry = best.deployment(job.base.get("name") or f"{job.model.name}-{job.provider}", job.paths[best.variant],
                            job.provider, job.base)  # fmt: skip
    return dumps_config({"deployments": [entry]})
