"""INT8 against FP32 in process: each zoo model and its int8 variant (made as `latlab export --int8` makes it),
timed side by side on one ONNX Runtime thread at batch 1, 8 and 32, with the variant's accuracy figure.

    .venv/bin/python -m benchmarks.experiments.int8_speed [--models mlp ffn cnn minilm] [--seconds 4] [--models-dir DIR]

Models at the zoo's default sizes (mlp 4-100-1, ffn 128 x 128 layers, cnn ResNet-18 at 224x224, minilm);
inputs: seeded random tensors from the model's generator, real sentences for minilm (the first n of the
check set, padded to the longest). FP32 and INT8 take turns in blocks of about BLOCK_S seconds, so a
neighbour's load on a shared machine lands on both while each block runs with its own weights in cache,
as a server running one model does (alternating call by call made the 9 MB FP32 ffn 2.5x slower); the
figure is the median time per batch, each block's first call left out. A model whose int8 folder is
already in --models-dir is reused, not exported again.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from latlab.export import samples
from latlab.export.accuracy import Bound
from latlab.export.int8 import export_int8, int8_folder
from latlab.export.onnx_export import export, load_metadata
from latlab.export.zoo import BUILDERS, ZooModel

BATCHES = (1, 8, 32)
MIN_CALLS, WARM_UP, BLOCK_S = 5, 3, 0.25


def session(path: Path) -> ort.InferenceSession:
    """One intra-op and one inter-op thread: a per-core figure, the same for both precisions."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def prepared(kind: str, models_dir: Path) -> ZooModel:
    """The zoo model, exported with its int8 variant into models_dir unless they are there already."""
    torch.manual_seed(0)
    zoo = BUILDERS[kind]()
    if not (int8_folder(models_dir, kind) / "metadata.json").is_file():
        export(kind, zoo, models_dir, source=f"benchmarks/experiments/int8_speed.py: {kind}")
        export_int8(kind, zoo, models_dir, f"benchmarks/experiments/int8_speed.py: {kind}", Bound.for_model(kind))
    return zoo


def feed(zoo: ZooModel, batch: int) -> dict[str, np.ndarray]:
    if samples.takes_text(zoo):
        return samples.tokenized(zoo, samples.SENTENCES[:batch])
    with torch.random.fork_rng():
        torch.manual_seed(batch)
        return {name: t.numpy() for name, t in zoo.random_inputs(batch).items()}


def alternate(sessions: list[ort.InferenceSession], inputs: dict, seconds: float) -> list[float]:
    """Median seconds per call of each session, taking turns in blocks, for about `seconds` in all."""
    for each in sessions:
        for _ in range(WARM_UP):
            each.run(None, inputs)
    times: list[list[float]] = [[] for _ in sessions]
    deadline = time.perf_counter() + seconds
    while min(len(t) for t in times) < MIN_CALLS or time.perf_counter() < deadline:
        for each, out in zip(sessions, times):
            out.extend(block(each, inputs))
    return [statistics.median(t) for t in times]


def block(session_: ort.InferenceSession, inputs: dict) -> list[float]:
    """Per-call seconds of one block of calls (at least two), the first (its weights back into cache) left out."""
    calls, end = [], time.perf_counter() + BLOCK_S
    while len(calls) < 2 or time.perf_counter() < end:
        started = time.perf_counter()
        session_.run(None, inputs)
        calls.append(time.perf_counter() - started)
    return calls[1:]


def megabytes(size: int) -> str:
    return f"{size / 1e6:.2f} MB" if size >= 1e5 else f"{size / 1e3:.1f} kB"


def measure(kind: str, models_dir: Path, seconds: float) -> None:
    zoo = prepared(kind, models_dir)
    meta = load_metadata(int8_folder(models_dir, kind))
    accuracy, sizes = meta["accuracy"], meta["file_bytes"]
    print(
        f"\n{kind}: {meta['quantization']['recipe']}; {accuracy['label']} {accuracy['figure']:.4f} "
        f"(bound {accuracy['min_accuracy']:g}); file {megabytes(sizes['fp32'])} -> {megabytes(sizes['int8'])}"
    )
    print("| batch | input | FP32 ms | INT8 ms | INT8 speed-up |")
    print("|---:|---|---:|---:|---:|")
    fp32, int8 = session(models_dir / kind / "model.onnx"), session(int8_folder(models_dir, kind) / "model.onnx")
    for batch in BATCHES:
        inputs = feed(zoo, batch)
        slow, fast = alternate([fp32, int8], inputs, seconds)
        shape = "x".join(str(d) for d in next(iter(inputs.values())).shape)
        print(f"| {batch} | {shape} | {slow * 1e3:.3f} | {fast * 1e3:.3f} | {slow / fast:.2f}x |", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "ffn", "cnn", "minilm"], choices=sorted(BUILDERS))
    parser.add_argument("--seconds", type=float, default=4.0, help="time per model and batch size (both precisions)")
    parser.add_argument("--models-dir", type=Path, help="where the models go (default: a fresh temporary folder)")
    args = parser.parse_args(argv)
    models_dir = args.models_dir or Path(tempfile.mkdtemp(prefix="int8-speed-"))
    print(f"onnxruntime {ort.__version__}, one thread; models in {models_dir}")
    for kind in args.models:
        measure(kind, models_dir, args.seconds)


if __name__ == "__main__":
    main()
