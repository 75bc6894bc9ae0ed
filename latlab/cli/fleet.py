"""`latlab fleet`: N replicas of one server config behind HAProxy, until Ctrl-C or SIGTERM; SIGHUP rolls them."""

from __future__ import annotations

import argparse
import signal
import tempfile
import time
from pathlib import Path

HELP = "serve a config as N replicas behind HAProxy (SIGHUP: rolling restart; Ctrl-C/SIGTERM: drain and stop)"


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`latlab fleet`."""
    fleet = sub.add_parser("fleet", help=HELP, description=HELP)
    fleet.add_argument("--config", type=Path, required=True, help="the server config every replica serves")
    fleet.add_argument("--replicas", type=int, default=2)
    fleet.add_argument("--host", default="127.0.0.1", help="the address the proxy listens on")
    fleet.add_argument("--port", type=int, default=8000, help="the proxy's port")
    fleet.add_argument(
        "--stats-port", type=int, help="the proxy's /metrics (Prometheus exporter) and /stats (default port + 1)"
    )
    fleet.add_argument("--balance", default="leastconn", help="roundrobin, leastconn or random(2)")
    fleet.add_argument(
        "--rate-limit", type=int, default=0, help="requests per second per client IP; beyond: 429 + Retry-After"
    )
    fleet.add_argument("--gpus", type=int, default=0, help="GPUs to spread CUDA replicas over (cuda:0, cuda:1, ...)")
    fleet.add_argument("--dir", type=Path, help="where replica configs, logs and targets go (default: a new temp dir)")
    fleet.add_argument(
        "--targets",
        type=Path,
        help="write the Prometheus file_sd targets here instead (e.g. grafana/targets/servers-fleet.json); "
        "removed at exit",
    )
    fleet.set_defaults(func=cmd_fleet)


def cmd_fleet(args: argparse.Namespace) -> None:
    from latlab.fleet.build import build_fleet  # the server's config loader and HTTP client: only when run
    from latlab.lab.plan import available_cores

    folder = args.dir or Path(tempfile.mkdtemp(prefix="latlab-fleet-"))
    fleet = build_fleet(
        args.config,
        folder,
        available_cores(),
        replicas=args.replicas,
        port=args.port,
        stats_port=args.stats_port,
        host=args.host,
        balance=args.balance,
        rate_limit=args.rate_limit,
        gpus=args.gpus,
        targets=args.targets,
    )
    asked = {"stop": False, "roll": False}  # by signals; acted on in the loop below, never inside a handler

    def on_stop(signum: int, frame: object) -> None:
        asked["stop"] = True

    def on_roll(signum: int, frame: object) -> None:
        asked["roll"] = True

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_stop)
    signal.signal(signal.SIGHUP, on_roll)
    try:
        fleet.start()
        spec = fleet.spec
        print(
            f"ready: {len(spec.replicas)} replicas behind haproxy on http://{spec.host}:{spec.port} "
            f"(balance {spec.balance}); proxy metrics http://127.0.0.1:{spec.stats_port}/metrics; "
            f"Prometheus targets {fleet.targets}; logs in {folder}",
            flush=True,
        )
        while not asked["stop"]:
            if asked["roll"]:
                asked["roll"] = False
                try:
                    fleet.roll()
                except (RuntimeError, TimeoutError) as exc:  # a replica that will not start: the rest serve on
                    print(f"rolling restart stopped: {exc}", flush=True)
            time.sleep(0.2)
        print("draining the proxy, then stopping the replicas", flush=True)
    finally:
        fleet.stop()
