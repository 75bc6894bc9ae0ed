"""What the lab's child processes share, its sweeps and the search's probes alike: a ready `latlab serve` of a
config (or a fleet of them behind HAProxy), the parts of a model's sweep plan every measurement shares (what it
sends, the step timing), and the request samples those send."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from latlab.common import procs
from latlab.fleet.build import build_fleet
from latlab.lab.plan import CpuShare, LabPlan, ModelPlan
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


@dataclass
class Serving:
    """What serves the lab's sweeps: one server, or a fleet's proxy; where Prometheus scrapes it, and how to stop it."""

    host: str
    scrape: dict[str, list[str]]
    """Prometheus jobs -> targets: every server's observer port, and the proxy's exporter."""
    stop: Callable[[], None]
    fleet_targets: Path | None = None
    """The fleet's file_sd targets, which its sweeps record the fleet from (`latlab loadtest --fleet`)."""
    cold_start_s: float | None = None
    """From starting the server (every replica of a fleet) to ready, which its sweeps record (Run.cold_start_s)."""


def start_serving(
    config: Path, port: int, run_dir: Path, plan: LabPlan, share: CpuShare, say: Callable[[str], None]
) -> Serving:
    """The plan's deployments served on `port`, ready: one `latlab serve` (log run_dir/server.log), or with
    plan.replicas > 1 a fleet of them behind HAProxy (its files in run_dir/fleet), on the share's threads each;
    timed from the start to ready (the readiness poll's interval is its resolution)."""
    started = time.monotonic()
    if plan.replicas == 1:
        server, observer_port = start_server(config, port, run_dir / "server.log")
        scrape = {"latlab-server": [f"127.0.0.1:{observer_port}"]}
        return Serving(
            f"http://127.0.0.1:{port}", scrape, lambda: procs.stop(server), cold_start_s=time.monotonic() - started
        )
    cores = share.cpu_threads * share.replicas  # each replica's config already names its threads
    fleet = build_fleet(
        config,
        run_dir / "fleet",
        cores,
        replicas=plan.replicas,
        port=port,
        stats_port=procs.free_port(),
        balance=plan.balance,
        say=say,
    )
    fleet.start()
    spec = fleet.spec
    scrape = {
        "latlab-server": [f"127.0.0.1:{r.metrics_port}" for r in spec.replicas],
        "latlab-proxy": [f"127.0.0.1:{spec.stats_port}"],
    }
    return Serving(f"http://127.0.0.1:{spec.port}", scrape, fleet.stop, fleet.targets, time.monotonic() - started)


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
