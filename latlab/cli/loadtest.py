"""`latlab loadtest`: a sweep of offered load (or an SLO search, an overload test) against deployments with
Locust; every option also read from the environment and a config file (options.py)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from latlab.common.user_input import UserError, parse_rates, parse_slo_bound, parse_slos


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
    load.add_argument("--host", help="server URL, e.g. http://127.0.0.1:8000")
    load.add_argument("--deployment", action="append", help="repeat (or comma-separate) for several")
    load.add_argument(
        "--mode",
        choices=["open", "closed"],
        default="open",
        help="open: arrivals at a rate, latency from the intended send time; closed: N users",
    )
    load.add_argument("--rates", default="100,200,400", help="open loop: offered requests/s per step")
    load.add_argument("--users", default="1,2,4,8,16", help="closed loop: concurrent users per step")
    load.add_argument("--step-seconds", type=float, default=6.0, help="measurement per step: 3 windows of a third")
    load.add_argument("--max-windows", type=int, default=6, help="extend an unstable step up to this many windows")
    load.add_argument("--warmup-seconds", type=float, default=2.0, help="load before each measurement")
    load.add_argument(
        "--calibrate-seconds",
        type=float,
        default=2.0,
        help="open loop: before the sweep, measure the generator's own floor (round trip of GET /v2/health/live "
        "at the sweep's lowest and highest rate) for this long per rate; 0: not measured",
    )
    load.add_argument(
        "--calibrate-only",
        action="store_true",
        help="measure the generator's floor at the lowest and highest of --rates, and no deployment",
    )
    load.add_argument("--constant", action="store_true", help="constant arrival gaps instead of Poisson")
    load.add_argument(
        "--binary",
        action="store_true",
        help="send tensors with the binary tensor extension (and ask for binary outputs)",
    )
    load.add_argument(
        "--seq-len",
        type=int,
        default=8,
        help="length of the model's dynamic non-batch dimensions, e.g. tokens per sequence",
    )
    load.add_argument(
        "--text",
        action="store_true",
        help="the deployments take text (a [deployments.tokenizer]): send real-looking sentences of "
        "--seq-len tokens, refuse a deployment without a text input",
    )
    load.add_argument(
        "--seq-len-max",
        type=int,
        default=0,
        help="above --seq-len: each sentence's length drawn uniformly from --seq-len..this many tokens",
    )
    load.add_argument(
        "--inputs",
        type=Path,
        metavar="FILE.npz",
        help="send these sample inputs instead of random ones: an .npz (numpy.savez) of arrays named "
        "after the model's inputs, rows on the first axis, one request per row",
    )
    load.add_argument(
        "--client",
        choices=("lean", "locust"),
        default="lean",
        help="infer requests through latlab's lean HTTP client (http:// only, about half the CPU "
        "per request) or Locust's FastHttpSession (https, or to compare)",
    )
    load.add_argument("--no-stop", action="store_true", help="keep going past saturation")
    load.add_argument(
        "--max-rate",
        type=float,
        default=0.0,
        help="open loop: past --rates keep raising the rate x1.5 per step until the deployment saturates "
        "or breaks the SLO, up to this cap (0: stop at the last listed rate); a maximum never "
        "reached is reported as '≥ N (not saturated)'",
    )
    load.add_argument(
        "--refine-within",
        type=float,
        default=0.1,
        help="with --max-rate: after a failed step, bisect until the last rate met and the first "
        "failed are within this fraction",
    )
    load.add_argument("--slo", help="p99 bound, e.g. p99=50ms: search the highest rate that meets it")
    load.add_argument("--sweep", action="store_true", help="with --slo: sweep --rates, stop when p99 > 2x the SLO")
    load.add_argument(
        "--slos",
        metavar="BOUNDS",
        help="open loop: after the sweep, find the highest rate under each of these p99 bounds (e.g. "
        "10ms,25ms,50ms) to within --resolution, below the first rate too; 'never' only when one "
        "request at a time breaks it",
    )
    load.add_argument(
        "--confidence",
        type=float,
        default=0.95,
        help="level of each step's p50/p99 intervals and SLO decisions (met, broken, undecided)",
    )
    load.add_argument(
        "--slo-steps",
        type=int,
        default=12,
        help="with --slos: at most this many extra steps per deployment for the SLO brackets",
    )
    load.add_argument(
        "--slo-seconds",
        type=float,
        default=0.0,
        help="with --slos: no bracket step starts after this many seconds of them per deployment "
        "(0: no time budget; a low rate's step takes ten times a high rate's)",
    )
    load.add_argument(
        "--decide-windows",
        type=int,
        default=6,
        help="with --slos: extend a step whose p99 is undecided for one of them by up to this many windows (0: never)",
    )
    load.add_argument(
        "--resolution",
        type=float,
        default=0.1,
        help="--slo search and --slos: the bracket's width as a fraction of the rate met (0.1)",
    )
    load.add_argument(
        "--slo-floor",
        type=float,
        default=1.0,
        help="--slo search: halve the rate no further than this (req/s); below it the deployment meets the bound "
        "at no rate (1)",
    )
    load.add_argument(
        "--slo-growth",
        type=float,
        default=2.0,
        help="--slo search: raise a rate that met the bound by this factor until it breaks (2); a start near the "
        "edge takes less, so no step overloads the server far past it",
    )
    load.add_argument("--workers", type=int, default=0, help="Locust distributed: local worker processes")
    load.add_argument("--expect-workers", type=int, default=0, help="Locust distributed: wait for remote workers")
    load.add_argument("--master-bind-host", default="127.0.0.1", help="where remote workers connect")
    load.add_argument("--master-port", type=int, default=5557)
    load.add_argument("--metrics-port", type=int, help="expose the generator's Prometheus /metrics here")
    load.add_argument(
        "--server-metrics",
        metavar="URL",
        default="",
        help="where the server exports its own figures, e.g. Triton's http://HOST:8002/metrics: its "
        "nv_inference_* counters (queue, compute, batch sizes) feed the report's 'where the time "
        "goes' (default: the server's /metrics, latlab's observer port when it has one; none "
        "there: the report shows the client side only)",
    )
    load.add_argument(
        "--provider",
        metavar="NAME",
        default="",
        help="what the deployments compute on (cpu, cuda, ...), recorded for a server that does not say "
        "(Triton without a model config telling, MLServer, KServe): the report then counts them as "
        "CPU or GPU deployments (default: provider unknown, neither); latlab's own server says",
    )
    load.add_argument(
        "--overload",
        type=float,
        metavar="FACTOR",
        help="overload test instead of a sweep: offer FACTOR x the capacity for --burst-seconds, "
        "then report the 503s, queue depth, timeouts and the time to recover",
    )
    load.add_argument("--burst-seconds", type=float, default=60.0, help="--overload: how long the burst lasts")
    load.add_argument(
        "--capacity",
        type=float,
        metavar="RPS",
        help="--overload: the capacity (default: measured, doubling from --rates' first value "
        "until the server saturates)",
    )
    load.add_argument(
        "--recovery-load",
        type=float,
        default=0.6,
        metavar="FRACTION",
        help="--overload: the load before and after the burst, as a fraction of the capacity",
    )
    load.add_argument("--out", type=Path, help="run folder (default: runs/<timestamp>)")
    load.add_argument("--run-id", help="run label in results and metrics (default: the run folder's name)")
    load.add_argument("--machine-name", help="what reports call this machine (default: its CPU model, or the GPU)")
    load.set_defaults(func=cmd_loadtest)


def _require_text(host: str, deployments: list[str]) -> None:
    """--text: every deployment must take sentences; one readable line otherwise, before any load is sent."""
    import requests

    from latlab.loadtest.payloads import require_text
    from latlab.loadtest.scrape import fetch

    for deployment in deployments:
        try:
            response = fetch(host, f"/v2/models/{deployment}")
            response.raise_for_status()
            require_text(response.json())
        except (requests.RequestException, ValueError) as exc:
            raise UserError(f"--text: deployment '{deployment}': {exc}") from None


def _require_samples(host: str, deployments: list[str], path: Path) -> str:
    """--inputs: the sample file must fit every deployment's inputs; one readable line otherwise, before any load
    is sent. Returns its absolute path (the generator's processes may run elsewhere in the file system)."""
    import requests

    from latlab.loadtest.payloads import check_samples, load_samples
    from latlab.loadtest.scrape import fetch

    try:
        samples = load_samples(path)
    except ValueError as exc:
        raise UserError(f"--inputs: {exc}") from None
    for deployment in deployments:
        try:
            response = fetch(host, f"/v2/models/{deployment}")
            response.raise_for_status()
            check_samples(response.json(), samples)
        except (requests.RequestException, ValueError) as exc:
            raise UserError(f"--inputs {path}: deployment '{deployment}': {exc}") from None
    return str(path.resolve())


def cmd_loadtest(args: argparse.Namespace) -> None:
    from latlab.loadtest.sweep import run_sweep  # first: Locust patches sockets

    from latlab.common import procs
    from latlab.loadtest.plan import SweepPlan
    from latlab.loadtest.results import RESULTS_FILE, new_run_id

    if not args.host or not (args.deployment or args.calibrate_only):
        raise UserError("loadtest needs --host and at least one --deployment")
    if args.calibrate_only and (args.mode != "open" or args.calibrate_seconds <= 0):
        raise UserError("--calibrate-only measures open-loop arrivals for --calibrate-seconds > 0")
    if args.seq_len < 1:
        raise UserError(f"--seq-len must be >= 1, got {args.seq_len}")
    if args.text and args.seq_len < 3:
        raise UserError(
            f"--text: a sentence needs at least 3 tokens ([CLS], a word, [SEP]), got --seq-len {args.seq_len}"
        )
    if not 0 < args.slo_floor < float("inf"):
        raise UserError(f"--slo-floor must be a positive rate in req/s, got {args.slo_floor:g}")
    if not 1 < args.slo_growth <= 16:
        raise UserError(f"--slo-growth must be above 1 and at most 16, got {args.slo_growth:g}")
    if args.seq_len_max and args.seq_len_max < args.seq_len:
        raise UserError(f"--seq-len-max ({args.seq_len_max}) must be at least --seq-len ({args.seq_len})")
    if args.inputs is not None and args.text:
        raise UserError("--inputs and --text do not combine: a sample file holds tensors, --text sends sentences")
    out = args.out or Path("runs") / new_run_id()
    loads = parse_rates(args.rates) if args.mode == "open" else [float(int(u)) for u in parse_rates(args.users)]
    slo = parse_slo_bound(args.slo) if args.slo else None
    if args.overload is not None and (
        args.overload <= 0
        or args.mode != "open"
        or slo
        or args.burst_seconds <= 0
        or (args.capacity is not None and args.capacity <= 0)
        or not 0 < args.recovery_load < 1
    ):
        raise UserError(
            "--overload needs a positive factor, open-loop mode, no --slo, positive --burst-seconds "
            "and --capacity, and --recovery-load between 0 and 1"
        )
    if not 0 < args.refine_within < float("inf"):
        raise UserError(f"--refine-within must be a positive fraction, got {args.refine_within:g}")
    if not 0 < args.resolution < float("inf"):
        raise UserError(f"--resolution must be a positive fraction, e.g. 0.1, got {args.resolution:g}")
    slos = tuple(sorted(parse_slos(args.slos))) if args.slos else ()
    if not 0.5 <= args.confidence < 1:
        raise UserError(f"--confidence must be at least 0.5 and below 1, e.g. 0.95, got {args.confidence:g}")
    if slos and args.mode != "open":
        raise UserError("--slos brackets offered rates: it needs --mode open")
    if not 0 <= args.max_rate < float("inf"):
        raise UserError(
            f"--max-rate must be a finite rate >= 0 (0: stop at the last of --rates), got {args.max_rate:g}"
        )
    if args.server_metrics and not args.server_metrics.startswith(("http://", "https://")):
        raise UserError(f"--server-metrics must be an http:// or https:// URL, got {args.server_metrics!r}")
    if args.provider and not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", args.provider.strip()):
        raise UserError(f"--provider names what the deployments compute on, e.g. cpu or cuda, got {args.provider!r}")
    plan = SweepPlan(
        host=args.host,
        deployments=[d for item in args.deployment or [] for d in item.split(",") if d],
        loads=loads,
        mode=args.mode,
        warmup_seconds=args.warmup_seconds,
        calibrate_seconds=max(0.0, args.calibrate_seconds),
        window_seconds=args.step_seconds / 3,
        max_windows=max(3, args.max_windows),
        poisson=not args.constant,
        binary=args.binary,
        seq_len=args.seq_len,
        client=args.client,
        text=args.text,
        seq_len_max=args.seq_len_max,
        stop_at_saturation=not args.no_stop,
        max_rate=args.max_rate,
        refine_within=args.refine_within,
        slo_p99_s=slo,
        slos_s=slos,
        resolution=args.resolution,
        confidence=args.confidence,
        decide_windows=max(0, args.decide_windows),
        max_slo_steps=max(0, args.slo_steps),
        max_slo_seconds=max(0.0, args.slo_seconds),
        machine_name=args.machine_name,
        search=bool(slo) and not args.sweep and args.mode == "open",
        search_resolution=args.resolution,
        search_floor=args.slo_floor,
        search_growth=args.slo_growth,
        workers=args.workers,
        expect_workers=args.expect_workers,
        master_bind_host=args.master_bind_host,
        master_port=procs.free_port() if args.workers and args.master_port == 5557 else args.master_port,
        metrics_port=args.metrics_port,
        log_dir=out,
        server_metrics=args.server_metrics or "",
        provider=(args.provider or "").strip().lower(),
    )
    if args.text:
        _require_text(args.host, plan.deployments)
    if args.inputs is not None:
        plan.inputs = _require_samples(args.host, plan.deployments, args.inputs)
    run_one = None
    if args.overload is not None:
        from latlab.loadtest.overload import OverloadPlan
        from latlab.loadtest.sweep import overload_runner

        run_one = overload_runner(
            OverloadPlan(
                factor=args.overload,
                burst_seconds=args.burst_seconds,
                capacity_rps=args.capacity,
                recovery_load=args.recovery_load,
            )
        )
    out.mkdir(parents=True, exist_ok=True)  # only now: a refused run leaves no folder behind
    run_sweep(plan, out / RESULTS_FILE, run_id=args.run_id or out.name, run_one=run_one)
    print(f"results: {out / RESULTS_FILE}")
