"""`latlab serve`: the deployments of a TOML config over HTTP (its options and what they run: server/command.py,
which the server's own entry for child processes, `python -m latlab.server`, shares)."""

from __future__ import annotations

import argparse

from latlab.server.command import HELP, add_arguments, serve_from_args


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`latlab serve`."""
    serve = sub.add_parser("serve", help=HELP)
    add_arguments(serve)
    serve.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> None:
    serve_from_args(args)
