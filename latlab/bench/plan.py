"""What a bench run is asked to do (`BenchOptions`, the `latlab bench` options as a value) and how it becomes
BenchSettings (seed 003's grids by default; `quick` for the lab, `full` for deeper sweeps); running it into a run
folder; and starting it as a child process from the plan as JSON (`python -m latlab.bench PLAN.json`), which is how
the lab runs its quick bench: no command line is rebuilt."""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from latlab.bench.experiments import (
    BenchError,
    BenchSettings,
    MeasureSettings,
    fixed_params_width,
    run_bench,
    write_run,
)

ZOO_BATCHES = "1,2,4,8,16,32,64"
FULL_MIN_WIDTH = 64  # `full` deepens the fixed-parameter sweep until the layers get this narrow
PLAN_FILE = "plan.json"
"""In the run folder of a bench started as a child: what it was asked to run."""


@dataclass(frozen=True)
class BenchOptions:
    """The options of `latlab bench` (see latlab/cli/bench.py for their help); grids as the user writes them."""

    quick: bool = False
    full: bool = False
    experiments: str | None = None
    backends: str | None = None
    models: str = ""
    batches: str | None = None
    d_models: str | None = None
    layers: str | None = None
    fixed_params: int | None = None
    fixed_layers: str | None = None
    zoo_batches: str | None = None
    d_model: int = 128
    n_layers: int = 128
    seq_len: int = 64
    threads: int = 0
    max_params: int = 0
    min_time: float | None = None
    cache_dir: Path = Path("models/bench")

    @classmethod
    def from_cli_args(cls, args: object) -> BenchOptions:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})

    def settings(self) -> BenchSettings:
        """The settings these options describe; BenchError for values that cannot be read."""
        gpu_box = _gpu_present()
        experiments = _names(self.experiments) or (["batch_size"] if self.quick else list(BenchSettings().experiments))
        if self.models and self.experiments is None:
            experiments.append("zoo_batch")
        backends = _names(self.backends) or (
            ["ort-cpu", "torch-cpu"] + ([] if self.quick or not gpu_box else ["ort-cuda", "torch-cuda"])
        )
        fixed_params = self.fixed_params if self.fixed_params is not None else (2**31 if gpu_box else 2**27)
        measure = MeasureSettings(warmup=1, min_time_s=0.1) if self.quick else MeasureSettings()
        if self.min_time is not None:
            measure.min_time_s = self.min_time
        return BenchSettings(
            experiments=experiments,
            backends=backends,
            models=_names(self.models),
            batches=parse_ints("--batches", self.batches)
            if self.batches
            else [2**k for k in range(9 if self.quick else 12)],
            d_models=parse_ints("--d-models", self.d_models) if self.d_models else [2**k for k in range(6, 13)],
            layers=parse_ints("--layers", self.layers) if self.layers else _default_layers(self.full),
            fixed_params=fixed_params,
            fixed_layers=parse_ints("--fixed-layers", self.fixed_layers)
            if self.fixed_layers
            else _default_fixed_layers(fixed_params, self.full),
            zoo_batches=parse_ints("--zoo-batches", self.zoo_batches or ZOO_BATCHES),
            d_model=self.d_model,
            n_layers=self.n_layers,
            seq_len=self.seq_len,
            threads=self.threads,
            max_params=self.max_params,
            cache_dir=self.cache_dir,
            measure=measure,
            max_run_s=1.0 if self.quick else BenchSettings.max_run_s,
        )

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "cache_dir": str(self.cache_dir)}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> BenchOptions:
        record = json.loads(text)
        return cls(**{**record, "cache_dir": Path(record["cache_dir"])})


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
    from latlab.bench.backends import gpu_name  # imports torch and ORT: only where a bench runs

    return gpu_name() is not None


def run(options: BenchOptions, out: Path) -> Path:
    """Run the bench the options describe; write bench.json and the figures into `out`; return `out`."""
    settings = options.settings()
    started = time.perf_counter()
    doc = run_bench(settings, log=lambda line: print(line, flush=True))
    written = write_run(doc, out)
    skipped = sum(len(e["skipped"]) for e in doc["experiments"])
    points = sum(len(e["points"]) for e in doc["experiments"])
    print(format_table(doc))
    print(f"bench: {points} points, {skipped} skipped, {time.perf_counter() - started:.1f} s")
    print(f"results: {written[0]}  figures: {', '.join(p.name for p in written[1:]) or 'none'}")
    return out


def run_child(options: BenchOptions, out: Path) -> None:
    """`run` in a child process of its own (the bench pins threads and loads both runtimes), from the plan written
    into `out`; RuntimeError when it fails."""
    from latlab.common import procs  # imports requests (ssl): `latlab loadtest` imports this module before Locust

    out.mkdir(parents=True, exist_ok=True)
    (out / PLAN_FILE).write_text(options.to_json() + "\n")
    child = procs.start([sys.executable, "-m", "latlab.bench", str(out / PLAN_FILE)])
    try:
        if child.wait() != 0:
            raise RuntimeError(f"bench failed with status {child.returncode}")
    finally:
        procs.stop(child)


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
