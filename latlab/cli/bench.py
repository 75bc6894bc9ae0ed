"""`latlab bench`: its options (what they mean, and the run: latlab/bench/plan.py)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from latlab.bench.experiments import BenchError, BenchSettings
from latlab.bench.plan import ZOO_BATCHES, BenchOptions
from latlab.bench.plan import run as run_options
from latlab.common.user_input import UserError


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
    return BenchOptions.from_cli_args(args).settings()


def run(args: argparse.Namespace) -> Path:
    """Run the bench the options describe; write bench.json and the figures; return the run folder."""
    out = args.out or Path("runs") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}"
    return run_options(BenchOptions.from_cli_args(args), out)


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
