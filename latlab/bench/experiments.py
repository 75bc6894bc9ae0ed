"""`latlab bench`: seed 003's in-process experiments (batch, width, depth, fixed parameters) on ORT and PyTorch."""

from __future__ import annotations

import gc
import json
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil

SCHEMA = "latlab.bench/1"
BENCH_FILE = "bench.json"
EXPERIMENTS = ("batch_size", "d_model", "n_layers", "fixed_params", "zoo_batch")
SEED_EXPERIMENTS = EXPERIMENTS[:4]
VARIES = {
    "batch_size": "batch_size",
    "d_model": "d_model",
    "n_layers": "n_layers",
    "fixed_params": "n_layers",
    "zoo_batch": "batch_size",
}
FP32_BYTES = 4


class BenchError(Exception):
    """A bench setting the user got wrong (bad grid value, unknown model or backend)."""


@dataclass
class MeasureSettings:
    """How long each point runs: `warmup` untimed runs, then at least `min_repeats` runs and `min_time_s`,
    stopping at `max_repeats` runs or after `max_time_s` (with at least 3 runs)."""

    warmup: int = 2
    min_repeats: int = 5
    min_time_s: float = 0.2
    max_repeats: int = 200
    max_time_s: float = 3.0


@dataclass
class BenchSettings:
    """One bench run: which experiments, on which backends, over which grids."""

    experiments: list[str] = field(default_factory=lambda: list(SEED_EXPERIMENTS))
    backends: list[str] = field(default_factory=lambda: ["ort-cpu", "torch-cpu"])
    models: list[str] = field(default_factory=list)
    batches: list[int] = field(default_factory=lambda: [2**k for k in range(12)])
    d_models: list[int] = field(default_factory=lambda: [2**k for k in range(6, 13)])
    layers: list[int] = field(default_factory=lambda: list(range(128, 3841, 128))[::4])
    fixed_params: int = 2**27
    fixed_layers: list[int] = field(default_factory=lambda: [2**k for k in range(13)])
    zoo_batches: list[int] = field(default_factory=lambda: [2**k for k in range(7)])
    d_model: int = 128
    n_layers: int = 128
    seq_len: int = 64
    threads: int = 0
    max_params: int = 0
    """Skip points with more parameters than this; 0 = fp32 weights up to a quarter of RAM."""
    max_run_s: float = 10.0
    """Once one run of a backend takes longer than this, its larger points are skipped."""
    cache_dir: Path = Path("models/bench")
    measure: MeasureSettings = field(default_factory=MeasureSettings)


@dataclass
class Timing:
    median_s: float
    min_s: float
    max_s: float
    repeats: int


def measure(
    run: Callable[[], None], settings: MeasureSettings, clock: Callable[[], float] = time.perf_counter
) -> Timing:
    """Time `run` after warm-up; repeats bounded by count and time, so fast points get many samples."""
    for _ in range(settings.warmup):
        run()
    samples: list[float] = []
    started = clock()
    while len(samples) < settings.max_repeats:
        before = clock()
        run()
        after = clock()
        samples.append(after - before)
        elapsed = after - started
        if len(samples) >= settings.min_repeats and elapsed >= settings.min_time_s:
            break
        if elapsed >= settings.max_time_s and len(samples) >= min(3, settings.min_repeats):
            break
    return Timing(statistics.median(samples), min(samples), max(samples), len(samples))


def max_params(settings: BenchSettings) -> int:
    if settings.max_params > 0:
        return settings.max_params
    return psutil.virtual_memory().total // 4 // FP32_BYTES


def fixed_params_width(params: int, n_layers: int) -> int:
    """d = sqrt(P / L) rounded to a multiple of 8 (at least 8)."""
    return max(8, round(math.sqrt(params / n_layers) / 8) * 8)


def grid(name: str, settings: BenchSettings) -> tuple[dict, list[tuple[int, int, list[int]]]]:
    """An experiment's fixed values and its groups of (d_model, n_layers, batch sizes) sharing one model."""
    d, n = settings.d_model, settings.n_layers
    if name == "batch_size":
        return {"d_model": d, "n_layers": n}, [(d, n, list(settings.batches))]
    if name == "d_model":
        return {"batch_size": 1, "n_layers": n}, [(w, n, [1]) for w in settings.d_models]
    if name == "n_layers":
        return {"batch_size": 1, "d_model": d}, [(d, depth, [1]) for depth in settings.layers]
    if name == "fixed_params":
        groups = [(fixed_params_width(settings.fixed_params, depth), depth, [1]) for depth in settings.fixed_layers]
        return {"batch_size": 1, "params": settings.fixed_params}, groups
    raise BenchError(f"unknown experiment {name!r}; choose from {', '.join(EXPERIMENTS)}")


