"""The `latlab` command: export, serve, loadtest, report, lab, bench, doctor, tune. One module per command
(its options and what it runs); options.py fills the load test's options from the environment and a config file.

Heavy imports happen inside each subcommand: `serve` must not load torch, `loadtest` must import
Locust (which monkey-patches sockets) before anything else.
"""

from __future__ import annotations

import argparse
import sys

from latlab.cli import bench, doctor, export, fleet, lab, loadtest, plan, report, serve, tune
from latlab.cli.options import apply_env_and_file
from latlab.common.user_input import UserError


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
        if args.command == "loadtest":
            args = apply_env_and_file(parser, args, sys.argv[1:] if argv is None else argv)
    except UserError as exc:
        print(f"latlab: error: {exc}", file=sys.stderr)
        return 2
    try:
        return args.func(args) or 0
    except KeyboardInterrupt as exc:
        from latlab.common.procs import Terminated

        print("latlab: terminated" if isinstance(exc, Terminated) else "latlab: interrupted", file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130
    except Exception as exc:  # user errors become one readable line; bugs keep their traceback
        if not _is_user_error(exc):
            raise
        print(f"latlab: error: {exc}", file=sys.stderr)
        return 2


def _is_user_error(exc: Exception) -> bool:
    from latlab.server.errors import ConfigError

    user_errors: tuple[type[Exception], ...] = (UserError, ConfigError, FileNotFoundError, LookupError)
    if "latlab.export.onnx_export" in sys.modules:
        user_errors += (sys.modules["latlab.export.onnx_export"].ParityError,)
    if "requests" in sys.modules:
        user_errors += (sys.modules["requests"].ConnectionError,)
    return isinstance(exc, user_errors)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="latlab", description="ONNX Runtime inference serving latency lab")
    sub = parser.add_subparsers(dest="command", required=True)
    export.add_parser(sub)
    serve.add_parser(sub)
    loadtest.add_parser(sub)
    report.add_parser(sub)
    lab.add_parser(sub)
    bench.add_parser(sub)
    doctor.add_parser(sub)
    tune.add_parser(sub)
    fleet.add_parser(sub)
    plan.add_parser(sub)
    return parser
