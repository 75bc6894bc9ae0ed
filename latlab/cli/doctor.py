"""`latlab doctor`: what this machine offers (the report itself is latlab/doctor.py)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`latlab doctor`."""
    doctor = sub.add_parser(
        "doctor", help="what this machine offers: CPU, GPU, ONNX Runtime providers, the load generator's floor"
    )
    doctor.add_argument(
        "--host",
        help="measure the load generator's floor against this server (default: a latlab serve of a one-Add model "
        "started on a free port of 127.0.0.1)",
    )
    doctor.add_argument("--no-generator", action="store_true", help="leave out the load generator's floor")
    doctor.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> None:
    from latlab.doctor import report

    print(report(generator=not args.no_generator, host=args.host))
