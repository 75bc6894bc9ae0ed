"""What the open-loop generator adds to the latency it reports, at the rates a small machine generates.

    .venv/bin/python benchmarks/generator_floor.py [--rates 50,200,1000] [--step-seconds 10] [--rounds 2]

Serves the lab's ffn (d_model 128, 128 layers) at batching off, one ORT thread, on a free port, and runs
`latlab loadtest --constant` at each rate (constant gaps, so lateness is the generator's and not the arrival
process's). Per step, from the results file:
- the latency the generator reports (p50, p99, mean), counted from each request's intended send time;
- its send lateness (actual minus intended send time, p50 and p99), which every latency includes;
- "direct": the server's own time per request over the same step, from its request histogram
  (`latlab_server_request_duration_seconds`, from the request read to the answer written: what a generator
  with no cost of its own would read, less the loopback hop), as its mean (exact: sum over count) and its
  p50/p99 (interpolated within the histogram's buckets, as Prometheus does);
- the generator's added latency: reported minus direct, for the mean and for p50 and p99.
With `--wrk` each step is followed by the same rate from `wrk` (Debian's, C, epoll; one thread, one connection,
`--latency`), paced by a Lua `delay()` of 1/rate less the server's own p50 (so it sends at about the rate, each
request after the last answer: at these utilisations nothing queues), posting the generator's own first body.
wrk's p50/p99 is the "direct" figure closest to what a client with no cost of its own reads: it includes the
loopback hop and the server's HTTP layer, which the server's histogram does not, so "added over wrk" is what
latlab's generator itself adds.
With `--timers timerfd,greenlet,loop` every step runs once per way the generator sends (side by side against the
same server): `timerfd`, today's: each sender waits on its timerfd (loadtest/timer.py) and writes the request from
its own wake-up, answers read in the event loop's callbacks (loadtest/open_sender.py); `greenlet`: the same timer,
each request sent from a greenlet of its own (LATLAB_OPEN_LOOP=greenlet, as before the callback sender); `loop`:
that, waiting on the event loop's own timer (LATLAB_TIMER=loop), spinning out the last 1.2 ms below ~208 req/s per
process. With `--wrk`, wrk runs once per rate and round, after the first way. One row per rate, way and round,
rounds alternating the order;
the figures go to docs/measurement.md."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import time
from pathlib import Path

import requests
from harness import batching, export_zoo, loadtest, quantile, serving, write_config

from latlab.common import procs
from latlab.loadtest.payloads import request_bodies

REQUEST_HISTOGRAM = "latlab_server_request_duration_seconds"


def step_row(served, deployment: str, out: Path, rate: float, step_seconds: float) -> dict:
    before = served.histogram(REQUEST_HISTOGRAM, deployment)
    sum_before = served.value(f"{REQUEST_HISTOGRAM}_sum", deployment)
    (curve,) = loadtest(
        served.url,
        [deployment],
        out,
        "--rates",
        f"{rate:g}",
        "--constant",
        "--step-seconds",
        f"{step_seconds:g}",
        "--warmup-seconds",
        "1",
        "--max-windows",
        "3",
        "--max-rate",
        f"{rate:g}",
    )
    after = served.histogram(REQUEST_HISTOGRAM, deployment)
    delta = {bound: after[bound] - before.get(bound, 0.0) for bound in after}
    count = delta[float("inf")]
    direct_mean = (served.value(f"{REQUEST_HISTOGRAM}_sum", deployment) - sum_before) / count
    step = curve.steps[-1]
    direct = {"p50_s": quantile(delta, 0.5), "p99_s": quantile(delta, 0.99), "mean_s": direct_mean}
    return {
        "rate": rate,
        "achieved_rps": step.achieved_rps,
        "reported": {"p50_s": step.p50_s, "p99_s": step.p99_s, "mean_s": step.mean_s},
        "send_lateness": {"p50_s": step.send_lateness_p50_s, "p99_s": step.send_lateness_p99_s},
        "direct": direct,
        "added": {
            k: step_value - direct[k]
            for k, step_value in (("p50_s", step.p50_s), ("p99_s", step.p99_s), ("mean_s", step.mean_s))
        },  # fmt: skip
        "generator_cpu_percent": step.generator_cpu_percent,
    }


def wrk_paced(url: str, deployment: str, body: bytes, rate: float, service_s: float, seconds: float, work: Path):
    """wrk's p50 and p99 (seconds) and its rate, one connection paced at about `rate` (module docstring)."""
    delay_ms = max(0.0, 1e3 / rate - service_s * 1e3)
    script = work / "paced.lua"
    script.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f"wrk.body = {json.dumps(body.decode())}\n"
        f"function delay() return {delay_ms:.3f} end\n"
    )
    command = ["wrk", "-t1", "-c1", f"-d{seconds:g}s", "--latency", "-s", str(script)]
    out = subprocess.run([*command, f"{url}/v2/models/{deployment}/infer"], capture_output=True, text=True).stdout
    found = {q: re.search(rf"^\s+{q}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M) for q in ("50", "99")}
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not all(found.values()) or not rps or "Non-2xx" in out:
        raise RuntimeError(f"wrk did not measure: {out}")
    scale = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
    p50, p99 = (float(found[q].group(1)) * scale[found[q].group(2)] for q in ("50", "99"))
    return {"p50_s": p50, "p99_s": p99, "rps": float(rps.group(1))}


def ms(value: float | None) -> str:
    return "    -" if value is None else f"{value * 1e3:5.2f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="50,200,1000")
    parser.add_argument("--step-seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--timers", default="timerfd", help="comma-separated ways to send: timerfd, greenlet, loop (docstring)"
    )
    parser.add_argument("--wrk", action="store_true", help="after each step, wrk paced at the same rate (docstring)")
    parser.add_argument("--models-dir", type=Path, default=Path("models/bench"))
    parser.add_argument("--out", type=Path, default=Path("runs") / f"generator-floor-{time.strftime('%Y%m%d-%H%M%S')}")
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    timers = args.timers.split(",")
    work = args.out.resolve()
    work.mkdir(parents=True, exist_ok=True)
    ffn = export_zoo(args.models_dir.resolve(), "ffn", "--d-model", "128", "--n-layers", "128")
    port = procs.free_port()
    config = write_config(work / "ffn.toml", port, {"ffn-b1": (ffn, batching(1, 0.0))})
    rows = []
    print(
        "rate  round  timer   achieved | reported p50 p99 mean | sent late p50 p99 | direct p50 p99 mean | "
        "added p50 p99 mean"
    )
    with serving(config, port, work / "server.log") as served:
        for k in range(args.rounds):
            order = timers if k % 2 == 0 else timers[::-1]
            for rate, timer in itertools.product(rates if k % 2 == 0 else rates[::-1], order):
                # the load test's processes inherit both
                os.environ["LATLAB_TIMER"] = "loop" if timer == "loop" else "timerfd"
                os.environ["LATLAB_OPEN_LOOP"] = "callbacks" if timer == "timerfd" else "greenlet"
                found = step_row(served, "ffn-b1", work / f"r{k}-{rate:g}-{timer}", rate, args.step_seconds)
                row = {"round": k, "timer": timer, **found}
                if args.wrk and timer == order[0]:
                    body = request_bodies(requests.get(f"{served.url}/v2/models/ffn-b1", timeout=10).json(), seed=0)
                    service = found["direct"]["p50_s"] or 0.0
                    row["wrk"] = wrk_paced(served.url, "ffn-b1", body[0].data, rate, service, args.step_seconds, work)
                    row["added_over_wrk"] = {
                        q: found["reported"][q] - row["wrk"][q] for q in ("p50_s", "p99_s")
                    }  # fmt: skip
                rows.append(row)
                rep, late, direct, added = row["reported"], row["send_lateness"], row["direct"], row["added"]
                print(
                    f"{rate:5.0f} {k:5d} {timer:>7} {row['achieved_rps']:9.0f} | {ms(rep['p50_s'])} {ms(rep['p99_s'])} "
                    f"{ms(rep['mean_s'])} | {ms(late['p50_s'])} {ms(late['p99_s'])} | {ms(direct['p50_s'])} "
                    f"{ms(direct['p99_s'])} {ms(direct['mean_s'])} | {ms(added['p50_s'])} {ms(added['p99_s'])} "
                    f"{ms(added['mean_s'])}",
                    flush=True,
                )
                if "wrk" in row:
                    paced, over = row["wrk"], row["added_over_wrk"]
                    print(
                        f"{'':20} wrk paced {paced['rps']:5.0f}/s p50 {ms(paced['p50_s'])} p99 {ms(paced['p99_s'])} | "
                        f"latlab over wrk p50 {ms(over['p50_s'])} p99 {ms(over['p99_s'])}",
                        flush=True,
                    )
    (work / "floor.json").write_text(json.dumps(rows, indent=1))
    print(f"written: {work / 'floor.json'}")


if __name__ == "__main__":
    main()
