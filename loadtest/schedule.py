"""The timing parts of a sweep plan (plan.py): how the load is stepped (`Schedule`) and the SLO searches that add
steps of their own (`SloSearch`); each checks itself and owns its `latlab loadtest` options."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from latlab.common.user_input import Slos, UserError, parse_rates, parse_slo_bound
from latlab.loadtest.arrivals import SPEC_HELP, Arrivals


DEFAULT_RATES = "100,200,400"


def arrivals_from_cli_args(args: argparse.Namespace) -> Arrivals:
    """--arrivals, or its shorthands --constant and --trace FILE (with --trace-start), one of them."""
    given = [
        name
        for name, on in (("--arrivals", args.arrivals), ("--constant", args.constant), ("--trace", args.trace))
        if on
    ]
    if len(given) > 1:
        raise UserError(f"{' and '.join(given)} both say how requests arrive: give one")
    if args.trace_start and not (args.trace or args.arrivals.startswith("trace:")):
        raise UserError("--trace-start is where a replayed trace starts: name one with --trace FILE")
    if args.trace:
        return Arrivals.parse(f"trace:{args.trace}", args.trace_start)
    if args.constant:
        return Arrivals("constant")
    return Arrivals.parse(args.arrivals, args.trace_start) if args.arrivals else Arrivals()


@dataclass(frozen=True)
class Schedule:
    """How the load is stepped: the loads, each step's warm-up and windows, and when the sweep stops or raises."""

    mode: str = "open"
    """"open": arrivals at a rate, latency from the intended send time; "closed": a number of users."""
    loads: tuple[float, ...] = (100.0, 200.0, 400.0)
    """Offered rates (open loop) or user counts (closed loop); with SloSearch.search, loads[0] is where the SLO
    search starts."""
    warmup_seconds: float = 2.0
    calibrate_seconds: float = 2.0
    """Open loop: measure the generator's floor for this long per rate before the first deployment (floor.py)."""
    calibrate_only: bool = False
    """Measure the generator's floor and no deployment unless some are named."""
    window_seconds: float = 2.0
    min_windows: int = 3
    max_windows: int = 6
    arrivals: Arrivals = Arrivals()
    """Open loop: how requests arrive at each step's mean rate (arrivals.py)."""
    seed: int = 0
    """Open loop: every step draws its arrivals from this seed, the same gaps scaled to its rate (0: a new draw
    for each step)."""
    stop_at_saturation: bool = True
    max_rate: float = 0.0
    """Open loop: past the listed rates keep raising by RAISE_BY until the deployment saturates, breaks the
    SLO or errs, up to this cap (0: stop at the last listed rate). A maximum never reached is recorded as
    such (`saturated: false`), never as the deployment's capacity."""
    refine_within: float = 0.1
    """With max_rate, after a failed step: bisect between the last rate met and the first failed until they
    are within this fraction of the former (0.1: about three more steps; 0.3: one)."""
    max_error_ratio: float = 0.01
    queue_sample_seconds: float = 0.0
    """Sample the server's queue depth this often during each step (0: off; each scrape costs the server
    a few ms of its interpreter lock, so plain sweeps leave it off)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "loads", tuple(float(load) for load in self.loads))  # as results record them
        if isinstance(self.arrivals, dict):  # from a plan file
            object.__setattr__(self, "arrivals", Arrivals(**self.arrivals))
        self.arrivals.check()
        if self.mode == "closed" and self.arrivals != Arrivals():
            raise UserError(
                f"--arrivals {self.arrivals.spec} shapes open-loop arrivals; a closed loop's users send when answers "
                "return (--mode open)"
            )
        if self.calibrate_only and (self.mode != "open" or self.calibrate_seconds <= 0):
            raise UserError("--calibrate-only measures open-loop arrivals for --calibrate-seconds > 0")
        if not 0 < self.refine_within < float("inf"):
            raise UserError(f"--refine-within must be a positive fraction, got {self.refine_within:g}")
        if not 0 <= self.max_rate < float("inf"):
            raise UserError(
                f"--max-rate must be a finite rate >= 0 (0: stop at the last of --rates), got {self.max_rate:g}"
            )

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        add = parser.add_argument
        add(
            "--mode",
            choices=["open", "closed"],
            default="open",
            help="open: arrivals at a rate, latency from the intended send time; closed: N users",
        )
        add("--rates", default=None, help=f"open loop: offered requests/s per step (default {DEFAULT_RATES})")
        add("--users", default="1,2,4,8,16", help="closed loop: concurrent users per step")
        add("--step-seconds", type=float, default=6.0, help="measurement per step: 3 windows of a third")
        add("--max-windows", type=int, default=6, help="extend an unstable step up to this many windows")
        add("--warmup-seconds", type=float, default=2.0, help="load before each measurement")
        add(
            "--calibrate-seconds",
            type=float,
            default=2.0,
            help="open loop: before the sweep, measure the generator's own floor (round trip of GET /v2/health/live "
            "at the sweep's lowest and highest rate) for this long per rate; 0: not measured",
        )
        add(
            "--calibrate-only",
            action="store_true",
            help="measure the generator's floor at the lowest and highest of --rates, and no deployment",
        )
        add(
            "--arrivals",
            default="",
            help=f"open loop: how requests arrive at each step's mean rate: {SPEC_HELP} (default poisson)",
        )
        add("--constant", action="store_true", help="constant arrival gaps instead of Poisson (--arrivals constant)")
        add(
            "--trace",
            default="",
            help="replay this CSV's request times (first column: ISO 8601 or seconds; --arrivals trace:FILE), time "
            "scaled to each step's rate, its shape kept; looped at its end",
        )
        add(
            "--seed",
            type=int,
            default=0,
            help="open loop: draw every step's arrivals from this seed (the same gaps, scaled to each rate; "
            "0: a new draw per step)",
        )
        add("--trace-rate", type=float, default=0.0, help="with --trace: one step at this mean rate (--rates R)")
        add("--trace-start", type=float, default=0.0, help="with --trace: start each step this many seconds in")
        add("--no-stop", action="store_true", help="keep going past saturation")
        add(
            "--max-rate",
            type=float,
            default=0.0,
            help="open loop: past --rates keep raising the rate x1.5 per step until the deployment saturates "
            "or breaks the SLO, up to this cap (0: stop at the last listed rate); a maximum never "
            "reached is reported as '≥ N (not saturated)'",
        )
        add(
            "--refine-within",
            type=float,
            default=0.1,
            help="with --max-rate: after a failed step, bisect until the last rate met and the first "
            "failed are within this fraction",
        )

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> Schedule:
        open_loop = args.mode == "open"
        arrivals = arrivals_from_cli_args(args)
        rates = args.rates
        if args.trace_rate:
            if rates is not None:
                raise UserError("--trace-rate R is --rates R: give one of them")
            if not args.trace:
                raise UserError("--trace-rate replays a trace: name it with --trace FILE")
            rates = f"{args.trace_rate:g}"
        loads = parse_rates(rates or DEFAULT_RATES) if open_loop else [float(int(u)) for u in parse_rates(args.users)]
        return cls(
            mode=args.mode,
            loads=tuple(loads),
            warmup_seconds=args.warmup_seconds,
            calibrate_seconds=max(0.0, args.calibrate_seconds),
            calibrate_only=args.calibrate_only,
            window_seconds=args.step_seconds / 3,
            max_windows=max(3, args.max_windows),
            arrivals=arrivals,
            seed=args.seed,
            stop_at_saturation=not args.no_stop,
            max_rate=args.max_rate,
            refine_within=args.refine_within,
        )


@dataclass(frozen=True)
class SloSearch:
    """The SLOs a sweep answers for: each bound of `slos` bracketed after the sweep, or one p99 bound (`p99_s`)
    searched for its highest rate (`search`) or stopping the sweep where a step breaks it by `margin`."""

    slos: Slos = Slos()
    """Open loop: after the sweep, find each of these SLOs' highest rate to within `resolution`, searching
    between the last rate that met it and the first that broke it, and below the first step when that one
    broke it; "never" only with the single-request evidence (see single.py). Kept in ascending order."""
    confidence: float = 0.95
    """The level of each step's percentile intervals and SLO decisions (`confidence` in the results); the default
    is confidence.DEFAULT_CONFIDENCE, written out so that the plan, which every `latlab` command imports to build
    its options, needs no numpy."""
    decide_windows: int = 6
    """With slos: a step whose p99 is undecided for one of them (loadtest/confidence.py) gets up to this many
    more windows before its figures are read, while they could decide it (0: never)."""
    resolution: float = 0.1
    """The width of the SLO brackets and of the single-bound search: (first rate broken - last rate met) / last
    rate met."""
    max_steps: int = 12
    """At most this many extra steps per deployment for the SLO brackets (each says when it ran out)."""
    max_seconds: float = 0.0
    """No SLO bracket step starts after this many seconds of them per deployment (0: no time budget)."""
    p99_s: float | None = None
    """The single p99 bound (`--slo`)."""
    search: bool = False
    """With p99_s, open loop: search the highest rate that meets it (search.slo_search) instead of sweeping."""
    margin: float = 2.0
    """With p99_s and no search: the sweep stops at a step whose p99 breaks the bound by more than this factor."""
    floor: float = 1.0
    """The SLO search halves the rate no further than this (req/s): below it a deployment counts as meeting the
    bound at no rate (a tuning probe ranks, and need not resolve what holds a tiny fraction of the best)."""
    growth: float = 2.0
    """The SLO search raises a passing rate by this factor until the bound breaks (search.slo_search)."""

    def __post_init__(self) -> None:
        if not 0 < self.floor < float("inf"):
            raise UserError(f"--slo-floor must be a positive rate in req/s, got {self.floor:g}")
        if not 1 < self.growth <= 16:
            raise UserError(f"--slo-growth must be above 1 and at most 16, got {self.growth:g}")
        if not 0 < self.resolution < float("inf"):
            raise UserError(f"--resolution must be a positive fraction, e.g. 0.1, got {self.resolution:g}")
        if not 0.5 <= self.confidence < 1:
            raise UserError(f"--confidence must be at least 0.5 and below 1, e.g. 0.95, got {self.confidence:g}")
        object.__setattr__(self, "slos", self.slos.ascending())  # the brackets are narrowed from the lowest up

    @property
    def bounds(self) -> tuple[float, ...]:
        """Every bound a step decides: the brackets' and the single one."""
        return (*self.slos.seconds, *([self.p99_s] if self.p99_s else []))

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        add = parser.add_argument
        add("--slo", help="p99 bound, e.g. p99=50ms: search the highest rate that meets it")
        add("--sweep", action="store_true", help="with --slo: sweep --rates, stop when p99 > 2x the SLO")
        add(
            "--slos",
            metavar="BOUNDS",
            help="open loop: after the sweep, find the highest rate under each of these p99 bounds (e.g. "
            "10ms,25ms,50ms) to within --resolution, below the first rate too; 'never' only when one "
            "request at a time breaks it",
        )
        add(
            "--confidence",
            type=float,
            default=0.95,
            help="level of each step's p50/p99 intervals and SLO decisions (met, broken, undecided)",
        )
        add(
            "--slo-steps",
            type=int,
            default=12,
            help="with --slos: at most this many extra steps per deployment for the SLO brackets",
        )
        add(
            "--slo-seconds",
            type=float,
            default=0.0,
            help="with --slos: no bracket step starts after this many seconds of them per deployment "
            "(0: no time budget; a low rate's step takes ten times a high rate's)",
        )
        add(
            "--decide-windows",
            type=int,
            default=6,
            help="with --slos: extend a step whose p99 is undecided for one of them by up to this many windows "
            "(0: never)",
        )
        add(
            "--resolution",
            type=float,
            default=0.1,
            help="--slo search and --slos: the bracket's width as a fraction of the rate met (0.1)",
        )
        add(
            "--slo-floor",
            type=float,
            default=1.0,
            help="--slo search: halve the rate no further than this (req/s); below it the deployment meets the "
            "bound at no rate (1)",
        )
        add(
            "--slo-growth",
            type=float,
            default=2.0,
            help="--slo search: raise a rate that met the bound by this factor until it breaks (2); a start near "
            "the edge takes less, so no step overloads the server far past it",
        )

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> SloSearch:
        p99_s = parse_slo_bound(args.slo) if args.slo else None
        return cls(
            slos=Slos.parse(args.slos) if args.slos else Slos(),
            confidence=args.confidence,
            decide_windows=max(0, args.decide_windows),
            resolution=args.resolution,
            max_steps=max(0, args.slo_steps),
            max_seconds=max(0.0, args.slo_seconds),
            p99_s=p99_s,
            search=bool(p99_s) and not args.sweep and args.mode == "open",
            floor=args.slo_floor,
            growth=args.slo_growth,
        )
