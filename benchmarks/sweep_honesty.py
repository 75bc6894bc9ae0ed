"""Does a sweep tell the truth? Against a stub server whose capacity is known, in one run:

    .venv/bin/python benchmarks/sweep_honesty.py [--capacity 200] [--rounds 2]

1. the saturation search: `latlab loadtest --rates C/3 --max-rate 15C` raises past the listed rate until the
   stub saturates, then bisects; printed: the highest throughput achieved by a step that kept up (achieved
   >= 90% of offered) over the true capacity;
2. short steps (0.5 s windows, as the quick plans use) at a low, a middle and a high rate below capacity:
   achieved over offered (counting by intended send time it can only fall short of offered, never exceed it),
   offered over the target (Poisson noise) and the samples behind each step's p99 (windows lengthen at low
   rates so that a step holds 100).
The stub (tests/loadtest/stub_server.py) serves one request at a time, each in 1/capacity s."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.loadtest.stub_server import stub_process  # noqa: E402

from latlab.common import procs  # noqa: E402
from latlab.loadtest.results import RESULTS_FILE, Deployment, Step, read_results  # noqa: E402


def loadtest(host: str, out: Path, *args: str) -> Deployment:
    command = [
        sys.executable,
        "-m",
        "latlab.cli",
        "loadtest",
        "--host",
        host,
        "--deployment",
        "m",
        "--out",
        str(out),
        "--warmup-seconds",
        "0.5",
        "--max-windows",
        "3",
        *args,
    ]
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    return read_results(out / RESULTS_FILE)[0].deployments[0]


def saturation_round(host: str, out: Path, capacity: float) -> float:
    curve = loadtest(
        host, out, "--rates", f"{capacity / 3:g}", "--max-rate", f"{capacity * 15:g}", "--step-seconds", "3"
    )
    # the highest throughput of a step that kept up: what the report calls the deployment's max rate
    sustained = max(s.achieved_rps for s in curve.steps if s.achieved_rps >= 0.9 * s.offered_rps)
    probes = ", ".join(f"{s.target:.0f}" for s in sorted(curve.steps, key=lambda s: s.start_time))
    print(
        f"  saturation search: probes {probes} req/s; sustained {sustained:.0f} = {sustained / capacity:.2f}x "
        f"the capacity; saturated={curve.saturated}"
    )
    return sustained / capacity


def short_steps_round(host: str, out: Path, rates: list[float]) -> list[Step]:
    curve = loadtest(
        host,
        out,
        "--rates",
        ",".join(f"{r:g}" for r in rates),
        "--max-rate",
        f"{max(rates):g}",
        "--step-seconds",
        "1.5",
    )
    for step in curve.steps:
        print(
            f"  short steps at {step.target:>5.0f}/s: windows {step.window_seconds:.2f} s, "
            f"{step.samples:4d} samples, achieved/offered {step.achieved_rps / step.offered_rps:.3f}, "
            f"offered/target {step.offered_rps / step.target:.3f}"
        )
    return curve.steps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=float, default=200.0, help="the stub's requests/s")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    env_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    os.environ["PYTHONPATH"] = env_path
    found, ratios = [], []
    with tempfile.TemporaryDirectory() as scratch, stub_process(procs.free_port(), args.capacity) as stub:
        for index in range(args.rounds):
            print(f"round {index + 1} (stub capacity {args.capacity:g} req/s)")
            found.append(saturation_round(stub.host, Path(scratch) / f"sat-{index}", args.capacity))
            steps = short_steps_round(
                stub.host,
                Path(scratch) / f"short-{index}",
                [args.capacity / 10, args.capacity / 2, args.capacity * 0.8],
            )
            ratios += [s.achieved_rps / s.offered_rps for s in steps]
    print(
        f"found/capacity: {', '.join(f'{f:.2f}' for f in found)}; achieved/offered over short steps: "
        f"{min(ratios):.3f} .. {max(ratios):.3f} (never above 1 by construction)"
    )


if __name__ == "__main__":
    main()
