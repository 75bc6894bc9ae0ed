"""The lab's configuration search (`latlab lab --search-minutes M`; the cpu plan's default is 2): before the sweep,
for each model and provider of the plan, `latlab tune`'s search (latlab/tune/search.py: a quick climb over variant,
batching and core split, then its best few again side by side) within an equal share of the budget. It starts at
the plan's batching-on settings, measured in every variant side by side in its first round (what INT8 or FP16
alone buys); the best it finds is swept in full in place of the plan's batching-on deployment, beside batching off,
so the verdict picks among them and the report lists every configuration tried (report/tried.py reads what this
writes).

Written into the run folder: search/<model>-<provider>/ (each round's config, log and probes; tune.json) and
search/variants.json (per model, each variant made, found, refused with its figure, or why none was made).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Callable

from latlab.lab.plan import PLANS, CpuShare, LabPlan, ModelPlan
from latlab.lab.variants import ensure_variants
from latlab.loadtest.results import SEARCH_FOLDER
from latlab.tune.run import TuneJob, run_tune
from latlab.tune.search import Candidate, Space, space_for

TUNED = "tuned"
"""The searched deployment's name ends so: <model>-tuned on a CPU plan, <model>-<provider>-tuned otherwise."""


def tuned_name(plan: LabPlan, model: ModelPlan, provider: str) -> str:
    return f"{model.name}-{TUNED}" if plan.providers == ("cpu",) else f"{model.name}-{provider}-{TUNED}"


def search_plan(
    run_dir: Path,
    models_dir: Path,
    plan: LabPlan,
    paths: dict[str, Path],
    share: CpuShare,
    say: Callable[[str], None] = print,
) -> LabPlan:
    """Search every model on every provider of the plan; return the plan with each best as a tuned deployment
    (ModelPlan.tuned). A search in which no configuration met the bound adds nothing, and says so."""
    folder = run_dir / SEARCH_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    variants = ensure_variants(models_dir, plan, paths, say)
    (folder / "variants.json").write_text(
        json.dumps({name: v.notes for name, v in variants.items()}, indent=2, default=str) + "\n"
    )
    pairs = [(model, provider) for model in plan.models for provider in plan.providers]
    each_s = plan.search_minutes * 60 / len(pairs)
    models = []
    for model in plan.models:
        tuned = []
        for provider in plan.providers:
            slo_s = plan.tune_slo(model)
            slo = f"{slo_s * 1e3:g}ms"
            job = TuneJob(
                probe_timing(plan),
                model,
                variants[model.name].for_provider(provider),
                provider,
                slo_s,
                folder / f"{model.name}-{provider}",
                base={"model": model.name},
            )
            space = space_for(provider, share.cpu_threads, tuple(job.paths))
            space = space.starting_at(plan_start(space, model))
            log = run_tune(job, space, each_s, variants_first=True)
            best = log.best()[0]
            if not best.rate:
                say(f"search {model.name} on {provider}: no configuration met p99 <= {slo}; nothing added")
                continue
            name = tuned_name(plan, model, provider)
            entry = best.candidate.deployment(name, job.paths[best.candidate.variant], provider, job.base)
            tuned.append(entry)
            _mark(job.work / "tune.json", name)
            held = best.confirmed or best.rate
            say(
                f"search {model.name} on {provider} (p99 <= {slo}): {len(log.configurations())} of "
                f"{len(space.all())} configurations in {log.seconds:.0f} s; best {best.candidate.label()} "
                f"({held:.0f} req/s), swept in full as {name}"
            )
        models.append(replace(model, tuned=tuple(tuned)))
    return replace(plan, models=tuple(models))


def probe_timing(plan: LabPlan) -> LabPlan:
    """The plan with the quick plan's step timing, as `latlab tune` probes: a probe ranks configurations, so it takes
    the short steps (the cpu plan's 3 s steps with 1 s of warm-up made one round of two mlp probes take 55 s)."""
    quick = PLANS["quick"]
    return replace(
        plan,
        step_seconds=min(plan.step_seconds, quick.step_seconds),
        max_windows=min(plan.max_windows, quick.max_windows),
        warmup_seconds=min(plan.warmup_seconds, quick.warmup_seconds),
    )


def plan_start(space: Space, model: ModelPlan) -> Candidate:
    """Where the lab's climb starts: the plan's batching-on settings in the provider's variant (INT8 on the CPU,
    FP16 on CUDA, when made), on the first core split. Its first probe then says what the variant alone buys over
    the plan's hand-picked deployment, and a short budget still sweeps the variant at settings known to serve."""
    instances, threads = space.layouts[0]
    return replace(Candidate.serving(space.variants[0], model.batching, threads), instances=instances)


def _mark(tune_json: Path, deployment: str) -> None:
    """Name, in the search's record, the deployment its best is swept as."""
    record = json.loads(tune_json.read_text())
    tune_json.write_text(json.dumps({**record, "swept_as": deployment}, indent=2) + "\n")
