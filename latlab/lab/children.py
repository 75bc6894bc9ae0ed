"""What the lab's child processes share, its sweeps and the search's probes alike: a ready `latlab serve` of a
config, the parts of a model's sweep plan every measurement shares (what it sends, the step timing), and the request
samples those send."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Iterable

from latlab.common import procs
from latlab.lab.plan import LabPlan, ModelPlan
from latlab.loadtest.payloads import save_samples
from latlab.loadtest.plan import PayloadOptions, Workload
from latlab.loadtest.schedule import Schedule
from latlab.server.command import serve_command


def start_server(config: Path, port: int, log_path: Path) -> tuple[subprocess.Popen, int]:
    """`latlab serve` of a config on `port`, ready (stopped again if it never is); the process and its observer
    port (/metrics on threads of their own: scrapes never wait behind the load)."""
    observer_port = procs.free_port()
    server = procs.start(serve_command(config, observer_port), log_path=log_path)
    try:
        procs.wait_ready(f"http://127.0.0.1:{port}/v2/health/ready", server, timeout_s=300, log_path=log_path)
    except BaseException:
        procs.stop(server)
        raise
    return server, observer_port


def model_workload(model: ModelPlan, run_dir: Path, host: str, deployments: Iterable[str], sizes: str = "") -> Workload:
    """What every measurement of a model sends to its deployments: the model's request encoding and samples, or
    requests of `sizes` along their dynamic axes (LabPlan.sizes; a sample file keeps its own)."""
    payload = PayloadOptions(
        binary=model.binary,
        seq_len=model.seq_len,
        inputs=str(samples_path(run_dir, model)) if model.samples is not None else "",
        sizes=sizes if model.samples is None else "",
    )
    return Workload(host=host, deployments=tuple(deployments), payload=payload)


def step_schedule(plan: LabPlan, loads: Iterable[float], **more: object) -> Schedule:
    """The plan's step timing (every measurement of the lab shares it) at `loads`, with `more` of the schedule."""
    return Schedule(
        loads=tuple(loads),
        window_seconds=plan.step_seconds / 3,
        max_windows=max(3, plan.max_windows),
        warmup_seconds=plan.warmup_seconds,
        **more,
    )


def samples_path(run_dir: Path, model: ModelPlan) -> Path:
    """Where a model's request samples (ModelPlan.samples) lie in the run folder."""
    return run_dir / model.name / "inputs.npz"


def write_samples(run_dir: Path, plan: LabPlan) -> None:
    """Each model's request samples into the run folder, where its sweep reads them (and a reader of the run
    finds what was sent)."""
    for model in plan.models:
        if model.samples is not None:
            path = samples_path(run_dir, model)
            path.parent.mkdir(parents=True, exist_ok=True)
            save_samples(path, model.samples)
