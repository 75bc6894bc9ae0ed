"""Each side at its best: per model, the provider's variant against FP32 served rate under a p99 bound (INT8 on the
CPU, FP16 with --provider cuda), with the variant's accuracy, and the configuration `latlab tune` finds against the
lab's best of two, all measured side by side.

For each model: the tune search (quick climb, then its best few again side by side) over FP32 and INT8 within
--search-minutes; then ROUNDS rounds, in alternating order, of one server serving the lab's two deployments
(batching off, and the plan's batching setting) in FP32, the same two in INT8, and the tune's best, each given
an SLO search to CONFIRM_RESOLUTION. A configuration's rate is the median over the rounds.

    .venv/bin/python benchmarks/search_vs_lab.py minilm cnn --slo 50ms --models-dir models   # ~25 min on 2 cores
    python benchmarks/search_vs_lab.py minilm cnn --slo 50ms --provider cuda                # FP16 on a GPU

The models are exported with their INT8 variant into --models-dir first unless they are there already.
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
from latlab.tune.search import Candidate, space_for
from latlab.lab.variants import FOR_PROVIDER, ensure_variants
from latlab.tune.run import TuneJob, fine_probe, run_tune

ROUNDS = 3
"""Rounds of the side-by-side measurement; a configuration's rate is the median of its rounds (one SLO search
in a few is thrown low by a hiccup of the shared machine: mlp INT8 batch <= 64 held 3117 then 5599 req/s)."""


def prepared(models_dir: Path, plan, name: str, provider: str) -> tuple[dict[str, Path], dict]:
    """The model's FP32 export and the provider's variant (INT8 on the CPU, FP16 on CUDA; made now unless they
    are there, from this very export), and the variant's note (its accuracy, or why there is none)."""
    paths = ensure_models(models_dir, plan)
    variants = ensure_variants(models_dir, plan, paths)[name]
    print(f"{name}: {variants.notes}", flush=True)
    return variants.for_provider(provider), variants.notes.get(FOR_PROVIDER[provider], {})


def lab_two(plan, name: str, threads: int, variant: str) -> list[Candidate]:
    """The lab's two CPU deployments of a model (batching off, the plan's batching setting) as configurations."""
    (model,) = [m for m in plan.models if m.name == name]
    return [Candidate(variant, 1, 0.0, False, 1, threads), Candidate.serving(variant, model.batching, threads)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="zoo models: mlp, ffn, cnn, minilm")
    parser.add_argument("--slo", default="50ms")
    parser.add_argument("--provider", default="cpu", choices=["cpu", "cuda"], help="cuda: FP16 against FP32")
    parser.add_argument("--search-minutes", type=float, default=5.0, help="the search's budget per model")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="side-by-side rounds (a rate is their median)")
    parser.add_argument("--models-dir", type=Path, default=Path("models"))
    parser.add_argument("--out", type=Path, default=Path("runs") / f"search-vs-lab-{time.strftime('%Y%m%d-%H%M%S')}")
    args = parser.parse_args(argv)
    share = cpu_share(available_cores())
    slo_s = parse_slo_bound(args.slo)
    provider, threads = args.provider, share.cpu_threads if args.provider == "cpu" else 1
    low = FOR_PROVIDER[provider]
    summary = {"slo": args.slo, "provider": provider, "cpu_threads": share.cpu_threads, "models": {}}
    for name in args.models:
        plan = replace(PLANS["cpu" if provider == "cpu" else "gpu"].only([name]), bench=False)
        plan = replace(plan, step_seconds=PLANS["quick"].step_seconds, warmup_seconds=PLANS["quick"].warmup_seconds,
                       max_windows=PLANS["quick"].max_windows)  # fmt: skip
        variants, accuracy = prepared(args.models_dir, plan, name, provider)
        model = plan.models[0]
        space = space_for(provider, threads, tuple(variants))
        job = TuneJob(plan, model, variants, provider, slo_s, args.out / name / "tune", base={"model": name})
        log = run_tune(job, space, args.search_minutes * 60)
        tuned = log.best()[0].candidate
        print(f"{name}: tune measured {len(log.configurations())} of {len(space.all())} in {log.seconds:.0f} s, "
              f"best {tuned.label()}; {log.stopped}", flush=True)  # fmt: skip
        fp32, lower = lab_two(plan, name, threads, "fp32"), lab_two(plan, name, threads, low)
        contenders = list(dict.fromkeys([*fp32, *lower, tuned]))
        side = TuneJob(plan, model, variants, provider, slo_s, args.out / name / "side-by-side", base={"model": name})
        side.start_rate = job.start_rate
        rates: dict[Candidate, list[float]] = {c: [] for c in contenders}
        for k in range(args.rounds):
            order = contenders if k % 2 == 0 else contenders[::-1]
            for c, r in zip(order, fine_probe(side)(order)):
                rates[c].append(r or 0.0)
        median = {c: statistics.median(v) for c, v in rates.items()}
        best_of_two = max(fp32, key=lambda c: median[c])
        record = {
            low: accuracy,
            "configurations": [
                {
                    "label": c.label(),
                    "rates": rates[c],
                    "median_rps": median[c],
                    "role": "tuned" if c == tuned else ("lab" if c in fp32 else f"lab settings, {low}"),
                }
                for c in contenders
            ],  # fmt: skip
            f"{low}_over_fp32": {
                fp.label(): (median[q] / median[fp] if median[fp] else None) for fp, q in zip(fp32, lower)
            },
            "lab_best_of_two": best_of_two.label(),
            "tuned": tuned.label(),
            "tuned_over_lab_best": median[tuned] / median[best_of_two] if median[best_of_two] else None,
            "tune_measured": len(log.configurations()),
            "space": len(space.all()),
            "tune_seconds": log.seconds,
        }
        summary["models"][name] = record
        print(json.dumps(record, indent=2), flush=True)
        args.out.mkdir(parents=True, exist_ok=True)  # after each model: a run stopped midway keeps what it measured
        (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
