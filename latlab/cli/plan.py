"""`latlab plan`: which fleet of CPU and GPU replicas serves a day of traffic within the SLO at the lowest cost."""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

from latlab.common.user_input import UserError


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`latlab plan`."""
    plan = sub.add_parser(
        "plan",
        help="simulate CPU, GPU and hybrid fleets of a run's deployments over a day of traffic: cost, SLO attainment",
    )
    plan.add_argument("run_dir", type=Path, metavar="RUN", help="a lab run folder (results*.json, bench*.json)")
    add_plan_arguments(plan, required=True)
    plan.add_argument(
        "--price",
        action="append",
        default=[],
        metavar="KIND=USD",
        help="USD per machine-hour of a replica, e.g. --price cpu=0.10 --price gpu=2.50 (default: the report's "
        "example prices)",
    )
    plan.set_defaults(func=cmd_plan)


def add_plan_arguments(parser: argparse.ArgumentParser, prefix: str = "", required: bool = False) -> None:
    """The options that ask for a plan, for `latlab plan` (no prefix) and for `latlab report` and `lab` (prefix
    "plan-": --plan-traffic and its companions); read back with plan_request."""
    extra = " (asks for the fleet plan's section)" if prefix else ""
    parser.add_argument(
        f"--{prefix}traffic",
        required=required,
        metavar="PROFILE",
        help="diurnal:PEAK:TROUGH[:CV] (req/s over a day, trough at midnight, peak at noon, gamma bursts of CV "
        "within each minute) or trace:FILE (the trace's per-minute rates repeated over the day)" + extra,
    )
    parser.add_argument(
        f"--{prefix}trace-rate",
        type=float,
        metavar="PEAK",
        help=f"with --{prefix}traffic trace:FILE: the req/s of the trace's busiest minute (a PEAK, not a mean)",
    )
    parser.add_argument(
        f"--{prefix}burst-cv", type=float, help="the gaps' CV within a minute (default: diurnal 1, a trace's own)"
    )
    parser.add_argument(f"--{prefix}slo", default="p99:50ms", help="p99:50ms or attain:99.9%%:50ms (default p99:50ms)")
    parser.add_argument(f"--{prefix}model", help="which of the run's models to plan for (default: the first)")
    parser.add_argument(f"--{prefix}target", default="inflight:2", help="inflight:N (Ray Serve's default 2) or util:U")
    parser.add_argument(f"--{prefix}upscale-delay", type=float, default=30.0, help="seconds (Ray Serve's default 30)")
    parser.add_argument(
        f"--{prefix}downscale-delay", type=float, default=600.0, help="seconds (Ray Serve's default 600)"
    )
    parser.add_argument(
        f"--{prefix}cold-start",
        type=float,
        metavar="S",
        help="seconds from a replica's start to ready, for every kind (default: what the lab measured from "
        "`latlab serve` start to ready; where it measured none, as for the H100 reference, an assumed 60)",
    )
    parser.add_argument(
        f"--{prefix}sim-seconds",
        type=float,
        default=8.0,
        help="about how long one fleet's day may take to simulate; beyond it every k-th minute is (default 8)",
    )
    parser.add_argument(
        f"--{prefix}use-off", action="store_true", help="plan with replica models the validation found off"
    )


def plan_request(args: argparse.Namespace, prefix: str = ""):
    """The checked PlanRequest of add_plan_arguments' options (None where no traffic was given); a UserError
    naming the option otherwise, before any work."""

    def given(name: str):
        return getattr(args, (prefix + name).replace("-", "_"))

    if given("traffic") is None:
        return None
    try:
        return _checked(given, prefix)
    except UserError as exc:  # the messages name latlab plan's options: name the ones this command was given
        raise UserError(re.sub(r"(?<![\w-])--(?=[a-z])", f"--{prefix}", str(exc))) from None


def _checked(given, prefix: str):
    from latlab.report.fleetplan.autoscale import Autoscaler
    from latlab.report.fleetplan.fleet import Slo
    from latlab.report.fleetplan.plan import PlanRequest, check_target
    from latlab.report.fleetplan.traffic import parse_profile

    slo = Slo.parse(given("slo"))
    check_target(given("target"))
    try:
        cold = given("cold-start")
        scaler = Autoscaler(given("upscale-delay"), given("downscale-delay"))
        Autoscaler(cold_start_s=0.0 if cold is None else cold)  # a negative one is refused here, before any work
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if not given("sim-seconds") > 0:
        raise UserError(f"--sim-seconds must be > 0, got {given('sim-seconds'):g}")
    traffic = parse_profile(given("traffic"), given("trace-rate"), given("burst-cv"))
    return PlanRequest(
        traffic, slo, scaler, given("target"), given("model"), given("use-off"), given("sim-seconds"), cold
    )


def cmd_plan(args: argparse.Namespace) -> None:
    from latlab.report.prices import DEFAULT_PRICES, PriceError, parse_prices

    started = time.perf_counter()
    request = plan_request(args)
    try:
        prices = parse_prices(",".join(args.price)) if args.price else {"cpu": DEFAULT_PRICES["cpu"]}
    except PriceError as exc:
        raise UserError(str(exc)) from None
    if not args.price:
        prices["gpu"] = DEFAULT_PRICES["cuda"]
    plan = request.make(args.run_dir, prices)
    for line in plan_lines(plan, example_prices=not args.price):
        print(line)
    print(f"planned in {time.perf_counter() - started:.1f} s")


def plan_lines(plan, example_prices: bool = False) -> list[str]:
    """The plan as text: the traffic, each replica kind and its check, each fleet's day, the verdict."""
    lines = [
        f"traffic: {plan.traffic.name}; {plan.traffic.requests / 1e6:.1f} M requests a day "
        f"(mean {plan.traffic.rates_rps.mean():.0f} req/s, peak {plan.traffic.rates_rps.max():.0f} req/s)",
        f"SLO: {plan.slo.text}" + ("; example prices (give --price)" if example_prices else ""),
    ]
    for row in plan.validation:
        errors = ", ".join(_slo_check(s) for s in row["slos"])
        lines.append(
            f"check {row['deployment']} ({row['source']}): predicted rate under each SLO vs measured: {errors}"
        )
    for kind in plan.kinds:
        sizing = plan.sizing[kind.name]
        lines.append(
            f"{kind.name} replica ({kind.source}), ${kind.usd_per_hour:g}/h: within the SLO up to "
            f"{sizing.slo_rps:.0f} req/s, autoscaled at {sizing.target_rps:.0f} req/s per replica, "
            f"cold start {kind.cold_start_text}"
        )
    lines += [f"note: {note}" for note in plan.notes]
    if plan.stride > 1:
        lines.append(f"note: one minute in {plan.stride} simulated (--sim-seconds per fleet)")
    simulated = sum(day.simulated_requests for day in plan.days)
    lines.append(
        f"simulated {simulated / 1e6:.1f} M requests of the fleets' replicas in {plan.simulate_s:.1f} s "
        f"({simulated / max(plan.simulate_s, 1e-9) / 1e6:.2f} M/s, arrivals and routing included)"
    )
    lines.append(
        f"{'fleet':<34} {'in SLO':>9} {'worst min':>9} {'replicas':>16} {'machine-h':>10} {'$/day':>10} {'$/M req':>8}"
    )
    for day in plan.days:
        replicas = " ".join(f"{k} {t.ready.min()}-{t.ready.max()}" for k, t in day.timelines.items())
        lines.append(
            f"{day.spec.name:<34} {day.attainment * 100:>8.3f}% {day.worst_minute * 100:>8.2f}% {replicas:>16} "
            f"{sum(day.machine_hours.values()):>10.1f} {day.usd_per_day:>10.2f} {day.usd_per_million:>8.3f}"
        )
    for day in plan.days:
        for kind, timeline in day.timelines.items():
            per_hour = timeline.billed.reshape(24, -1).mean(axis=1) if timeline.billed.size % 24 == 0 else []
            lines.append(f"{day.spec.name}, {kind} replicas by hour: " + " ".join(f"{x:.1f}" for x in per_hour))
    lines.append(plan.verdict)
    return lines


def _slo_check(slo: dict) -> str:
    """One SLO's rate, predicted against measured, as the check line shows it."""
    said = f"{slo['slo_s'] * 1e3:g} ms "
    if not slo["measured_rps"]:
        said += f"none measured, {slo['predicted_rps']:.0f} predicted"
    else:
        said += f"{slo['predicted_rps']:.0f} vs {slo['measured_rps']:.0f} req/s ({slo['error'] * 100:+.0f}%)"
    return said + (" off" if slo["off"] else "")
