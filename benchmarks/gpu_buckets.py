"""Batch buckets on a device, measured through latlab's own OnnxModel: CUDA graphs vs plain bound runs per bucket,
a conv net under alternating batch sizes (one session, padded buckets, one session per bucket), memory per bucket.

    .venv/bin/python benchmarks/gpu_buckets.py [--provider cuda] [--out runs/gpu-buckets.json] [--quick]

With --provider cuda (the default when CUDA loads) it measures, on a GPU:
1. ffn d=128 L=128 at each bucket 1..64: the plain bound run (I/O binding, shared session) against the
   same batch replayed as that bucket's CUDA graph, interleaved run by run so both see the same machine;
2. cnn (ResNet-18, 224x224) at batch sizes 3,7,5,8,2,6,4,1 repeated, every size warmed up first: one session
   without buckets (every run a new shape), one session with buckets 1,2,4,8 (padded), one session per bucket;
3. memory: process RSS and GPU memory used (NVML) after building the shared-session and per-bucket models.
With --provider cpu it runs the same code on the CPU paths and says so: "graphs" are then the per-bucket
fixed buffers and bindings without capture, and nothing here measures a GPU. Models are exported once into
--models-dir (torch, CPU); ffn and cnn come from the zoo."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import psutil

from harness import export_zoo

from latlab.server.config import parse_config
from latlab.server.runtime.graphs import CudaGraphRunner
from latlab.server.runtime.providers import provider_load_error
from latlab.server.runtime.model import OnnxModel

FFN_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
CNN_SIZES = (3, 7, 5, 8, 2, 6, 4, 1)


def model(path: Path, provider: str, batcher: dict, cuda: dict | None = None, name: str = "b") -> OnnxModel:
    deployment = {
        "name": name,
        "model_path": str(path),
        "provider": provider,
        "batcher": batcher,
        "cpu": {"intra_op_threads": 1 if provider == "cpu" else 0},
    }  # 1: the 2-core dev box is shared
    if provider != "cpu":
        deployment["cuda"] = {"use_tf32": False, **(cuda or {})}
    return OnnxModel(parse_config({"deployments": [deployment]}).deployments[0])


def graph_run(path: Path, provider: str, buckets: tuple[int, ...]) -> Callable[[dict], dict]:
    """A run through one CUDA graph per bucket (captured during warm-up); on cpu the same per-bucket buffers,
    bindings and run options through CudaGraphRunner on the CPU device, which captures nothing."""
    batcher = {"max_batch_size": buckets[-1], "batch_buckets": list(buckets)}
    if provider != "cpu":
        built = model(path, provider, batcher, {"enable_cuda_graph": True})
        for batch in built.warmup_batches(buckets[-1]):
            built.run(batch)
        return built.run
    built = model(path, "cpu", batcher)
    specs = [(s.name, s.dtype, s.shape) for s in built.inputs], [(s.name, s.dtype, s.shape) for s in built.outputs]
    runner = CudaGraphRunner(built.session, *specs, buckets=buckets, device="cpu")
    names = [o.name for o in built.outputs]
    return lambda feed: runner.run(feed, names)[0]


def timed_ms(run, feed: dict) -> float:
    started = time.perf_counter()
    run(feed)
    return (time.perf_counter() - started) * 1e3


def ffn_graphs(path: Path, provider: str, repeats: int) -> dict:
    """Median ms per run at each bucket: plain bound run vs that bucket's graph, interleaved."""
    plain = model(path, provider, {"max_batch_size": 64, "batch_buckets": []})
    graphs = graph_run(path, provider, FFN_BUCKETS)
    name = plain.inputs[0].name
    rows = {}
    for size in FFN_BUCKETS:
        x = {name: np.random.default_rng(size).standard_normal((size, 128)).astype(np.float32)}
        plain.run(x)
        pairs = [(timed_ms(plain.run, x), timed_ms(graphs, x)) for _ in range(repeats)]
        p, g = statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs)
        rows[size] = {"plain_ms": round(p, 3), "graph_ms": round(g, 3), "speedup": round(p / g, 2)}
        print(f"  ffn batch {size:>3}: plain {p:7.3f} ms  graph {g:7.3f} ms  x{p / g:5.2f}", flush=True)
    return rows