class _Experiment:
    """Collects one experiment's points and skips while its models are measured backend by backend."""

    def __init__(
        self,
        name: str,
        model: str,
        fixed: dict,
        settings: BenchSettings,
        log: Callable[[str], None],
        unavailable: dict[str, str] | None,
    ):
        self.doc = {"name": name, "model": model, "vary": VARIES[name], "fixed": fixed, "points": [], "skipped": []}
        self.settings, self.log = settings, log
        self.too_slow: dict[str, float] = {}
        # Shared by a run's experiments: a failed CUDA load is slow and logs a page, so try it once.
        self.unavailable = {} if unavailable is None else unavailable

    def skip(self, point: dict, backend: str, reason: str) -> None:
        self.doc["skipped"].append({"point": point, "backend": backend, "reason": reason})
        self.log(f"  skip {backend} {point}: {reason}")

    def run_model(self, point_model, batches: list[int], params: int, zoo_name: str | None) -> None:
        from latlab.bench import backends as bb

        # PyTorch first: the ONNX file is written from the module, and ORT sessions then load it alone.
        for backend in sorted(self.settings.backends, key=lambda b: not b.startswith("torch")):
            rows = [{"batch_size": b, **point_model.config, "params": params} for b in batches]
            try:
                if backend in self.unavailable:
                    raise bb.BackendUnavailable(self.unavailable[backend])
                if backend.startswith("ort"):
                    bb.ensure_onnx(point_model, zoo_name)
                prepare = bb.make_runner(backend, point_model, self.settings.threads)
            except bb.BackendUnavailable as exc:
                self.unavailable[backend] = str(exc)
                for row in rows:
                    self.skip(row, backend, str(exc))
                continue
            except bb.RUN_FAILURES as exc:
                for row in rows:
                    self.skip(row, backend, f"failed to load: {_first_line(exc)}")
                continue
            for row in rows:
                self._run_point(backend, prepare, row)
            del prepare
            bb.release(point_model)
            gc.collect()

    def _run_point(self, backend: str, prepare, row: dict) -> None:
        if backend in self.too_slow:
            self.skip(
                row,
                backend,
                f"an earlier point already took {self.too_slow[backend]:.1f} s per run "
                f"(> {self.settings.max_run_s:g} s)",
            )
            return
        from latlab.bench.backends import RUN_FAILURES

        try:
            timing = measure(prepare(row["batch_size"]), self.settings.measure)
        except RUN_FAILURES as exc:
            self.skip(row, backend, f"failed: {_first_line(exc)}")
            return
        self.doc["points"].append({"backend": backend, **row, **timing.__dict__})
        self.log(f"  {backend:10s} {row}  median {timing.median_s * 1e3:9.3f} ms  ({timing.repeats} runs)")
        if timing.median_s > self.settings.max_run_s:
            self.too_slow[backend] = timing.median_s


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def run_seed_experiment(
    name: str, settings: BenchSettings, log: Callable[[str], None] = print, unavailable: dict[str, str] | None = None
) -> dict:
    """One of seed 003's sweeps over the ffn toy; points over the parameter budget are recorded as skipped."""
    from latlab.bench import backends as bb

    fixed, groups = grid(name, settings)
    experiment = _Experiment(name, "ffn", fixed, settings, log, unavailable)
    budget = max_params(settings)
    for d_model, n_layers, batches in groups:
        params = d_model * d_model * n_layers
        if params > budget:
            for backend in settings.backends:
                for b in batches:
                    experiment.skip(
                        {"batch_size": b, "d_model": d_model, "n_layers": n_layers, "params": params},
                        backend,
                        f"{params:,} parameters (fp32 {params * FP32_BYTES / 2**30:.2f} GiB) "
                        f"exceed the budget of {budget:,} ({budget * FP32_BYTES / 2**30:.2f} GiB; "
                        f"--max-params)",
                    )
            continue
        point_model = bb.ffn_model(d_model, n_layers, settings.cache_dir)
        experiment.run_model(point_model, batches, params, None)
        del point_model
        gc.collect()
    return experiment.doc


