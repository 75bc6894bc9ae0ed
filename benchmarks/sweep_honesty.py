"""Does a sweep tell the truth? Against a stub server whose capacity is known, in one run:

    .venv/bin/python -m benchmarks.sweep_honesty [--capacity 200] [--rounds 2]

(from the repository root, which puts it on sys.path: the stub comes from the test suite).

1. the saturation search: a sweep from C/3 with a rate cap of 15C (`latlab loadtest --rates C/3 --max-rate 15C`)
   raises past the listed rate until the stub saturates, then bisects; printed: the highest throughput achieved
   by a step that kept up (achieved >= 90% of offered) over the true capacity;
2. short steps (0.5 s windows, as the quick plans use) at a low, a middle and a high rate below capacity:
   achieved over offered (counting by intended send time it can only fall short of offered, never exceed it),
   offered over the target (Poisson noise) and the samples behind each step's p99 (windows lengthen at low
   rates so that a step holds 100).
The stub (tests/loadtest/stub_server.py) serves one request at a time, each in 1/capacity s."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from latlab.common import procs
from latlab.loadtest import child
from latlab.loadtest.plan import SweepPlan, Workload
from latlab.loadtest.results import Curve, Step, read_results
from latlab.loadtest.schedule import Schedule
from tests.loadtest.stub_server import stub_process


def loadtest(host: str, out: Path, rates: list[float], max_rate: float, step_seconds: float) -> Curve:
    """The stub's one deployment swept at `rates` (then raised up to `max_rate`), in steps of 0.5 s of warm-up and
    three windows of a third of `step_seconds`."""
    schedule = Schedule(
        loads=tuple(rates), max_rate=max_rate, window_seconds=step_seconds / 3, warmup_seconds=0.5, max_windows=3
    )
    results = child.run(SweepPlan(Workload(host, ("m",)), schedule), out, log_path=out.parent / f"{out.name}.log")
    return read_results(results)[0].deployments[0]


def saturation_round(host: str, out: Path, capacity: float) -> float:
    curve = loadtest(host, out, [capacity / 3], max_rate=capacity * 15, step_seconds=3)
    # the highest throughput of a step that kept up: what the report calls the deployment's max rate
    sustained = max(s.achieved_rps for s in curve.steps if s.achieved_rps >= 0.9 * s.offered_rps)
    probes = ", ".join(f"{s.target:.0f}" for s in sorted(curve.steps, key=lambda s: s.start_time))
    print(
        f"  saturation search: probes {probes} req/s; sustained {sustained:.0f} = {sustained / capacity:.2f}x "
        f"the capacity; saturated={curve.saturated}"
    )
    return sustained / capacity


def short_steps_round(host: str, out: Path, rates: list[float]) -> list[Step]:
    curve = loadtest(host, out, rates, max_rate=max(rates), step_seconds=1.5)
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
