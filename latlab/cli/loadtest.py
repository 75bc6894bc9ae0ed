"""`latlab loadtest`: a sweep of offered load (or an SLO search, an overload test) against deployments with
Locust; every option also read from the environment and a config file (options.py). The options and their checks
belong to the sweep plan's parts (loadtest/plan.py); this module adds the command's own and runs the plan."""

from __future__ import annotations

import argparse
from pathlib import Path

from latlab.loadtest.plan import SweepPlan

HELP_ORDER = (
    "--config-file",
    "--host",
    "--deployment",
    "--mode",
    "--rates",
    "--users",
    "--step-seconds",
    "--max-windows",
    "--warmup-seconds",
    "--calibrate-seconds",
    "--calibrate-only",
    "--arrivals",
    "--constant",
    "--trace",
    "--trace-rate",
    "--trace-start",
    "--seed",
    "--binary",
    "--seq-len",
    "--text",
    "--seq-len-max",
    "--dim",
    "--inputs",
    "--client",
    "--no-stop",
    "--max-rate",
    "--refine-within",
    "--slo",
    "--sweep",
    "--slos",
    "--confidence",
    "--slo-steps",
    "--slo-seconds",
    "--decide-windows",
    "--resolution",
    "--slo-floor",
    "--slo-growth",
    "--workers",
    "--expect-workers",
    "--master-bind-host",
    "--master-port",
    "--metrics-port",
    "--server-metrics",
    "--provider",
    "--fleet",
    "--overload",
    "--burst-seconds",
    "--capacity",
    "--recovery-load",
    "--out",
    "--run-id",
    "--machine-name",
)
"""How --help lists the options: the plan's parts add theirs part by part, and a part's options are not all
together in the order users know (the payload's among the schedule's, the machine's name last)."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`latlab loadtest`: every option also read from the environment and a config file."""
    load = sub.add_parser(
        "loadtest",
        allow_abbrev=False,
        help="sweep offered load (or search an SLO) against deployments with Locust",
        epilog="Every option also reads LATLAB_<OPTION> (e.g. LATLAB_RATES=100,200) and a "
        "[loadtest] table of --config-file; the command line wins, then the environment.",
    )
    load.add_argument("--config-file", type=Path, help="TOML file with a [loadtest] table of these options")
    SweepPlan.add_cli_args(load)
    load.add_argument("--out", type=Path, help="run folder (default: runs/<timestamp>)")
    load.add_argument("--run-id", help="run label in results and metrics (default: the run folder's name)")
    _in_help_order(load)
    load.set_defaults(func=cmd_loadtest)


def _in_help_order(parser: argparse.ArgumentParser) -> None:
    rank = {option: i for i, option in enumerate(HELP_ORDER)}

    def key(action: argparse.Action) -> int:
        if "--help" in action.option_strings:
            return -1
        return min((rank[o] for o in action.option_strings if o in rank), default=len(rank))

    parser._actions.sort(key=key)
    for group in parser._action_groups:
        group._group_actions.sort(key=key)


def cmd_loadtest(args: argparse.Namespace) -> None:
    from latlab.loadtest.run import run_plan  # first: Locust patches sockets

    from latlab.loadtest.results import new_run_id

    run_plan(SweepPlan.from_cli_args(args), args.out or Path("runs") / new_run_id(), args.run_id)
