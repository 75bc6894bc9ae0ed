"""`latlab report`: the HTML report of run folders, merged (or rebuilt from Prometheus)."""

from __future__ import annotations

import argparse
from pathlib import Path

from latlab.cli.plan import add_plan_arguments, plan_request
from latlab.common.user_input import UserError, parse_slos


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`latlab report`."""
    report = sub.add_parser(
        "report", help="write the HTML report of run folders, merged (or rebuild one from Prometheus)"
    )
    report.add_argument(
        "run_dirs",
        type=Path,
        nargs="+",
        metavar="RUN",
        help="run folders (results*.json, bench*.json), e.g. one from a CPU box and one from a GPU "
        "box; with --from-prometheus: the one folder to write to",
    )
    report.add_argument("--out", type=Path, help="where report.html and its PNGs go (default: the first RUN)")
    report.add_argument(
        "--price",
        metavar="PROVIDER=USD",
        help="hourly price per provider, e.g. cpu=0.10,cuda=2.50 "
        "(default: example prices, labelled as such in the report)",
    )
    report.add_argument(
        "--with-reference",
        action="store_true",
        help="also merge the reference measurements committed under report/reference/ (off by "
        "default: the report then shows only your machines)",
    )
    report.add_argument("--from-prometheus", metavar="URL", help="rebuild the curves from this Prometheus alone")
    report.add_argument("--run", help="with --from-prometheus: the run id (default: the run folder's name)")
    report.add_argument("--slo", default="10ms,25ms,50ms,100ms", help="p99 bounds, e.g. 25ms,50ms,0.1s")
    add_plan_arguments(report, prefix="plan-")
    report.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> None:
    from latlab.report.write import write_report
    from latlab.report.prices import PriceError, parse_prices

    slos = parse_slos(args.slo)
    plan = plan_request(args, prefix="plan-")  # a bad --plan-traffic is one line now, before any work
    try:
        prices = parse_prices(args.price) if args.price is not None else None
    except PriceError as exc:
        raise UserError(str(exc)) from None
    if args.from_prometheus:
        from latlab.loadtest.from_prometheus import curves_from_prometheus
        from latlab.loadtest.results import write_results

        if len(args.run_dirs) != 1:
            raise UserError("--from-prometheus rebuilds one run: give exactly one RUN folder")
        run_dir = args.run_dirs[0]
        run = curves_from_prometheus(args.from_prometheus, args.run or run_dir.name)
        write_results(run_dir / "results-prometheus.json", run)
        print(f"rebuilt {sum(len(d.steps) for d in run.deployments)} steps from {args.from_prometheus}")
    path = write_report(args.run_dirs, slos, prices=prices, out=args.out, with_reference=args.with_reference, plan=plan)
    print(f"report: {path}")
