"""Does the fleet send the traffic asked for? Real Locust (a master and --workers processes) against a stub server
that notes when each request reached it, in one run:

    .venv/bin/python -m benchmarks.arrivals_fidelity [--rate 500] [--trace-rate 200] [--seconds 12]

(from the repository root, which puts it on sys.path: the stub comes from the test suite).

1. Gamma gaps of CV 0.5, 3 and 6 (and Poisson) at --rate: the CV of the gaps between requests as the generator
   sent them (the step's `arrival_cv`) and as the server received them, each over the asked CV; the generator's
   send lateness p50/p99.
2. The shared Azure trace replayed at --trace-rate with each request's size from its ContextTokens column
   (`--dim seq=trace:ContextTokens`, to a stub that takes at most --max-length): the correlation of the server's
   per-second arrival counts with the trace's own counts at that rate (the replay's shape), the achieved mean rate,
   the lateness, and a two-sample KS test of the sizes the server received against the column over the replayed
   rows, truncated at --max-length.
With `--timers timerfd,loop` each Gamma/Poisson step runs once per way the senders wait for a send time
(loadtest/timer.py), side by side. Printed as ratios and correlations measured in this run; docs/measurement.md
keeps the figures."""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
from pathlib import Path

import numpy as np
from scipy import stats

from latlab.loadtest import child
from latlab.loadtest.arrivals import Arrivals, load_trace
from latlab.loadtest.plan import PayloadOptions, SweepPlan, Workers, Workload
from latlab.loadtest.results import Step, read_results
from latlab.loadtest.schedule import Schedule
from tests.loadtest.stub_server import StubModel, stub_server

TRACE = Path(__file__).parents[1] / "traces" / "AzureLLMInferenceTrace_conv.csv"


def measured(
    arrivals: Arrivals, rate: float, seconds: float, out: Path, workers: int, sizes: str = "", max_length: int = 0
) -> tuple[Step, np.ndarray, list[int]]:
    """One step at `rate` under `arrivals` from `workers` Locust workers (each request sized by `sizes`): the step,
    when each request reached the server (the warm-up's and the step's), and the sizes it received."""
    model = StubModel(dynamic=bool(sizes), max_length=max_length)
    with stub_server(model) as host:
        schedule = Schedule(
            loads=(rate,),
            arrivals=arrivals,
            warmup_seconds=1.0,
            window_seconds=seconds / 3,
            max_windows=3,
            calibrate_seconds=0.0,
            stop_at_saturation=False,
        )
        workload = Workload(host, ("m",), PayloadOptions(sizes=sizes))
        plan = SweepPlan(workload, schedule, workers=Workers(local=workers))
        results = child.run(plan, out, log_path=out.parent / f"{out.name}.log")
    (step,) = read_results(results)[0].deployments[0].steps
    return step, np.sort(np.asarray(model.arrived)), model.sizes


def cv(times: np.ndarray) -> float:
    gaps = np.diff(times)
    return float(gaps.std() / gaps.mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--trace-rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=12.0, help="each step's measured seconds")
    parser.add_argument("--workers", type=int, default=2, help="Locust worker processes")
    parser.add_argument("--timers", default="timerfd", help="comma-separated: timerfd, loop (each step once per timer)")
    parser.add_argument("--max-length", type=int, default=2048, help="the stub's largest size (the trace's is cut)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="latlab-arrivals-"))
    print(f"{args.workers} Locust workers, {args.seconds:g} s steps; work in {work}")
    for spec, timer in itertools.product(("poisson", "gamma:0.5", "gamma:3", "gamma:6"), args.timers.split(",")):
        arrivals = Arrivals.parse(spec)
        asked = arrivals.expected_cv(args.rate)
        os.environ["LATLAB_TIMER"] = timer  # the load test's processes inherit it
        folder = work / f"{spec.replace(':', '-')}-{timer}"
        step, arrived, _ = measured(arrivals, args.rate, args.seconds, folder, args.workers)
        print(
            f"  {spec:>9} {timer:>7} at {args.rate:g} req/s: offered {step.offered_rps:.0f}/s; CV scheduled "
            f"{step.intended_cv:.2f} ({step.intended_cv / asked:.3f}x asked), as sent {step.arrival_cv:.2f} "
            f"({step.arrival_cv / step.intended_cv:.3f}x scheduled), at the server {cv(arrived):.2f} "
            f"({cv(arrived) / step.intended_cv:.3f}x); sent late p50 {step.send_lateness_p50_s * 1e3:.2f} ms, "
            f"p99 {step.send_lateness_p99_s * 1e3:.2f} ms"
        )
    os.environ.pop("LATLAB_TIMER", None)
    trace = load_trace(TRACE)
    arrivals = Arrivals("trace", trace=str(TRACE))
    step, arrived, sizes = measured(
        arrivals, args.trace_rate, args.seconds, work / "trace", args.workers, "trace:ContextTokens", args.max_length
    )
    seconds = int(arrived[-1] - arrived[0])
    server = np.bincount((arrived - arrived[0]).astype(int))[:seconds]
    asked = trace.per_second(args.trace_rate, 0.0, seconds)
    correlation = float(np.corrcoef(server, asked)[0, 1])
    print(
        f"  trace at {args.trace_rate:g} req/s: {len(arrived)} requests over {arrived[-1] - arrived[0]:.1f} s "
        f"({len(arrived) / (arrived[-1] - arrived[0]):.0f}/s); per-second counts against the trace's at that rate: "
        f"correlation {correlation:.3f} over {seconds} s; sent late p50 {step.send_lateness_p50_s * 1e3:.2f} ms, "
        f"p99 {step.send_lateness_p99_s * 1e3:.2f} ms"
    )
    rows = itertools.islice(trace.rows(0.0), len(sizes))
    column = np.minimum([trace.columns["ContextTokens"][row] for row in rows], args.max_length)
    test = stats.ks_2samp(sizes, column)
    print(
        f"  trace sizes: {len(sizes)} requests, p50 {np.median(sizes):.0f} p99 {np.percentile(sizes, 99):.0f} at "
        f"the server, {np.median(column):.0f} / {np.percentile(column, 99):.0f} in the replayed rows truncated at "
        f"{args.max_length} ({float((column >= args.max_length).mean()):.1%} at it); two-sample KS D "
        f"{test.statistic:.4f}, p-value {test.pvalue:.3f}"
    )


if __name__ == "__main__":
    main()
