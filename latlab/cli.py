"""The `latlab` command: export, serve, loadtest, report, lab, doctor.

Heavy imports happen inside each subcommand: `serve` must not load torch, `loadtest` must import
Locust (which monkey-patches sockets) before anything else.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


class UserError(Exception):
    """A mistake the user can fix; printed as one line, exit status 2."""


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except KeyboardInterrupt:
        print("latlab: interrupted", file=sys.stderr)
        return 130
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

    export = sub.add_parser("export", help="export a zoo model to models/<name>/model.onnx")
    export.add_argument("model", choices=["mlp", "ffn"])
    export.add_argument("--name", help="folder name under --models-dir (default: the model's)")
    export.add_argument("--models-dir", type=Path, default=Path("models"))
    export.add_argument("--d-model", type=int, default=128, help="ffn: width")
    export.add_argument("--n-layers", type=int, default=128, help="ffn: residual blocks")
    export.add_argument("--in-features", type=int, default=4, help="mlp: input features")
    export.add_argument("--hidden", type=int, default=100, help="mlp: hidden units")
    export.add_argument("--out-features", type=int, default=1, help="mlp: outputs")
    export.set_defaults(func=cmd_export)

    serve = sub.add_parser("serve", help="serve the deployments of a TOML config over HTTP")
    serve.add_argument("--config", type=Path, required=True)
    serve.add_argument("--host", help="override [server] host")
    serve.add_argument("--port", type=int, help="override [server] port")
    serve.set_defaults(func=cmd_serve)

    load = sub.add_parser("loadtest", help="sweep offered load against deployments with Locust")
    load.add_argument("--host", required=True, help="server URL, e.g. http://127.0.0.1:8000")
    load.add_argument("--deployment", action="append", required=True, help="repeat for several")
    load.add_argument("--rates", default="100,200,400", help="offered requests/s per step, comma-separated")
    load.add_argument("--step-seconds", type=float, default=10.0, help="measurement window per step")
    load.add_argument("--warmup-seconds", type=float, default=2.0, help="load before each window")
    load.add_argument("--constant", action="store_true", help="constant arrival gaps instead of Poisson")
    load.add_argument("--no-stop", action="store_true", help="keep going past saturation")
    load.add_argument("--out", type=Path, help="run folder (default: runs/<timestamp>)")
    load.set_defaults(func=cmd_loadtest)

    report = sub.add_parser("report", help="write the HTML report of a run folder")
    report.add_argument("run_dir", type=Path)
    report.add_argument("--slo", default="25ms,50ms,100ms", help="p99 bounds, e.g. 25ms,50ms,0.1s")
    report.set_defaults(func=cmd_report)

    lab = sub.add_parser("lab", help="the main job: export, serve, sweep and report on the built-in CPU plan")
    lab.add_argument("--runs-dir", type=Path, default=Path("runs"))
    lab.add_argument("--models-dir", type=Path, default=Path("models"))
    lab.add_argument("--step-seconds", type=float, default=None, help="override the plan's window")
    lab.set_defaults(func=cmd_lab)

    doctor = sub.add_parser("doctor", help="what this machine offers: CPU, GPU, ONNX Runtime providers")
    doctor.set_defaults(func=cmd_doctor)
    return parser


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def parse_rates(text: str) -> list[float]:
    try:
        rates = [float(r) for r in text.split(",") if r.strip()]
    except ValueError:
        raise UserError(f"--rates must be numbers separated by commas, got {text!r}") from None
    if not rates or not all(0 < r < float("inf") for r in rates):
        raise UserError(f"--rates must be positive finite numbers, got {text!r}")
    return rates


def parse_slos(text: str) -> list[float]:
    """'25ms,0.1s,50' -> seconds (a bare number is milliseconds)."""
    slos = []
    for part in (p.strip().lower() for p in text.split(",") if p.strip()):
        scale, number = (1.0, part[:-1]) if part.endswith("s") and not part.endswith("ms") else (1e-3, part.removesuffix("ms"))
        try:
            value = float(number) * scale
        except ValueError:
            value = float("nan")
        if not 0 < value < float("inf"):
            raise UserError(f"--slo: cannot read {part!r}; write positive bounds, e.g. 25ms or 0.1s")
        slos.append(value)
    if not slos:
        raise UserError("--slo needs at least one bound, e.g. 25ms,50ms")
    return slos


def cmd_export(args: argparse.Namespace) -> None:
    from latlab.export.onnx_export import export
    from latlab.export.zoo import build_ffn, build_mlp

    if args.model == "ffn":
        zoo = build_ffn(args.d_model, args.n_layers)
    else:
        zoo = build_mlp(args.in_features, args.hidden, args.out_features)
    name = args.name or args.model
    started = time.perf_counter()
    meta = export(name, zoo, args.models_dir, source=f"latlab zoo: {args.model}({zoo.config})")
    parity = meta["parity"]
    print(f"exported {name}: {args.models_dir / name / 'model.onnx'}  params {meta['params']:,}  "
          f"FLOPs/sample {meta['flops_per_sample']:,}  opset {meta['opset']}  "
          f"({time.perf_counter() - started:.1f} s)")
    print(f"parity vs PyTorch at batch {parity['batches']}: max abs error {parity['max_abs_error']:.3e}, "
          f"max rel error {parity['max_rel_error']:.3e} (tolerance {parity['tolerance_rel']:.0e})")


def cmd_serve(args: argparse.Namespace) -> None:
    from latlab.server.wsgi import serve

    serve(args.config, args.host, args.port)


def cmd_loadtest(args: argparse.Namespace) -> None:
    from latlab.loadtest.sweep import SweepPlan, run_sweep  # first: Locust patches sockets

    from latlab.loadtest.results import RESULTS_FILE

    out = args.out or Path("runs") / new_run_id()
    plan = SweepPlan(host=args.host, deployments=args.deployment, rates=parse_rates(args.rates),
                     step_seconds=args.step_seconds, warmup_seconds=args.warmup_seconds,
                     poisson=not args.constant, stop_at_saturation=not args.no_stop)
    run_sweep(plan, out / RESULTS_FILE, run_id=out.name)
    print(f"results: {out / RESULTS_FILE}")


def cmd_report(args: argparse.Namespace) -> None:
    from latlab.loadtest.report import write_report

    path = write_report(args.run_dir, parse_slos(args.slo))
    print(f"report: {path}")


def cmd_lab(args: argparse.Namespace) -> None:
    from latlab.lab import run_lab

    run_lab(args.runs_dir, args.models_dir, step_seconds=args.step_seconds)


def cmd_doctor(args: argparse.Namespace) -> None:
    from latlab.doctor import report

    print(report())


if __name__ == "__main__":
    sys.exit(main())
