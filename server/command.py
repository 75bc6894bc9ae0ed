"""`latlab serve`'s options and what they run, shared by the CLI and the server's own entry for child processes
(`python -m latlab.server`, __main__.py), and `serve_command`, the one place that command line is built.

Only the standard library at import: the CLI imports this module whatever command it runs."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HELP = "serve the deployments of a TOML config over HTTP"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `latlab serve` and `python -m latlab.server`."""
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--host", help="override [server] host")
    parser.add_argument("--port", type=int, help="override [server] port")
    parser.add_argument(
        "--metrics-port",
        type=int,
        help="override [server] metrics_port: /metrics and health on their own port (default port + 1)",
    )
    parser.add_argument(
        "--frontends",
        type=int,
        help="override [server] frontends: HTTP processes feeding one engine process (default 1: "
        "one process does everything)",
    )
    parser.add_argument(
        "--interface",
        help='override [server] interface, as LATLAB_INTERFACE does: "wsgi" (default), "native" (no thread per '
        'request, in one process or in each front end) or "rsgi"',
    )


def serve_from_args(args: argparse.Namespace) -> None:
    """Serve what the options of add_arguments ask for, in the foreground until SIGINT/SIGTERM."""
    from latlab.server.config import INTERFACE_ENV
    from latlab.server.processes.wsgi import serve  # Flask, Granian and ONNX Runtime: only where a server runs

    if getattr(args, "interface", None):
        os.environ[INTERFACE_ENV] = args.interface  # every process of the server reads it (served_config)
    serve(args.config, args.host, args.port, args.metrics_port, args.frontends)


def serve_command(config: Path, metrics_port: int | None = None) -> list[str]:
    """The command line of a server child process serving `config` (`latlab serve`, started by the lab, the doctor
    and the benchmarks); `metrics_port` overrides [server] metrics_port."""
    command = [sys.executable, "-m", "latlab.server", "--config", str(config)]
    if metrics_port is not None:
        command += ["--metrics-port", str(metrics_port)]
    return command
