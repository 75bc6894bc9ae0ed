"""`latlab serve`: the deployments of a TOML config over HTTP."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`latlab serve`."""
    serve = sub.add_parser("serve", help="serve the deployments of a TOML config over HTTP")
    serve.add_argument("--config", type=Path, required=True)
    serve.add_argument("--host", help="override [server] host")
    serve.add_argument("--port", type=int, help="override [server] port")
    serve.add_argument(
        "--metrics-port",
        type=int,
        help="override [server] metrics_port: /metrics and health on their own port (default port + 1)",
    )
    serve.add_argument(
        "--frontends",
        type=int,
        help="override [server] frontends: HTTP processes feeding one engine process (default 1: "
        "one process does everything)",
    )
    serve.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> None:
    from latlab.server.processes.wsgi import serve

    serve(args.config, args.host, args.port, args.metrics_port, args.frontends)
