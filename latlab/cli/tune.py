"""`latlab tune`: the configuration search for one model on one provider under one SLO; prints every configuration
it measured and the best as a [[deployments]] block to paste into a serving config."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from latlab.common.user_input import UserError, parse_slo_bound

DEFAULT_MINUTES = 5.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    tune = sub.add_parser(
        "tune",
        help="search the serving settings of one model on one provider for the highest rate under an SLO",
        description="Search the serving settings of one model on one provider (variant, batching, CPU core split) "
        "for the highest rate that meets a p99 bound; print every configuration measured and the best as a "
        "[[deployments]] block to paste into a serving config.",
    )
    tune.add_argument("zoo", nargs="?", metavar="MODEL", help="a zoo model (mlp, ffn, cnn, minilm), exported if needed")
    tune.add_argument("--onnx", type=Path, metavar="FILE", help="your own ONNX file instead, served as it is")
    tune.add_argument("--model", metavar="NAME", dest="exported", help="a model exported before: --models-dir/NAME")
    tune.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="tune a deployment of this serving config (with --deployment): its model and provider, starting from "
        "its settings; the block printed keeps its other settings",
    )
    tune.add_argument(
        "--server",
        metavar="URL",
        help="tune a deployment a running latlab server serves (with --deployment), e.g. http://127.0.0.1:8000: "
        "its model file, provider and settings are read from its /config; the running server is left as it is",
    )
    tune.add_argument("--deployment", help="with --config or --server: the deployment to tune")
    tune.add_argument("--name", help="what to call your model (default: the file's name)")
    tune.add_argument("--inputs", type=Path, metavar="FILE.npz", help="real inputs to send, as `latlab lab --inputs`")
    tune.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE", help="as `latlab lab --dim`")
    tune.add_argument("--provider", default="cpu", help="cpu (default) or cuda")
    tune.add_argument("--slo", default="50ms", help="the p99 bound to rank by, e.g. 50ms (default)")
    tune.add_argument(
        "--search-minutes",
        type=float,
        default=DEFAULT_MINUTES,
        help=f"stop the search before a probe this budget cannot pay for (default {DEFAULT_MINUTES:g})",
    )
    tune.add_argument(
        "--cores",
        type=int,
        help="CPU: the ORT threads the deployment may take, split between instances and threads "
        "(default: this machine's fair share, as the lab gives its CPU deployments)",
    )
    tune.add_argument("--models-dir", type=Path, default=Path("models"))
    tune.add_argument("--out", type=Path, help="where the rounds and tune.json go (default: runs/tune-<time>)")
    tune.set_defaults(func=cmd_tune)


def cmd_tune(args: argparse.Namespace) -> int:
    from latlab.lab.plan import PLANS, available_cores, cpu_share
    from latlab.lab.run import ensure_models
    from latlab.lab.variants import variants_on_disk
    from latlab.tune.lab_search import plan_start
    from latlab.tune.run import CONFIRM_RESOLUTION, PROBE_RESOLUTION, TuneJob, best_block, run_tune
    from latlab.tune.search import space_for

    slo_s = parse_slo_bound(args.slo)
    if args.server:
        with tempfile.TemporaryDirectory() as folder:
            args.config = _config_of_server(args, Path(folder) / "served.toml")
            base, begin = _from_config(args)
    else:
        base, begin = _from_config(args) if args.config or args.deployment else ({}, None)
    if args.provider not in ("cpu", "cuda"):
        raise UserError(f"--provider {args.provider!r}: tune searches cpu or cuda")
    if not args.search_minutes > 0:
        raise UserError(f"--search-minutes must be positive, got {args.search_minutes:g}")
    share = cpu_share(available_cores(), args.cores)
    plan = _plan(args, PLANS["quick"], share)
    model = plan.models[0]
    paths = ensure_models(args.models_dir, plan)
    variants, found = variants_on_disk(args.models_dir, model.name, paths[model.name], args.provider)
    space = space_for(args.provider, share.cpu_threads, variants)
    space = space.starting_at(begin or plan_start(space, model))  # where the lab's search starts, without a config
    out = args.out or Path("runs") / f"tune-{model.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    job = TuneJob(plan, model, variants, args.provider, slo_s, out, base=base or {"model": model.name})
    print(
        f"tune {model.name} on {args.provider} at p99 <= {slo_s * 1e3:g} ms; {found}; "
        f"{len(space.all())} configurations in the space, a budget of {args.search_minutes:g} min"
        + (
            f"; instances x threads over {share.cpu_threads} core{'s' * (share.cpu_threads > 1)}"
            if args.provider == "cpu"
            else ""
        )
    )
    log = run_tune(job, space, args.search_minutes * 60, variants_first=True)
    print(f"\n{'rate under SLO':>15}  {'side by side':>12}  configuration (last round; probes)")
    for tried in log.best(len(log.tried)):
        rate = f"{tried.rate:.0f} req/s" if tried.rate else "none"
        final = f"{tried.confirmed:.0f} req/s" if tried.confirmed else ""
        print(f"{rate:>15}  {final:>12}  {tried.candidate.label()} ({tried.round}; {tried.note})")
    measured = len(log.configurations())
    print(f"\n{measured} of {len(space.all())} configurations measured in {log.seconds:.0f} s; {log.stopped}")
    (best,) = log.best()
    if not best.rate:
        print(f"no configuration met p99 <= {slo_s * 1e3:g} ms: nothing to recommend (rounds: {out})")
        return 1
    block = best_block(job, best.candidate)
    (out / "best.toml").write_text(block)
    held = (
        f"{best.confirmed:.0f} req/s side by side, to {CONFIRM_RESOLUTION:.0%}"
        if best.confirmed
        else f"{best.rate:.0f} req/s (to {PROBE_RESOLUTION:.0%})"
    )
    print(f"best: {best.candidate.label()}, {held}; paste into your config:\n")
    print(block)
    return 0


SERVED_SETTINGS = ("name", "model", "model_path", "provider", "batcher", "cpu", "cuda", "tensorrt", "padding")
"""What a deployment's /config says that a config file sets (the rest describes the running session)."""


