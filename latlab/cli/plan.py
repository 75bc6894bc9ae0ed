"""`latlab plan`: which fleet of CPU and GPU replicas serves a day of traffic within the SLO at the lowest cost."""

from __future__ import annotations

import argparse
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
    plan.add_argument(
        "--traffic",
        required=True,
        metavar="PROFILE",
        help="diurnal:PEAK:TROUGH[:CV] (req/s over a day, trough at midnight, peak at noon, gamma bursts of CV "
        "within each minute) or trace:FILE (the trace's per-minute rates repeated over the day)",
    )
    plan.add_argument(
        "--trace-rate",
        type=float,
        metavar="PEAK",
        help="with trace:FILE: the req/s of the trace's busiest minute (a PEAK, not a mean)",
    )
    plan.add_argument("--burst-cv", type=float, help="the gaps' CV within a minute (default: diurnal 1, a trace's own)")
    plan.add_argument("--slo", default="p99:50ms", help="p99:50ms or attain:99.9%%:50ms (default p99:50ms)")
    plan.add_argument(
        "--price",
        action="append",
        default=[],
        metavar="KIND=USD",
        help="USD per machine-hour of a replica, e.g. --price cpu=0.10 --price gpu=2.50 (default: the report's "
        "example prices)",
    )
    plan.add_argument("--model", help="which of the run's models to plan for (default: the first)")
    plan.add_argument("--target", default="inflight:2", help="inflight:N (Ray Serve's default 2) or util:U")
    plan.add_argument("--upscale-delay", type=float, default=30.0, help="seconds (Ray Serve's default 30)")
    plan.add_argument("--downscale-delay", type=float, default=600.0, help="seconds (Ray Serve's default 600)")
    plan.add_argument("--cold-start", type=float, help="seconds from a replica's start to ready (default 60)")
    plan.add_argument(
        "--sim-seconds",
        type=float,
        default=8.0,
        help="about how long one fleet's day may take to simulate; beyond it every k-th minute is (default 8)",
    )
    plan.add_argument("--use-off", action="store_true", help="plan with replica models the validation found off")
    plan.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> None:
    from latlab.report.fleetplan.autoscale import DEFAULT_COLD_START_S, Autoscaler
    from latlab.report.fleetplan.fleet import Slo
    from latlab.report.fleetplan.plan import check_target, make_plan
    from latlab.report.fleetplan.traffic import parse_profile
    from latlab.report.prices import DEFAULT_PRICES, PriceError, parse_prices

    started = time.perf_counter()
    slo = Slo.parse(args.slo)
    check_target(args.target)
    try:
        prices = parse_prices(",".join(args.price)) if args.price else {"cpu": DEFAULT_PRICES["cpu"]}
    except PriceError as exc:
        raise UserError(str(exc)) from None
    if not args.price:
        prices["gpu"] = DEFAULT_PRICES["cuda"]
    try:
        scaler = Autoscaler(
            args.upscale_delay,
            args.downscale_delay,
            DEFAULT_COLD_START_S if args.cold_start is None else args.cold_start,
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if not args.sim_seconds > 0:
        raise UserError(f"--sim-seconds must be > 0, got {args.sim_seconds:g}")
    traffic = parse_profile(args.traffic, args.trace_rate, args.burst_cv)
    plan = make_plan(
        args.run_dir, traffic, slo, prices, scaler, args.target, args.model, args.use_off, args.sim_seconds
    )
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
            f"{sizing.slo_rps:.0f} req/s, autoscaled at {sizing.target_rps:.0f} req/s per replica"
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
