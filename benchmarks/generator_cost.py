"""What one request costs the load generator: the lean HTTP client against Locust's FastHttpSession, side by
side against the same server in one run (alternating, so drift hits both).

    .venv/bin/python benchmarks/generator_cost.py [--rate 1000] [--pairs 2]

Serves a no-op model (Identity on [N, 128]: the server is cheap, the generator's cost shows) on a free port,
runs `latlab loadtest --client lean|locust` at one open-loop rate and prints the generator's CPU per request
(its process CPU over the measured windows, as the results record it) and the ratio. On two shared cores,
every millisecond the generator spends is taken from the server under test."""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from harness import batching, build_cheap_model, loadtest, serving, write_config

from latlab.common import procs

CLIENTS = ("lean", "locust")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="open-loop arrivals/s of every run")
    parser.add_argument("--pairs", type=int, default=2, help="lean/locust runs, alternating")
    parser.add_argument("--step-seconds", type=float, default=6.0)
    parser.add_argument("--out", default=f"runs/generator-cost-{time.strftime('%Y%m%d-%H%M%S')}")
    args = parser.parse_args(argv)
    work = Path(args.out).resolve()
    noop = build_cheap_model(work / "noop" / "model.onnx", [128], reduce=False)
    port = procs.free_port()
    config = write_config(work / "noop.toml", port, {"noop": (noop, batching(64, 2.0))})
    cost: dict[str, list[float]] = {client: [] for client in CLIENTS}
    print(f"{'client':<8} {'offered':>8} {'achieved':>9} {'p99 ms':>7} {'gen CPU %':>9} {'CPU ms/request':>15}")
    with serving(config, port, work / "server.log") as served:
        for pair in range(args.pairs):
            for client in CLIENTS:
                (deployment,) = loadtest(
                    served.url,
                    ["noop"],
                    work / f"{client}-{pair}",
                    "--client",
                    client,
                    "--rates",
                    f"{args.rate:g}",
                    "--step-seconds",
                    f"{args.step_seconds:g}",
                    "--warmup-seconds",
                    "2",
                    "--max-windows",
                    "3",
                )
                step = deployment.steps[-1]
                per_request_ms = step.generator_cpu_percent / 100.0 / step.achieved_rps * 1e3
                cost[client].append(per_request_ms)
                print(
                    f"{client:<8} {step.offered_rps:8.0f} {step.achieved_rps:9.0f} "
                    f"{step.p99_s * 1e3:7.1f} {step.generator_cpu_percent:9.1f} {per_request_ms:15.3f}"
                )
    lean, locust = (statistics.median(cost[c]) for c in CLIENTS)
    print(
        f"\ngenerator CPU per request, median of {args.pairs}: lean {lean:.3f} ms, locust {locust:.3f} ms; "
        f"lean / locust = {lean / locust:.2f}"
    )


if __name__ == "__main__":
    main()