def _config_of_server(args: argparse.Namespace, path: Path) -> Path:
    """The deployment a running server serves, written as a one-deployment config at `path` from its /config; the
    tokenizer is left out as tune sends the model's own inputs. The model file must be readable from here."""
    import urllib.error
    import urllib.parse
    import urllib.request  # here: it imports ssl, which Locust must patch first in `latlab loadtest`

    from latlab.server.config import save_config

    if args.config:
        raise UserError("--server and --config name the deployment two ways: give one")
    if not args.deployment:
        raise UserError("--server needs --deployment: the deployment to tune")
    url = args.server.rstrip("/")
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise UserError(f"--server {args.server!r}: give the server's address, e.g. http://127.0.0.1:8000")
    where = f"{url}/v2/models/{urllib.parse.quote(args.deployment, safe='')}/config"
    try:
        with urllib.request.urlopen(where, timeout=10) as response:
            served = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise UserError(f"--server: {where} answered {exc.code}: is {args.deployment!r} served there?") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise UserError(f"--server: could not read {where}: {getattr(exc, 'reason', exc)}") from None
    table = {k: served[k] for k in SERVED_SETTINGS if served.get(k) not in (None, "", {})}
    if not Path(table.get("model_path", "")).is_file():
        raise UserError(
            f"--server: the model file it serves, {table.get('model_path')!r}, is not readable on this machine; "
            "run tune where the server runs, or give --onnx"
        )
    return save_config({"deployments": [table]}, path)


def _from_config(args: argparse.Namespace):
    """The tuned deployment's table of the user's config (its model file resolved, its tokenizer left out: tune
    sends the model's own inputs), and its settings as the search's start; args.onnx and args.provider set."""
    import tomllib

    from latlab.server.config import load_config
    from latlab.tune.search import Candidate

    if not (args.config and args.deployment):
        raise UserError(
            "--deployment goes with --config or --server (the deployment to tune); --config needs --deployment"
        )
    served = {d.name: d for d in load_config(args.config).deployments}  # checked as the server would
    if args.deployment not in served:
        raise UserError(f"--deployment {args.deployment!r} is not in {args.config}; it has {', '.join(served)}")
    if args.zoo or args.onnx or args.exported:
        raise UserError("name one model: --config/--server and --deployment give it, so no MODEL, --onnx or --model")
    deployment = served[args.deployment]
    (table,) = [t for t in tomllib.loads(args.config.read_text())["deployments"] if t.get("name") == args.deployment]
    table = {k: v for k, v in table.items() if k not in ("model_path", "provider", "tokenizer")}
    args.onnx, args.provider = Path(deployment.model_path), deployment.provider
    args.name = args.name or deployment.model or None
    begin = Candidate.serving(
        "fp32",
        deployment.batcher,
        max(1, deployment.cpu.intra_op_threads) if deployment.provider == "cpu" else 1,
        deployment.cuda.enable_cuda_graph if deployment.provider != "cpu" else False,
    )
    return table, begin


def _plan(args: argparse.Namespace, quick, share):
    """The quick plan of the one model: a zoo model by name, or the user's as `latlab lab --onnx` plans it."""
    own = args.onnx is not None or args.exported is not None
    if own == (args.zoo is not None):
        raise UserError(
            "name one model: a zoo model (latlab tune ffn), --onnx FILE, --model NAME, "
            "or --config FILE --deployment NAME"
        )
    if not own:
        try:
            return replace(quick.only([args.zoo]), providers=(args.provider,), bench=False)
        except ValueError as exc:
            raise UserError(str(exc).replace("--models", "MODEL")) from None
    from latlab.lab.user import UserModel, plan_user_model

    user = UserModel(
        onnx=args.onnx,
        module=None,
        exported=args.exported,
        name=args.name,
        dims=tuple(args.dim),
        inputs=args.inputs,
        providers=args.provider,
        rates=None,
    )
    return plan_user_model(quick, user, args.models_dir, share)
