"""The fleet plan checked against a real fleet: one deployment of a lab run served by `latlab fleet` with 1, then 2
replicas behind HAProxy (roundrobin), loaded by `latlab loadtest --fleet` at the same Poisson rates; each step's
measured p99, and the highest rate under each SLO, against what the plan's replica model (the one the lab run's
validation kept for the deployment) predicts for that many replicas, the arrivals split as the balancer does
(roundrobin) and as the plan's fleet simulator does (a random 1/N each). The prediction adds the generator's
floor that the fleet's own load test measured through the proxy (as the validation adds the lab's).

    .venv/bin/python -m benchmarks.plan_vs_fleet [--run RUN] [--deployment mlp-batch] [--rates 250,500,1000,1500]

Without --run it first runs `latlab lab --quick --models mlp --search-minutes 0` into --dir. Needs haproxy.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import tomli_w

from latlab.common import procs
from latlab.loadtest.results import Curve, read_results
from latlab.report.fleetplan.against_fleet import (
    SPLITS,
    error_text,
    fleet_p99_s,
    fleet_rate_under,
    median_error,
    p99_rows,
    rate_rows,
)
from latlab.report.fleetplan.validate import floor_p99_s, sent_cv, validation_rows

READY_TIMEOUT_S = 300.0
LATLAB = [sys.executable, "-m", "latlab.cli"]


def lab_run(folder: Path) -> Path:
    """A short lab of mlp (batching off and on) into `folder`; its run folder."""
    command = [*LATLAB, "lab", "--quick", "--models", "mlp", "--search-minutes", "0", "--runs-dir", str(folder)]
    subprocess.run(command, check=True, timeout=1800)
    return max(p for p in folder.iterdir() if p.is_dir())


def one_deployment_config(run_dir: Path, deployment: str, out: Path) -> Path:
    """The lab's server config with only `deployment` in it (its settings and threads as the lab served it)."""
    config = tomllib.loads((run_dir / "lab.toml").read_text())
    config["deployments"] = [d for d in config["deployments"] if d["name"] == deployment]
    if not config["deployments"]:
        raise SystemExit(f"{run_dir / 'lab.toml'} serves no deployment {deployment!r}")
    out.write_text(tomli_w.dumps(config))
    return out


