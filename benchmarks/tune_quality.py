"""The quick search against brute force, side by side in one run: for one model on the CPU, the quick search as
the lab and `latlab tune` run it and a brute-force search measure the same space with the same probes (one server
per round, an SLO search per configuration), each then measures its best few again side by side (tune.confirm),
and a referee measures the two choices side by side, REFEREE_ROUNDS times in alternating order at the finalists'
resolution: the quick search's share of the brute-force best is the ratio of their median rates there. Prints
how many configurations each measured, and writes quality.json.

    .venv/bin/python benchmarks/tune_quality.py ffn --slo 25ms --models-dir models     # ~25 min on 2 cores
    .venv/bin/python benchmarks/tune_quality.py mlp --brute-choice int8:64:0           # the climb again, ~6-10 min

`--brute-choice VARIANT:BATCH:WAIT[:adaptive]` skips the brute force and referees the quick search's choice against
the configuration an earlier brute force of the same space chose (docs/tuning.md records each): the climb's
share of the space and its choice's share of that best, side by side, after a change to the climb.

The model and its INT8 variant are exported into --models-dir first unless they are there already.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

from latlab.common.user_input import parse_slo_bound
from latlab.lab.run import ensure_models
from latlab.lab.plan import PLANS, available_cores, cpu_share
from latlab.tune.lab_search import plan_start
from latlab.tune.search import Candidate, brute_force, confirm, quick_search, share_of_best, space_for
from latlab.lab.variants import ensure_variants
from latlab.tune.run import TuneJob, fine_probe, probe_round

REFEREE_ROUNDS = 4
"""How many times the referee measures the two choices side by side."""


def job_for(args: argparse.Namespace, plan, share, work: Path) -> TuneJob:
    model = plan.models[0]
    paths = ensure_models(args.models_dir, plan)
    variants = ensure_variants(args.models_dir, plan, paths)[model.name]  # INT8 made now if missing
    print(f"{model.name}: {variants.notes}", flush=True)
    return TuneJob(plan, model, variants.for_provider("cpu"), "cpu", parse_slo_bound(args.slo), work)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a zoo model: mlp, ffn, cnn, minilm")
    parser.add_argument("--slo", default="25ms")
    parser.add_argument("--models-dir", type=Path, default=Path("models"))
    parser.add_argument("--out", type=Path, default=Path("runs") / f"tune-quality-{time.strftime('%Y%m%d-%H%M%S')}")
    parser.add_argument("--brute-choice", help="VARIANT:BATCH:WAIT[:adaptive] an earlier brute force chose")
    parser.add_argument(
        "--start",
        choices=("plan", "middle"),
        default="plan",
        help="where the climb starts: as the lab's and `latlab tune`'s do (the plan's batching, every variant side "
        "by side first; the default) or at the middle of the space (batch 16, 2 ms; their start before e9d13d6)",
    )
    args = parser.parse_args(argv)
    share = cpu_share(available_cores())
    plan = replace(PLANS["quick"].only([args.model]), bench=False)
    space = space_for("cpu", share.cpu_threads, ("fp32", "int8"))
    quick_job = job_for(args, plan, share, args.out / "quick")
    space = replace(space, variants=tuple(v for v in space.variants if v in quick_job.paths))  # INT8 first
    print(f"{args.model} at p99 <= {args.slo}: {len(space.all())} configurations in the space", flush=True)
    lab_start = args.start == "plan"
    climb = space.starting_at(plan_start(space, plan.models[0])) if lab_start else space
    quick = quick_search(
        climb,
        lambda c: probe_round(quick_job, c),
        budget_s=float("inf"),
        variants_first=lab_start,
        first_probe=fine_probe(quick_job),
    )
    confirm(quick, fine_probe(quick_job))
    (chosen,) = quick.best()
    print(f"quick: {len(quick.configurations())} measured in {quick.seconds:.0f} s; best {chosen.confirmed:.0f} req/s "
          f"side by side ({chosen.candidate.label()}); {quick.stopped}", flush=True)  # fmt: skip
    if args.brute_choice:
        earlier_best(args, plan, share, space, quick, chosen)
        return
    full_job = job_for(args, plan, share, args.out / "brute")
    full = brute_force(space, lambda c: probe_round(full_job, c))
    screened = full.best()[0]  # before its finalists are measured again: what one probe each would have chosen
    confirm(full, fine_probe(full_job))
    (found,) = full.best()
    print(f"brute force: {len(full.tried)} measured in {full.seconds:.0f} s; best {found.confirmed:.0f} req/s "
          f"side by side ({found.candidate.label()})", flush=True)  # fmt: skip
    both = [chosen.candidate, found.candidate]
    referee_rates = {c: [] for c in both}
    if chosen.candidate != found.candidate:
        referee_rates = referee(args, plan, share, both, max(chosen.confirmed, found.confirmed))
        medians = [statistics.median(referee_rates[c]) for c in both]
        share_refereed = medians[0] / max(medians[1], 1e-9)
    else:
        share_refereed = 1.0
    print(f"referee: quick's choice {referee_rates[both[0]]}, brute force's {referee_rates[both[1]]}: "
          f"share {share_refereed:.2f}")  # fmt: skip
    quick_rank = sorted(full.tried, key=lambda t: -(t.rate or 0)).index(
        next(t for t in full.tried if t.candidate == chosen.candidate)
    )
    summary = {
        **quick_fields(args, space, quick, chosen),
        "brute_best": found.candidate.label(),
        "brute_best_rps_side_by_side": found.confirmed,
        "brute_best_by_one_probe_each": screened.candidate.label(),
        "referee_rps": {"quick": referee_rates[both[0]], "brute": referee_rates[both[1]]},
        "quick_share_of_best_refereed": share_refereed,
        "quick_share_of_best_by_brute_force_screening": share_of_best(quick, full),
        "quick_best_rank_in_brute_force_screening": quick_rank + 1,
        "quick_seconds": quick.seconds,
        "brute_seconds": full.seconds,
    }
    (args.out / "quality.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


def quick_fields(args: argparse.Namespace, space, quick, chosen) -> dict:
    """What quality.json says of the quick search, with or without a brute force beside it."""
    return {
        "model": args.model,
        "slo": args.slo,
        "start": args.start,
        "space": len(space.all()),
        "quick_measured": len(quick.configurations()),
        "quick_probes": len(quick.tried),
        "quick_share_of_space": len(quick.configurations()) / len(space.all()),
        "quick_best": chosen.candidate.label(),
        "quick_best_rps_side_by_side": chosen.confirmed,
    }


def referee(args: argparse.Namespace, plan, share, both: list, start_rate: float) -> dict:
    """The two configurations side by side, REFEREE_ROUNDS times in alternating order at the finalists' resolution."""
    rates = {c: [] for c in both}
    job = job_for(args, plan, share, args.out / "referee")
    job.start_rate = start_rate
    for k in range(REFEREE_ROUNDS):
        order = both if k % 2 == 0 else both[::-1]
        for c, r in zip(order, fine_probe(job)(order)):
            rates[c].append(r or 0.0)
    return rates


def earlier_best(args: argparse.Namespace, plan, share, space, quick, chosen) -> None:
    """Referee the quick search's choice against the configuration an earlier brute force chose."""
    variant, batch, wait, *rest = args.brute_choice.split(":")
    instances, threads = space.layouts[0]
    found = space.canonical(Candidate(variant, int(batch), float(wait), rest == ["adaptive"], instances, threads))
    if found not in space.all():
        raise SystemExit(f"--brute-choice {args.brute_choice}: not a configuration of the space")
    both = [chosen.candidate, found]
    rates = referee(args, plan, share, both, chosen.confirmed or chosen.rate) if found != both[0] else {}
    share_refereed = statistics.median(rates[both[0]]) / max(statistics.median(rates[both[1]]), 1e-9) if rates else 1.0
    summary = {
        **quick_fields(args, space, quick, chosen),
        "brute_best_earlier": found.label(),
        "referee_rps": {"quick": rates.get(both[0]), "brute": rates.get(both[1])},
        "quick_share_of_best_refereed": share_refereed,
        "quick_seconds": quick.seconds,
    }
    (args.out / "quality.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
