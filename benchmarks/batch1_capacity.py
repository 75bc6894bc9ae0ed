"""Where batching-off ffn's capacity goes: at fixed open-loop rates, how long one instance's run takes under load
(against the same run in a hot loop in process) and how much of the wall time the instance is busy.

    .venv/bin/python benchmarks/batch1_capacity.py [--rates 500,1000,1500,1800,2100]

One server on a free port serves ffn d=128 L=128 with `max_batch_size = 1` (CPU, one ORT thread). Per rate:
a 2 s warm-up step, then a 6 s step. Between the two, the server's own histograms give the run time per
batch (`latlab_batcher_compute_duration_seconds`: merge, ORT, split, and getting the interpreter lock back
after ORT released it) and the queue wait. The instance's busy share is the summed run time over the wall
time. The worker process's CPU time gives the server's cores in use. It prints one row per rate."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from harness import (
    Served,
    batching,
    export_zoo,
    loadtest,
    ort_b1_model,
    p50_in_process,
    serving,
    write_config,
)

from latlab.common import procs

DEPLOYMENT = "ffn-b1"  # the name ort_b1_model looks for

COMPUTE = "latlab_batcher_compute_duration_seconds"
QUEUE = "latlab_batcher_queue_duration_seconds"


def totals(served: Served) -> dict[str, float]:
    """The server's summed run time, run count and queue wait so far."""
    return {
        "run_s": served.value(f"{COMPUTE}_sum", DEPLOYMENT),
        "runs": served.value(f"{COMPUTE}_count", DEPLOYMENT),
        "queue_s": served.value(f"{QUEUE}_sum", DEPLOYMENT),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="500,1000,1500,1800,2100")
    parser.add_argument("--models-dir", default="models/bench")
    parser.add_argument("--out", default=f"runs/batch1-capacity-{time.strftime('%Y%m%d-%H%M%S')}")
    args = parser.parse_args(argv)
    work = Path(args.out).resolve()
    work.mkdir(parents=True, exist_ok=True)
    ffn = export_zoo(Path(args.models_dir).resolve(), "ffn", "--d-model", "128", "--n-layers", "128")
    if ffn is None:
        raise SystemExit("could not export ffn")
    port = procs.free_port()
    config = write_config(work / "b1.toml", port, {DEPLOYMENT: (ffn, batching(1, 0.0))})
    model, feeds = ort_b1_model(config)
    print(f"ORT batch 1 in a hot loop, in process: {p50_in_process(model.run, feeds, n=500) * 1e3:.3f} ms")
    with serving(config, port, work / "server.log") as served:
        worker = served.worker()
        for rate in (float(r) for r in args.rates.split(",")):
            loadtest(
                served.url,
                [DEPLOYMENT],
                work / "warm-up",
                "--rates",
                f"{rate:g}",
                "--step-seconds",
                "2",
                "--warmup-seconds",
                "0",
            )
            before, cpu_before, started = totals(served), worker.cpu_times(), time.monotonic()
            step = loadtest(
                served.url,
                [DEPLOYMENT],
                work / f"step-{rate:g}",
                "--rates",
                f"{rate:g}",
                "--step-seconds",
                "6",
                "--warmup-seconds",
                "0",
                "--max-windows",
                "3",
            )[0].steps[0]
            after, cpu_after, wall = totals(served), worker.cpu_times(), time.monotonic() - started
            runs = after["runs"] - before["runs"]
            run_s = after["run_s"] - before["run_s"]
            cores = (cpu_after.user + cpu_after.system - cpu_before.user - cpu_before.system) / wall
            print(
                f"{rate:6.0f}/s: achieved {step.achieved_rps:6.0f}/s  p99 {step.p99_s * 1e3:6.1f} ms  "
                f"run {run_s / runs * 1e3:.3f} ms  instance busy {run_s / wall:4.0%}  "
                f"queue wait {(after['queue_s'] - before['queue_s']) / runs * 1e3:6.2f} ms  "
                f"server {cores:.2f} cores  generator {step.generator_cpu_percent:.0f}% of a core",
                flush=True,
            )


if __name__ == "__main__":
    main()
