"""The `latlab` command: export, bench, serve, loadtest, report, lab, doctor.

Heavy imports happen inside each subcommand: `serve` must not load torch, `loadtest` must import
Locust (which monkey-patches sockets) before anything else.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from latlab.cli_options import UserError, apply_env_and_file, new_run_id, parse_rates, parse_slo_bound, parse_slos


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
    _add_export(sub)
    _add_serve(sub)
    _add_loadtest(sub)
    _add_report(sub)
    _add_lab(sub)
    _add_bench(sub)
    _add_doctor(sub)
    from latlab.tune_cli import add_parser as add_tune  # light: no torch or server at parse time

    add_tune(sub)
    return parser


def _add_export(sub: argparse._SubParsersAction) -> None:
    """`latlab export`: zoo models and your own."""
    export = sub.add_parser(
        "export",
        help="export a zoo model (or your own) to models/<name>/model.onnx",
        epilog="Your own model: --module package.module:factory --name NAME (the factory returns "
        "(nn.Module, {input name: example tensor, batch first}[, output names])), or "
        "--onnx FILE --name NAME to adopt an existing ONNX file.",
    )
    export.add_argument("model", nargs="?", choices=["mlp", "ffn", "rnn", "cnn", "minilm"])
    export.add_argument("--name", help="folder name under --models-dir (default: the model's)")
    export.add_argument("--models-dir", type=Path, default=Path("models"))
    export.add_argument("--module", metavar="PKG.MOD:FACTORY", help="export your own PyTorch module")
    export.add_argument("--onnx", type=Path, metavar="FILE", help="adopt an existing ONNX file")
    export.add_argument(
        "--allow-fixed-batch",
        action="store_true",
        help="--onnx: adopt a model whose first axis is fixed (serve it with max_batch_size 1)",
    )
    export.add_argument("--fp16", action="store_true", help="also write an fp16 variant to models/<name>-fp16/ (GPU)")
    export.add_argument("--int8", action="store_true", help="also write an int8 variant to models/<name>-int8/ (CPU)")
    export.add_argument(
        "--min-accuracy",
        type=float,
        metavar="X",
        help="the least a variant may keep against FP32, 0 to 1 (default: minilm 0.98 min embedding "
        "cosine, cnn 0.95 top-1 agreement, others 0.98 = 1 - max relative error); a variant "
        "below it is not written (docs/variants.md)",
    )
    export.add_argument(
        "--external-data-threshold",
        type=int,
        default=2 * 1024**3,
        metavar="BYTES",
        help="weights above this size go to model.onnx.data (default 2 GiB, protobuf's limit)",
    )
    export.add_argument("--d-model", type=int, default=128, help="ffn: width")
    export.add_argument("--n-layers", type=int, default=128, help="ffn: residual blocks")
    export.add_argument("--in-features", type=int, help="mlp: input features (4)")
    export.add_argument("--hidden", type=int, help="mlp: hidden units (100); rnn: hidden size (128)")
    export.add_argument("--out-features", type=int, help="mlp: outputs (1); rnn: projected outputs (8)")
    export.add_argument("--cell", choices=["lstm", "gru"], help="rnn: cell (lstm)")
    export.add_argument("--input-size", type=int, help="rnn: features per step (32)")
    export.add_argument("--rnn-layers", type=int, help="rnn: stacked layers (2)")
    export.add_argument(
        "--seq-len", type=int, help="rnn, minilm: the example's sequence length (32, 16); the axis is dynamic"
    )
    export.add_argument("--image-size", type=int, help="cnn: image height and width (224)")
    export.add_argument("--width", type=int, help="cnn: first stage's channels (64)")
    export.add_argument("--classes", type=int, help="cnn: classes (1000)")
    export.set_defaults(func=cmd_export)


def _add_serve(sub: argparse._SubParsersAction) -> None:
    """`latlab serve`."""
    serve = sub.add_parser("serve", help="serve the deployments of a TOML config over HTTP")
    serve.add_argument("--config", type=Path, required=True)
    serve.add_argument("--host", help="override [server] host")
    serve.add_argument("--port", type=int, help="override [server] port")
    serve.add_argument(
        "--metrics-port",
        type=int,
        help="override [server] metrics_port: /metrics and health on their own port (default port + 1)",
    )
    serve.add_argument(
        "--frontends",
        type=int,
        help="override [server] frontends: HTTP processes feeding one engine process (default 1: "
        "one process does everything)",
    )
    serve.set_defaults(func=cmd_serve)


def _add_loadtest(sub: argparse._SubParsersAction) -> None:
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


def _add_report(sub: argparse._SubParsersAction) -> None:
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
    report.set_defaults(func=cmd_report)


def _add_lab(sub: argparse._SubParsersAction) -> None:
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
        "--price",
        metavar="PROVIDER=USD",
        help="hourly price per provider, e.g. cpu=0.10,cuda=2.50 or "
        "cpu=0.04/core (default: example prices, labelled as such in the report)",
    )
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
        help="size of a dynamic axis other than the batch, e.g. --dim seq=128 (an unnamed axis: "
        "--dim INPUT:AXIS=SIZE); repeat for several",
    )
    own.add_argument("--providers", help="e.g. cpu,cuda (default: every provider that loads on this machine)")
    own.add_argument(
        "--rates",
        help="offered loads in req/s, e.g. 50,200,800 (default: from the model's measured "
        "batch-1 time; the sweep goes on past the last until saturation)",
    )
    lab.set_defaults(func=cmd_lab)


def _add_bench(sub: argparse._SubParsersAction) -> None:
    """`latlab bench`."""
    bench = sub.add_parser("bench", help="in-process microbenchmarks of seed 003: batch, width, depth, fixed params")
    from latlab.bench_cli import add_arguments as add_bench_arguments  # light: no torch at parse time

    add_bench_arguments(bench)
    bench.set_defaults(func=cmd_bench)


def _add_doctor(sub: argparse._SubParsersAction) -> None:
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


def cmd_export(args: argparse.Namespace) -> None:
    from latlab.export.command import run_export
    from latlab.export.onnx_export import ExportError

    try:
        run_export(args)
    except ExportError as exc:
        raise UserError(str(exc)) from None


def cmd_serve(args: argparse.Namespace) -> None:
    from latlab.server.wsgi import serve

    serve(args.config, args.host, args.port, args.metrics_port, args.frontends)


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
    from latlab.loadtest.sweep import SweepPlan, run_sweep  # first: Locust patches sockets

    from latlab.common import procs
    from latlab.loadtest.results import RESULTS_FILE

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


def cmd_report(args: argparse.Namespace) -> None:
    from latlab.report.write import write_report
    from latlab.report.verdict import PriceError, parse_prices

    slos = parse_slos(args.slo)
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
    path = write_report(args.run_dirs, slos, prices=prices, out=args.out, with_reference=args.with_reference)
    print(f"report: {path}")


def cmd_lab(args: argparse.Namespace) -> None:
    """Every option is checked, and the user's model loaded and run once per provider, before the lab makes
    its run folder: a refused lab leaves nothing behind."""
    from dataclasses import replace

    from latlab.lab import run_lab
    from latlab.lab_plan import PLANS, available_cores, cpu_share
    from latlab.report.verdict import PriceError, parse_prices

    own = args.onnx is not None or args.module is not None or args.exported is not None
    if not own and any(v for v in (args.name, args.inputs, args.dim, args.providers, args.rates)):
        raise UserError(
            "--name, --inputs, --dim, --providers and --rates are for your own model: "
            "give --onnx FILE, --module PKG.MOD:FACTORY or --model NAME"
        )
    if own and args.models:
        raise UserError("--models picks the plan's zoo models; your own model (--onnx, --module, --model) runs alone")
    try:
        share = cpu_share(available_cores(), args.cpu_threads, args.load_workers)
        plan = PLANS[args.plan].only(args.models.split(",") if args.models else None)
        prices = parse_prices(args.price) if args.price is not None else None
    except (ValueError, PriceError) as exc:
        raise UserError(str(exc)) from None
    if args.slo is not None:
        parse_slos(args.slo)  # refuses a bad bound here, before any work
        plan = replace(plan, slos=args.slo)
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
    if args.resolution is not None:
        if not 0 < args.resolution < float("inf"):
            raise UserError(f"--resolution must be a positive fraction, e.g. 0.1, got {args.resolution:g}")
        plan = replace(plan, resolution=args.resolution)
    if own:
        from latlab.lab_user import UserModel, plan_user_model

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
        )


def cmd_doctor(args: argparse.Namespace) -> None:
    from latlab.doctor import report

    print(report(generator=not args.no_generator, host=args.host))


def cmd_bench(args: argparse.Namespace) -> None:
    from latlab.bench import BenchError
    from latlab.bench_cli import run

    try:
        run(args)
    except BenchError as exc:
        raise UserError(str(exc)) from None


if __name__ == "__main__":
    sys.exit(main())