def start_fleet(config: Path, replicas: int, folder: Path) -> tuple[subprocess.Popen, int, Path, float]:
    """`latlab fleet` of `replicas`, roundrobin, until its ready line: the process, proxy port, targets file and
    the seconds from its start to ready (every replica ready and seen up by the proxy)."""
    port, targets, log = procs.free_port(), folder / "targets.json", folder / "fleet.log"
    folder.mkdir(parents=True, exist_ok=True)
    command = [*LATLAB, "fleet", "--config", str(config), "--replicas", str(replicas), "--balance", "roundrobin"]
    command += ["--port", str(port), "--stats-port", str(procs.free_port()), "--dir", str(folder / "files")]
    started = time.monotonic()
    fleet = procs.start([*command, "--targets", str(targets)], log_path=log)
    while "ready:" not in log.read_text(errors="replace"):
        if fleet.poll() is not None or time.monotonic() - started > READY_TIMEOUT_S:
            procs.stop(fleet)
            raise SystemExit(f"latlab fleet did not get ready:\n{log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)
    return fleet, port, targets, time.monotonic() - started


def load_fleet(port: int, deployment: str, targets: Path, args: argparse.Namespace, out: Path) -> Curve:
    """`latlab loadtest --fleet` at the rates (Poisson, one seed for every step) with SLO brackets; its curve."""
    command = [*LATLAB, "loadtest", "--host", f"http://127.0.0.1:{port}", "--deployment", deployment]
    command += ["--rates", args.rates, "--step-seconds", f"{args.step_seconds:g}", "--warmup-seconds", "1"]
    command += ["--calibrate-seconds", "3", "--seed", "1", "--fleet", str(targets), "--out", str(out)]
    command += ["--slos", ",".join(f"{s * 1e3:g}ms" for s in args.slos), "--slo-steps", str(args.slo_steps)]
    subprocess.run(command, check=True, timeout=1800)
    (run,) = read_results(out / "results.json")
    return run.deployments[0]


PREDICTORS = (*SPLITS, "roundrobin+floor")
"""The model's fleet under each split alone, and under roundrobin with the generator's floor added (as the lab's
validation adds it: what every measured latency holds besides the fleet's own work)."""


def predictors(model, curve: Curve, replicas: int) -> tuple[dict, dict]:
    """Per predictor (PREDICTORS), p99 at a rate and the highest rate under an SLO, under the burstiness this
    load test sent and its floor (the p99s cached: the SLOs' bisections share rates)."""
    p99s, rates = {}, {}
    for name in PREDICTORS:
        how, _, floor = name.partition("+")

        @functools.cache
        def p99_at(rate: float, how: str = how, floor: bool = bool(floor)) -> float:
            added = floor_p99_s(curve, rate) if floor else 0.0
            return fleet_p99_s(model, rate, replicas, how, sent_cv(curve, rate), added)

        p99s[name] = p99_at
        rates[name] = functools.partial(fleet_rate_under, model, replicas=replicas, p99_at=p99_at)
    return p99s, rates


def show(replicas: int, cold_s: float, curve: Curve, p99: list[dict], under: list[dict]) -> None:
    print(f"\n{replicas} replica(s) behind HAProxy (roundrobin), ready in {cold_s:.1f} s")
    head = f"{'offered':>8} {'achieved':>9} {'sent late p99':>14} {'floor p99':>10} {'measured p99':>13} "
    print(head + " ".join(f"{h:>22}" for h in PREDICTORS))
    for row in p99:
        late = f"{row['sent_late_p99_s'] * 1e3:11.1f} ms" if row["sent_late_p99_s"] is not None else f"{'-':>14}"
        cells = " ".join(f"{row[h].predicted * 1e3:12.1f} ms ({error_text(row[h]):>5})" for h in PREDICTORS)
        bound = "  generator-bound" if row["generator_bound"] else ""
        floor = floor_p99_s(curve, row["rate"]) * 1e3
        print(
            f"{row['target']:>8.0f} {row['rate']:>9.0f} {late} {floor:7.1f} ms "
            f"{row['measured_p99_s'] * 1e3:>10.1f} ms {cells}{bound}"
        )
    medians = ", ".join(f"{h} {median_error(p99, h) * 100:.0f}%" for h in PREDICTORS)
    print(f"median |error| of p99 over the steps the generator did not bound: {medians}")
    for row in under:
        then = f" (next offered {row['next_rps']:.0f} did not meet it)" if row["next_rps"] else ""
        cells = ", ".join(f"{h} {row[h].predicted:.0f} ({error_text(row[h])})" for h in PREDICTORS)
        print(f"p99 <= {row['slo_s'] * 1e3:g} ms: measured {row['measured_rps']:.0f} req/s{then}; predicted {cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="a lab run folder (default: run a short lab into --dir)")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/plan-vs-fleet"))
    parser.add_argument("--deployment", default="mlp-batch")
    parser.add_argument("--replicas", default="1,2")
    parser.add_argument("--rates", default="250,500,1000,1500,2000")
    parser.add_argument("--step-seconds", type=float, default=6.0)
    parser.add_argument("--slos", default="25,50,100", help="p99 bounds in ms")
    parser.add_argument("--slo-steps", type=int, default=3, help="bracket steps per SLO (latlab loadtest)")
    parser.add_argument("--out", type=Path, help="write every figure here as JSON")
    args = parser.parse_args()
    args.slos = tuple(float(s) / 1e3 for s in args.slos.split(","))
    args.dir.mkdir(parents=True, exist_ok=True)
    run_dir = args.run or lab_run(args.dir / "lab")
    (row,) = [r for r in validation_rows(run_dir) if r["deployment"] == args.deployment]
    print(f"{args.deployment} of {run_dir}: replica model {row['replica']} ({row['source']})")
    config = one_deployment_config(run_dir, args.deployment, args.dir / "fleet.toml")
    results = {"run": str(run_dir), "deployment": args.deployment, "source": row["source"], "fleets": []}
    for replicas in (int(n) for n in args.replicas.split(",")):
        folder = args.dir / f"fleet-{replicas}"
        fleet, port, targets, cold_s = start_fleet(config, replicas, folder)
        try:
            curve = load_fleet(port, args.deployment, targets, args, folder / "loadtest")
        finally:
            procs.stop(fleet, grace_s=40)
        p99_at, rate_under = predictors(row["replica"], curve, replicas)
        p99, under = p99_rows(curve.steps, p99_at), rate_rows(curve.steps, args.slos, rate_under)
        show(replicas, cold_s, curve, p99, under)
        results["fleets"].append({"replicas": replicas, "ready_s": cold_s, "p99": p99, "rates": under})
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, default=lambda c: vars(c) | {"error": c.error}) + "\n")


if __name__ == "__main__":
    main()