def cnn_alternating(path: Path, provider: str, cycles: int) -> dict:
    """ms per run over alternating batch sizes, each variant warmed up at every size (or bucket) first."""
    variants = {
        "one_session_no_buckets": {"batch_buckets": []},
        "one_session_buckets": {"batch_buckets": [1, 2, 4, 8], "bucket_sessions": "shared"},
        "session_per_bucket": {"batch_buckets": [1, 2, 4, 8], "bucket_sessions": "per_bucket"},
    }
    x = np.random.default_rng(0).standard_normal((8, 3, 224, 224)).astype(np.float32)
    result = {}
    for label, batcher in variants.items():
        built = model(path, provider, {"max_batch_size": 8, **batcher})
        name = built.inputs[0].name
        for batch in built.warmup_batches(8):
            built.run(batch)
        times = [timed_ms(built.run, {name: x[:n]}) for n in CNN_SIZES * cycles]
        result[label] = {
            "median_ms": round(statistics.median(times), 2),
            "max_ms": round(max(times), 2),
            "runs_ms": [round(t, 2) for t in times],
        }
        print(
            f"  cnn {label:<24} median {result[label]['median_ms']:8.2f} ms  max {result[label]['max_ms']:8.2f} ms",
            flush=True,
        )
        del built
    return result


def gpu_used_bytes() -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used)
    except Exception:  # no NVML or no GPU: host memory only
        return None


def memory_probe(path: Path, provider: str, mode: str) -> dict:
    """Build cnn with buckets 1,2,4,8 run `mode`, warm every bucket, and say what that added (a fresh process
    each: an earlier model's freed arenas would hide the next one's RSS)."""
    rss, gpu = psutil.Process().memory_info().rss, gpu_used_bytes()
    built = model(path, provider, {"max_batch_size": 8, "batch_buckets": [1, 2, 4, 8], "bucket_sessions": mode})
    for batch in built.warmup_batches(8):
        built.run(batch)
    after_gpu = gpu_used_bytes()
    return {
        "rss_mb": round((psutil.Process().memory_info().rss - rss) / 2**20, 1),
        "gpu_mb": None if gpu is None or after_gpu is None else round((after_gpu - gpu) / 2**20, 1),
        "sessions": built.bucket_runs()["sessions"],
    }


def memory(path: Path, provider: str) -> dict:
    """Memory added by cnn on one shared session and on one session per bucket, each in its own process."""
    result = {}
    for mode in ("shared", "per_bucket"):
        done = subprocess.run(
            [sys.executable, __file__, "--memory-probe", mode, "--provider", provider, "--probe-model", str(path)],
            capture_output=True,
            text=True,
            check=True,
        )
        result[mode] = json.loads(done.stdout.strip().splitlines()[-1])
        print(
            f"  cnn memory {mode:<10} +{result[mode]['rss_mb']} MB RSS, GPU +{result[mode]['gpu_mb']} MB, "
            f"{result[mode]['sessions']} session(s)",
            flush=True,
        )
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--provider", choices=("cuda", "cpu"), default="cpu" if provider_load_error("CUDAExecutionProvider") else "cuda"
    )
    parser.add_argument("--models-dir", default="models/bench")
    parser.add_argument("--out", default="runs/gpu-buckets.json")
    parser.add_argument("--quick", action="store_true", help="fewer runs (a CPU check of the script)")
    parser.add_argument("--skip-cnn", action="store_true")
    parser.add_argument("--memory-probe", choices=("shared", "per_bucket"), help=argparse.SUPPRESS)
    parser.add_argument("--probe-model", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_probe:
        print(json.dumps(memory_probe(Path(args.probe_model), args.provider, args.memory_probe)))
        return
    if args.provider == "cpu":
        print("CPU paths only: no CUDA here, so these figures say nothing about a GPU", flush=True)
    models = Path(args.models_dir)
    ffn = export_zoo(models, "ffn", "--d-model", "128", "--n-layers", "128")
    report: dict = {"provider": args.provider, "ffn": ffn_graphs(ffn, args.provider, 20 if args.quick else 200)}
    if not args.skip_cnn:
        cnn = export_zoo(models, "cnn")
        report["cnn_alternating"] = cnn_alternating(cnn, args.provider, 1 if args.quick else 3)
        report["cnn_memory"] = memory(cnn, args.provider)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
