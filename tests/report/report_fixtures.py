"""Synthetic, clearly labelled result files for report tests: a 16-core CPU box and an H100 box serving the
same model, with the per-step server figures sweep.py records; and bare steps for tests of one rule."""

from __future__ import annotations

from pathlib import Path

from latlab.common.settings import BatcherSettings, CpuOptions
from latlab.loadtest.results import Curve, Run, Step, write_results
from tests.loadtest.steps import simulated

CPU_NAME = "SYNTHETIC 16-core CPU box"
GPU_NAME = "SYNTHETIC NVIDIA H100 80GB HBM3"


def server(
    request_ms: float,
    queue_ms: float,
    compute_ms: float,
    cpu_cores: float,
    busy_s: float,
    transfer_ms: float = 0.0,
    seconds: float = 10.0,
) -> dict:
    """A step's server figures as scrape.server_step writes them (transfers are inside compute)."""
    figures = {
        "seconds": seconds,
        "request_s": request_ms / 1e3,
        "queue_s": queue_ms / 1e3,
        "compute_s": compute_ms / 1e3,
        "process_cpu_cores": cpu_cores,
        "busy_s": busy_s,
        "busy_share": busy_s / seconds,
        "request_count": 100.0,
    }
    if transfer_ms:
        figures.update(input_transfer_s=transfer_ms / 2e3, output_transfer_s=transfer_ms / 2e3)
    return figures


def step(rate: float, p99_ms: float, achieved: float | None = None, samples: int = 5000, **extra: object) -> Step:
    """A step as sweep.py records it: `extra` sets any other field (server=...)."""
    achieved = rate if achieved is None else achieved
    p99 = p99_ms / 1e3
    sent = int(achieved * 10)
    figures = {
        "target": rate,
        "target_rps": rate,
        "offered_rps": rate,
        "achieved_rps": achieved,
        "sent": sent,
        "ok": sent,
        "errors": 0,
        "dropped": 0,
        "late": 0,
        "incomplete": 0,
        "p50_s": p99 / 3,
        "p90_s": p99 / 2,
        "p99_s": p99,
        "max_s": p99 * 1.3,
        "mean_s": p99 / 2.5,
        "duration_s": 10.0,
        "avg_batch_size": 1.0,
        "generator_cpu_percent": 20.0,
        "generator_bound": False,
        "samples": samples,
        "too_few_samples": samples < 100,
        **extra,
    }
    if extra.get("server"):  # the client sees the server's time plus the network and its own HTTP work
        figures["mean_s"] = extra["server"]["request_s"] + 0.0012
    return Step(**figures)


def bare_step(achieved: float, p99_s: float | None = None, **extra: object) -> Step:
    """A step with only what a rule looks at: asked for, offered and achieved `achieved`, no errors, its p99 (p50
    a quarter of it); no target rate (as in a closed loop), so saturation never breaks an SLO. `extra` sets any
    other field."""
    figures = {"offered_rps": achieved, "p99_s": p99_s, "p50_s": None if p99_s is None else p99_s / 4, **extra}
    return simulated(**figures)


def curve(name: str, provider: str, batch: int, steps: list[Step], environment: dict, **extra: object) -> Curve:
    return Curve(
        **{
            "name": name,
            "model": "minilm",
            "provider": provider,
            "batcher": BatcherSettings.partial(
                max_batch_size=batch, max_queue_delay_ms=2.0 if batch > 1 else 0.0, instances=1
            ),
            "cpu": CpuOptions.partial(intra_op_threads=16),
            "environment": environment,
            "steps": steps,
            "stop_reason": "synthetic",
            **extra,
        }
    )


def cpu_run(tmp_path: Path) -> Path:
    env = {"name": CPU_NAME, "cpu": "SYNTHETIC CPU", "cores": 16, "cpu_threads": 16}
    b1 = curve(
        "minilm-cpu-b1",
        "cpu",
        1,
        [
            step(50, 8, server=server(6, 0.5, 5, 1.3, 2.5)),
            step(100, 14, server=server(9, 3, 5, 1.5, 5.0)),
            step(200, 60, achieved=170),
        ],
        env,
        saturated=True,
    )
    batch = curve(
        "minilm-cpu-batch",
        "cpu",
        32,
        [
            step(5, 9, samples=50),  # a p99 of 50 requests: marked, never decides
            step(100, 12, server=server(10, 3, 6, 1.2, 3.0)),
            step(240, 22, server=server(18, 8, 9, 1.6, 6.5)),
            step(480, 90, achieved=300),
        ],
        env,
        saturated=True,
    )
    run = tmp_path / "SYNTHETIC-cpu-run"
    write_results(
        run / "results-minilm.json",
        Run(run_id="SYNTHETIC-cpu-run", machine={"hostname": "vm", **env}, deployments=[b1, batch]),
    )
    return run


def gpu_run(tmp_path: Path, saturated: bool = False) -> Path:
    env = {"name": GPU_NAME, "gpu": "NVIDIA H100 80GB HBM3", "cpu": "SYNTHETIC Xeon", "cores": 16}
    # At its top rate the server process uses its one interpreter core while the GPU idles: server-bound.
    steps = [
        step(250, 6, server=server(4, 1, 2, 0.5, 0.5, transfer_ms=0.4)),
        step(1000, 12, server=server(8, 3, 2.5, 0.8, 1.6, transfer_ms=0.4)),
        step(1347, 21, server=server(15, 9, 3, 0.97, 2.0, transfer_ms=0.5)),
    ]
    gpu = curve("minilm-cuda-batch", "cuda", 32, steps, env, saturated=saturated, rate_cap_rps=1347)
    run = tmp_path / "SYNTHETIC-h100-run"
    write_results(
        run / "results-minilm.json",
        Run(run_id="SYNTHETIC-h100-run", machine={"hostname": "vm", **env}, deployments=[gpu]),
    )
    return run


if __name__ == "__main__":  # the synthetic report behind docs/report-first-screen.png
    import sys

    from latlab.report.write import write_report

    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/synthetic-report")
    print(
        write_report(
            [cpu_run(folder), gpu_run(folder)],
            [0.010, 0.025, 0.050, 0.100],
            prices={"cpu": 0.80, "cuda": 2.50},
            out=folder / "report",
        )
    )
