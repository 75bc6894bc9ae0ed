"""`latlab bench`: its options and how they become BenchSettings (defaults: seed 003's grids, --quick, --full)."""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from latlab.bench.experiments import (
    BenchError,
    BenchSettings,
    MeasureSettings,
    fixed_params_width,
    run_bench,
    write_run,
)
from latlab.common.user_input import UserError

ZOO_BATCHES = "1,2,4,8,16,32,64"
FULL_MIN_WIDTH = 64  # --full deepens the fixed-parameter sweep until the layers get this narrow


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The bench subcommand's options; grid options default to seed 003's values (or --quick's)."""
    add = parser.add_argument
    add(
        "--quick",
        action="store_true",
        help="small grid for the lab: batch 1..256 at d=128 L=128 (+ zoo "
        "sweeps 1..64 for --models, stopping a sweep past 1 s per run), "
        "ort-cpu and torch-cpu",
    )
    add("--full", action="store_true", help="every n_layers point (128..3840 step 128) and deeper fixed-params")
    add(
        "--experiments",
        help="comma list of batch_size,d_model,n_layers,fixed_params,zoo_batch "
        "(default: the four seed sweeps, plus zoo_batch when --models is given)",
    )
    add(
        "--backends",
        help="comma list of ort-cpu,ort-cuda,torch-cpu,torch-cuda (default: the CPU ones, "
        "plus the CUDA ones where a GPU is present)",
    )
    add("--models", default="", help="zoo models for batch sweeps, e.g. mlp,ffn,cnn,minilm,rnn")
    add("--batches", help="batch_size sweep (default 1,2,4,...,2048); ranges as start:stop:step")
    add("--d-models", help="d_model sweep (default 64,128,...,4096)")
    add("--layers", help="n_layers sweep (default every 4th of 128:3840:128; --full: all)")
    add(
        "--fixed-params", type=int, help="parameter count of the fixed-params sweep (default 2**27; 2**31 on a GPU box)"
    )
    add("--fixed-layers", help="depths of the fixed-params sweep (default 1,2,4,...,4096)")
    add("--zoo-batches", help=f"zoo batch sweep (default {ZOO_BATCHES})")
    add("--d-model", type=int, default=128, help="width where it is held fixed")
    add("--n-layers", type=int, default=128, help="depth where it is held fixed")
    add("--seq-len", type=int, default=64, help="sequence length for sequence models (minilm, rnn)")
    add(
        "--threads",
        type=int,
        default=0,
        help="ONNX Runtime intra-op threads and PyTorch's threads (0 = each runtime's default)",
    )
    add(
        "--max-params",
        type=int,
        default=0,
        help="skip points with more parameters (default: fp32 weights up to a quarter of RAM)",
    )
    add("--min-time", type=float, default=None, help="seconds of timed runs per point, at least (default 0.2)")
    add("--cache-dir", type=Path, default=Path("models/bench"), help="exported ONNX files, reused across runs")
    add("--out", type=Path, help="run folder (default runs/bench-<timestamp>)")


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    """Turn parsed options into settings; BenchError for values that cannot be read."""
    gpu_box = _gpu_present()
    experiments = _names(args.experiments) or (["batch_size"] if args.quick else list(BenchSettings().experiments))
    if args.models and args.experiments is None:
        experiments.append("zoo_batch")
    backends = _names(args.backends) or (
        ["ort-cpu", "torch-cpu"] + ([] if args.quick or not gpu_box else ["ort-cuda", "torch-cuda"])
    )
    fixed_params = args.fixed_params if args.fixed_params is not None else (2**31 if gpu_box else 2**27)
    measure = MeasureSettings(warmup=1, min_time_s=0.1) if args.quick else MeasureSettings()
    if args.min_time is not None:
        measure.min_time_s = args.min_time
    return BenchSettings(
        experiments=experiments,
        backends=backends,
        models=_names(args.models),
        batches=parse_ints("--batches", args.batches)
        if args.batches
        else [2**k for k in range(9 if args.quick else 12)],
        d_models=parse_ints("--d-models", args.d_models) if args.d_models else [2**k for k in range(6, 13)],
        layers=parse_ints("--layers", args.layers) if args.layers else _default_layers(args.full),
        fixed_params=fixed_params,
        fixed_layers=parse_ints("--fixed-layers", args.fixed_layers)
        if args.fixed_layers
        else _default_fixed_layers(fixed_params, args.full),
        zoo_batches=parse_ints("--zoo-batches", args.zoo_batches or ZOO_BATCHES),
        d_model=args.d_model,
        n_layers=args.n_layers,
        seq_len=args.seq_len,
        threads=args.threads,
        max_params=args.max_params,
        cache_dir=args.cache_dir,
        measure=measure,
        max_run_s=1.0 if args.quick else BenchSettings.max_run_s,
    )


def _default_layers(full: bool) -> list[int]:
    layers = list(range(128, 3841, 128))
    return layers if full else layers[::4]


def _default_fixed_layers(params: int, full: bool) -> list[int]:
    deepest = 2**12
    if full:
        deepest = max(1, min(2**14, 2 ** int(math.log2(max(1, params // FULL_MIN_WIDTH**2)))))
    return [2**k for k in range(int(math.log2(deepest)) + 1) if fixed_params_width(params, 2**k) >= 8]


def parse_ints(option: str, text: str) -> list[int]:
    """'1,2,4' or a range '128:3840:128' -> integers; BenchError on anything else."""
    values: list[int] = []
    try:
        for part in (p.strip() for p in text.split(",") if p.strip()):
            if ":" in part:
                start, stop, step = (int(x) for x in (part.split(":") + ["1"])[:3])
                values += list(range(start, stop + 1, step)) if step > 0 else []
            else:
                values.append(int(part))
    except ValueError:
        raise BenchError(f"{option}: cannot read {text!r}; write integers like 1,2,4 or 128:3840:128") from None
    if not values or any(v < 1 for v in values):
        raise BenchError(f"{option} needs positive integers, got {text!r}")
    return values


def _names(text: str | None) -> list[str]:
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def _gpu_present() -> bool:
    from latlab.bench.backends import gpu_name

    return gpu_name() is not None


def run(args: argparse.Namespace) -> Path:
    """Run the bench the options describe; write bench.json and the figures; return the run folder."""
    settings = settings_from_args(args)
    out = args.out or Path("runs") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}"
    started = time.perf_counter()
    doc = run_bench(settings, log=lambda line: print(line, flush=True))
    written = write_run(doc, out)
    skipped = sum(len(e["skipped"]) for e in doc["experiments"])
    points = sum(len(e["points"]) for e in doc["experiments"])
    print(format_table(doc))
    print(f"bench: {points} points, {skipped} skipped, {time.perf_counter() - started:.1f} s")
    print(f"results: {written[0]}  figures: {', '.join(p.name for p in written[1:]) or 'none'}")
    return out


def format_table(doc: dict) -> str:
    """Median milliseconds per experiment: one row per grid value, one column per backend."""
    lines = []
    for experiment in doc["experiments"]:
        vary = experiment["vary"]
        backends = sorted({p["backend"] for p in experiment["points"]})
        medians = {(p[vary], p["backend"]): p["median_s"] * 1e3 for p in experiment["points"]}
        widths = {p[vary]: p.get("d_model") for p in experiment["points"]}
        lines.append(f"{experiment['name']} ({experiment['model']}): median ms")
        lines.append(f"  {vary:>10s}" + "".join(f"{b:>12s}" for b in backends))
        for value in sorted({key[0] for key in medians}):
            label = f"{value}" + (f" d={widths[value]}" if experiment["name"] == "fixed_params" else "")
            cells = "".join(
                f"{medians[(value, b)]:12.3f}" if (value, b) in medians else f"{'-':>12s}" for b in backends
            )
            lines.append(f"  {label:>10s}{cells}")
    return "\n".join(lines)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`latlab bench`."""
    bench = sub.add_parser("bench", help="in-process microbenchmarks of seed 003: batch, width, depth, fixed params")
    add_arguments(bench)
    bench.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> None:
    try:
        run(args)
    except BenchError as exc:
        raise UserError(str(exc)) from None
