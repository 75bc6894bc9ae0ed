"""What the lab's child processes share, its sweeps and the search's probes alike: a ready `latlab serve` of a
config, the `latlab loadtest` options of a model's steps, and the request samples those send."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from latlab.common import procs
from latlab.lab.plan import LabPlan, ModelPlan


def start_server(config: Path, port: int, log_path: Path) -> tuple[subprocess.Popen, int]:
    """`latlab serve` of a config on `port`, ready (stopped again if it never is); the process and its observer
    port (/metrics on threads of their own: scrapes never wait behind the load)."""
    observer_port = procs.free_port()
    server = procs.start(
        [sys.executable, "-m", "latlab.cli", "serve", "--config", str(config), "--metrics-port", str(observer_port)],
        log_path=log_path,
    )
    try:
        procs.wait_ready(f"http://127.0.0.1:{port}/v2/health/ready", server, timeout_s=300, log_path=log_path)
    except BaseException:
        procs.stop(server)
        raise
    return server, observer_port


def step_args(plan: LabPlan, model: ModelPlan, run_dir: Path) -> list[str]:
    """The `latlab loadtest` options every measurement of a model shares: the plan's step timing and confidence,
    and the model's request encoding and samples."""
    return [
        "--confidence",
        f"{plan.confidence:g}",
        "--step-seconds",
        str(plan.step_seconds),
        "--max-windows",
        str(plan.max_windows),
        "--warmup-seconds",
        str(plan.warmup_seconds),
        "--seq-len",
        str(model.seq_len),
        *(["--binary"] if model.binary else []),
        *(["--inputs", str(samples_path(run_dir, model))] if model.samples is not None else []),
    ]


def samples_path(run_dir: Path, model: ModelPlan) -> Path:
    """Where a model's request samples (ModelPlan.samples) lie in the run folder."""
    return run_dir / model.name / "inputs.npz"


def write_samples(run_dir: Path, plan: LabPlan) -> None:
    """Each model's request samples into the run folder, where its sweep reads them (and a reader of the run
    finds what was sent)."""
    from latlab.loadtest.payloads import save_samples

    for model in plan.models:
        if model.samples is not None:
            path = samples_path(run_dir, model)
            path.parent.mkdir(parents=True, exist_ok=True)
            save_samples(path, model.samples)