def run_zoo_experiment(
    model: str, settings: BenchSettings, log: Callable[[str], None] = print, unavailable: dict[str, str] | None = None
) -> dict:
    """A batch sweep of one zoo model (its own default sizes; --seq-len for sequence models)."""
    from latlab.bench import backends as bb

    point_model = bb.zoo_model(model, settings.seq_len, settings.cache_dir)
    params = sum(p.numel() for p in point_model.module.parameters())
    experiment = _Experiment("zoo_batch", model, dict(point_model.config), settings, log, unavailable)
    experiment.run_model(point_model, list(settings.zoo_batches), params, model)
    return experiment.doc


def machine_info(settings: BenchSettings) -> dict:
    import onnxruntime as ort
    import torch

    from latlab.common import machine
    from latlab.bench.backends import gpu_name

    return {
        **machine.describe(),
        "gpu": gpu_name(),
        "ort_version": ort.__version__,
        "torch_version": torch.__version__,
        "threads": settings.threads,
        "torch_threads": torch.get_num_threads(),
    }


def run_bench(settings: BenchSettings, log: Callable[[str], None] = print) -> dict:
    """Run every experiment asked for; return the bench.json document."""
    import torch

    validate(settings)
    torch_threads = torch.get_num_threads()
    if settings.threads:
        # Same thread count for both runtimes, so the comparison is of runtimes, not of thread pools.
        torch.set_num_threads(settings.threads)
    try:
        doc = {
            "schema": SCHEMA,
            "machine": machine_info(settings),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "experiments": [],
        }
        unavailable: dict[str, str] = {}
        for name in settings.experiments:
            models = settings.models if name == "zoo_batch" else [None]
            for model in models:
                log(f"{name}: {model or 'ffn'}")
                doc["experiments"].append(
                    run_zoo_experiment(model, settings, log, unavailable)
                    if model
                    else run_seed_experiment(name, settings, log, unavailable)
                )
    finally:
        torch.set_num_threads(torch_threads)
    return doc


def validate(settings: BenchSettings) -> None:
    """Reject what the user can get wrong, before anything slow starts."""
    from latlab.bench.backends import BACKENDS
    from latlab.export.zoo import BUILDERS

    _choices("experiment", settings.experiments, EXPERIMENTS)
    _choices("backend", settings.backends, BACKENDS)
    _choices("model", settings.models, tuple(BUILDERS))
    if "zoo_batch" in settings.experiments and not settings.models:
        raise BenchError("the zoo_batch experiment needs --models, e.g. --models mlp,ffn")
    for option, values in (
        ("--batches", settings.batches),
        ("--d-models", settings.d_models),
        ("--layers", settings.layers),
        ("--fixed-layers", settings.fixed_layers),
        ("--zoo-batches", settings.zoo_batches),
        (
            "--d-model/--n-layers/--seq-len/--fixed-params",
            [settings.d_model, settings.n_layers, settings.seq_len, settings.fixed_params],
        ),
    ):
        if not values or any(v < 1 for v in values):
            raise BenchError(f"{option} needs positive integers, got {values}")
    if settings.threads < 0 or settings.max_params < 0:
        raise BenchError("--threads and --max-params must be >= 0")
    if not 0 <= settings.measure.min_time_s < float("inf"):
        raise BenchError(f"--min-time must be a finite number >= 0, got {settings.measure.min_time_s}")


def _choices(kind: str, given: list[str], known: tuple[str, ...]) -> None:
    unknown = [g for g in given if g not in known]
    if unknown:
        raise BenchError(f"unknown {kind} {unknown[0]!r}; choose from {', '.join(known)}")


def write_run(doc: dict, out: Path) -> list[Path]:
    """bench.json plus one PNG per figure in `out`; returns the files written."""
    from latlab.report.bench_plot import plot_bench

    out.mkdir(parents=True, exist_ok=True)
    written = [out / BENCH_FILE]
    written[0].write_text(json.dumps(doc, indent=1, default=str) + "\n")
    for name, png in plot_bench(doc).items():
        (out / name).write_bytes(png)
        written.append(out / name)
    return written
