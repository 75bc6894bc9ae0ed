"""`latlab lab`: the main job, a built-in plan (or the user's own model) end to end."""

from __future__ import annotations

import argparse
from pathlib import Path

from latlab.cli.plan import add_plan_arguments, plan_request
from latlab.common.user_input import Slos, UserError


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`latlab lab`: the main job."""
    lab = sub.add_parser(
        "lab",
        help="the main job: export, serve, sweep and report on the built-in CPU plan, "
        "or on your own model (--onnx, --module, --model)",
        epilog="Your own model: --onnx FILE, --module PKG.MOD:FACTORY --name NAME, or --model NAME "
        "(exported before); inputs generated from its declared shapes (--dim for dynamic "
        "axes besides the batch) or taken from --inputs samples.npz. Every check runs "
        "before any load: a model the lab cannot serve stops it with one line.",
    )
    lab.add_argument("--runs-dir", type=Path, default=Path("runs"))
    lab.add_argument("--models-dir", type=Path, default=Path("models"))
    lab.add_argument(
        "--plan",
        choices=["cpu", "quick", "gpu", "gpu-quick", "gpu-serve", "gpu-serve-cpu"],
        default="cpu",
        help="cpu: the main job (mlp, ffn, cnn, minilm, with a 2-minute search; ~15 min on 2 cores); "
        "quick: fewer, shorter steps (~5.5 min); gpu: the same models on CUDA and CPU, for a GPU box; gpu-quick: "
        "that in fewer, shorter steps; gpu-serve: cnn and minilm on CUDA and CPU at p99 <= 25 and 50 ms, sized to "
        "one call of a borrowed GPU machine (benchmarks/gpu_kit.py); gpu-serve-cpu: its CPU half",
    )
    lab.add_argument("--quick", action="store_const", const="quick", dest="plan", help="same as --plan quick")
    lab.add_argument("--step-seconds", type=float, default=None, help="override the plan's step length")
    lab.add_argument(
        "--cpu-threads",
        type=int,
        help="ORT threads of each CPU deployment (default: every core the "
        "load generator does not need, as a CPU server would have)",
    )
    lab.add_argument(
        "--load-workers",
        type=int,
        help="Locust worker processes (default: none below 8 cores, then one per 4 cores, up to 8)",
    )
    lab.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="serve the deployments as a `latlab fleet` of N replicas behind HAProxy, the CPU threads split "
        "between them, every step recording each replica's requests and the proxy's counters (default 1: one "
        "server, no proxy; docs/fleet.md)",
    )
    lab.add_argument(
        "--balance",
        default="leastconn",
        help="--replicas above 1: the proxy's balance algorithm, roundrobin, leastconn or random(2)",
    )
    lab.add_argument("--machine-name", help="what reports call this machine (default: its CPU model, or the GPU)")
    lab.add_argument("--models", help="only these of the plan's models, e.g. cnn,minilm")
    lab.add_argument(
        "--slo",
        help="p99 bounds of the report and the sweep, e.g. 25ms,50ms,0.1s (default: the plan's, 10ms,25ms,50ms,100ms)",
    )
    lab.add_argument(
        "--resolution",
        type=float,
        help="each SLO's highest rate is found to within this fraction (default: the plan's, 0.1)",
    )
    lab.add_argument(
        "--slo-seconds",
        type=float,
        help="no SLO bracket step starts after this many seconds of them per deployment (default: the "
        "plan's: cpu 25, the others 40; 0: none, more brackets within --resolution for a longer run: "
        "docs/performance.md)",
    )
    lab.add_argument(
        "--slo-steps",
        type=int,
        help="extra steps per deployment for the SLO brackets (default: the plan's, 10); more buys "
        "brackets within --resolution on a noisy machine",
    )
    lab.add_argument(
        "--confidence",
        type=float,
        help="level of every step's p50/p99 intervals and SLO decisions (default: the plan's, 0.95)",
    )
    lab.add_argument(
        "--search-minutes",
        type=float,
        help="search each model's configurations per provider (variant: INT8 on the CPU, FP16 on CUDA; "
        "batching; core split; CUDA graphs) for this many minutes in all before the sweep, starting at the plan's "
        "batching setting in every variant side by side, and sweep the best of each in full in that setting's "
        "place (default: the plan's: cpu 2, the others 0: no search; docs/tuning.md)",
    )
    lab.add_argument(
        "--traffic",
        help="sweep every deployment under each of these arrival processes, e.g. poisson,gamma:3,"
        "trace:traces/AzureLLMInferenceTrace_conv.csv (each: poisson, constant, gamma:CV, onoff:PEAK,ON,OFF, "
        "trace:FILE; default poisson): the report's verdict speaks of the first and says what the others changed; "
        "each costs a sweep",
    )
    lab.add_argument(
        "--price",
        metavar="PROVIDER=USD",
        help="hourly price per provider, e.g. cpu=0.10,cuda=2.50 or "
        "cpu=0.04/core (default: example prices, labelled as such in the report)",
    )
    add_plan_arguments(lab.add_argument_group("the fleet plan in the report (latlab plan's options)"), "plan-")
    own = lab.add_argument_group("your own model (instead of the plan's zoo models)")
    own.add_argument("--onnx", type=Path, metavar="FILE", help="serve this ONNX file as it is")
    own.add_argument(
        "--module",
        metavar="PKG.MOD:FACTORY",
        help="export your PyTorch module to --models-dir/NAME first (needs --name), as `latlab export`",
    )
    own.add_argument("--model", metavar="NAME", dest="exported", help="a model exported before: --models-dir/NAME")
    own.add_argument("--name", help="what the report calls it (default: the file's or the model's name)")
    own.add_argument(
        "--inputs",
        type=Path,
        metavar="FILE.npz",
        help="real inputs to send: an .npz (numpy.savez) of arrays named after the model's inputs, "
        "rows first, one request per row (default: generated from the declared shapes and types)",
    )
    own.add_argument(
        "--dim",
        action="append",
        default=[],
        metavar="NAME=SIZE",
        help="your model: size of a dynamic axis other than the batch, e.g. --dim seq=128 (an unnamed axis: "
        "--dim INPUT:AXIS=SIZE); repeat for several. The zoo: --dim seq=SPEC sizes each request along its "
        "dynamic axes (a text request's tokens), drawn per request: N, uniform:LO:HI, lognormal:P50:P99 or "
        "trace:COLUMN (with a --traffic trace)",
    )
    own.add_argument("--providers", help="e.g. cpu,cuda (default: every provider that loads on this machine)")
    own.add_argument(
        "--rates",
        help="offered loads in req/s, e.g. 50,200,800 (default: from the model's measured "
        "batch-1 time; the sweep goes on past the last until saturation)",
    )
    lab.set_defaults(func=cmd_lab)


def cmd_lab(args: argparse.Namespace) -> None:
    """Every option is checked, and the user's model loaded and run once per provider, before the lab makes
    its run folder: a refused lab leaves nothing behind."""
    from dataclasses import replace

    from latlab.lab.plan import PLANS, available_cores, cpu_share
    from latlab.lab.run import run_lab
    from latlab.report.prices import PriceError, parse_prices
    from latlab.tune.lab_search import search_plan

    own = args.onnx is not None or args.module is not None or args.exported is not None
    if not own and any(v for v in (args.name, args.inputs, args.providers, args.rates)):
        raise UserError(
            "--name, --inputs, --providers and --rates are for your own model: "
            "give --onnx FILE, --module PKG.MOD:FACTORY or --model NAME"
        )
    if own and args.models:
        raise UserError("--models picks the plan's zoo models; your own model (--onnx, --module, --model) runs alone")
    if args.replicas > 1:
        from latlab.fleet.haproxy import haproxy_binary
        from latlab.fleet.spec import BALANCES

        if args.balance not in BALANCES:
            raise UserError(f"--balance must be one of {', '.join(BALANCES)}, got {args.balance!r}")
        haproxy_binary()  # a fleet needs HAProxy: one line now, not after the export and the bench
    try:
        share = cpu_share(available_cores(), args.cpu_threads, args.load_workers, args.replicas)
        plan = PLANS[args.plan].only(args.models.split(",") if args.models else None)
        plan = replace(plan, replicas=args.replicas, balance=args.balance)
        prices = parse_prices(args.price) if args.price is not None else None
    except (ValueError, PriceError) as exc:
        raise UserError(str(exc)) from None
    fleet_plan = plan_request(args, "plan-")  # a bad --plan-traffic is one line now, not after the sweep
    if args.slo is not None:
        plan = replace(plan, slos=Slos.parse(args.slo))  # a bad bound is refused here, before any work
    if args.slo_seconds is not None:
        if not 0 <= args.slo_seconds < float("inf"):
            raise UserError(f"--slo-seconds must be >= 0 (0: no time budget), got {args.slo_seconds:g}")
        plan = replace(plan, slo_seconds=args.slo_seconds)
    if args.slo_steps is not None:
        if args.slo_steps < 0:
            raise UserError(f"--slo-steps must be >= 0, got {args.slo_steps}")
        plan = replace(plan, slo_steps=args.slo_steps)
    if args.confidence is not None:
        if not 0.5 <= args.confidence < 1:
            raise UserError(f"--confidence must be at least 0.5 and below 1, e.g. 0.95, got {args.confidence:g}")
        plan = replace(plan, confidence=args.confidence)
    if args.search_minutes is not None:
        if not 0 <= args.search_minutes < float("inf"):
            raise UserError(f"--search-minutes must be >= 0 (0: no search), got {args.search_minutes:g}")
        plan = replace(plan, search_minutes=args.search_minutes)
    if args.traffic is not None:
        from latlab.loadtest.arrivals import parse_traffic

        plan = replace(plan, traffic=parse_traffic(args.traffic))
    if not own and args.dim:  # the zoo's requests: sizes drawn per request along their dynamic axes
        from latlab.loadtest.plan import sizes_option
        from latlab.loadtest.sizes import Sizes

        plan = replace(plan, sizes=sizes_option(args.dim))
        if Sizes.parse(plan.sizes).kind == "trace" and any(a.kind != "trace" for a in plan.traffic):
            raise UserError(
                f"--dim seq={plan.sizes} takes each request's size from the trace it replays: every --traffic "
                f"profile must be a trace (trace:FILE)"
            )
    if args.resolution is not None:
        if not 0 < args.resolution < float("inf"):
            raise UserError(f"--resolution must be a positive fraction, e.g. 0.1, got {args.resolution:g}")
        plan = replace(plan, resolution=args.resolution)
    if own:
        from latlab.lab.user import UserModel, plan_user_model

        user = UserModel(
            onnx=args.onnx,
            module=args.module,
            exported=args.exported,
            name=args.name,
            dims=tuple(args.dim),
            inputs=args.inputs,
            providers=args.providers,
            rates=args.rates,
        )
        plan = plan_user_model(plan, user, args.models_dir, share)
    from latlab.common.procs import sigterm_unwinds

    with sigterm_unwinds():  # `kill` stops the lab as Ctrl-C does: its server and generator with it
        run_lab(
            args.runs_dir,
            args.models_dir,
            plan.scaled(step_seconds=args.step_seconds),
            share,
            args.machine_name,
            prices,
            search=search_plan,
            fleet_plan=fleet_plan,
        )
