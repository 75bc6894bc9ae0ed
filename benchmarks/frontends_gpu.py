"""How many front-end processes the served minilm needs to keep up with a GPU: the rate each layout serves under
each p99 bound, one front-end count after another in one run, on this machine.

    .venv/bin/python benchmarks/frontends_gpu.py [--provider cuda] [--frontends 1,native,2n,4n,8n] [--slos 25ms,50ms]
                                                 [--rates 500,1000,2000,4000] [--max-rate 20000] [--step-seconds 2]
                                                 [--models-dir models/bench] [--out runs/frontends-gpu.json]
    .venv/bin/python benchmarks/frontends_gpu.py --provider cpu --quick --out /tmp/fe-gpu.json   # CPU rehearsal

One deployment, minilm-<provider>-batch (max_batch_size 32, max_queue_delay_ms 3), fed token ids of --seq-len
tokens. Per front-end count N, in order: 1 is today's one-process server (frontends = 1, no engine process); N >= 2
is N front ends (Granian workers) feeding one separate engine process, where ORT and the GPU live; "native" is
one process under the native interface ([server] interface = "native": no thread per request), and "Nn" N native
front-end processes feeding the engine (the same interface with frontends = N). Each layout gets
its own server, and `latlab loadtest --slos` sweeps --rates (then on x1.5 a step up to --max-rate) and brackets the
highest rate that meets each p99 bound to 20%. Recorded per count: each bound's bracket (highest rate met, lowest
broken), the steps, whether the load generator was the bottleneck at any step, and the server processes' CPU
seconds per request answered (all, front ends, engine). --out is rewritten after every count, so a run stopped
midway keeps what it measured; the end prints each count's rate over the one-process rate. With --provider cuda the
script refuses to start where CUDA does not load (ORT would fall back to the CPU silently). --quick is a short CPU
rehearsal of the same code: layouts 1,native,2n, rates 20,50,100, 1 s steps, fewer bracket steps; its figures measure
nothing about a GPU."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Iterator

import onnxruntime as ort
import psutil

from frontends import mean_request_s, server_cpu, start
from harness import build_cheap_model, export_zoo, loadtest

from latlab.common import procs
from latlab.server.config import save_config
from latlab.bench.backends import BackendUnavailable, gpu_name, ort_cuda_session

BATCHER = {"max_batch_size": 32, "max_queue_delay_ms": 3.0}


def cuda_problem() -> str | None:
    """Why a CUDA session cannot be built here (None: one was, on CUDA, not fallen back to the CPU)."""
    with tempfile.TemporaryDirectory() as folder:
        model = build_cheap_model(Path(folder) / "identity.onnx", [4], reduce=False)
        try:
            ort_cuda_session(model, 1)
        except BackendUnavailable as exc:
            return str(exc)
    return None


def machine(provider: str, cuda: str | None) -> dict:
    return {
        "cpu_count": psutil.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "load_average": os.getloadavg(),
        "provider": provider,
        "onnxruntime": ort.__version__,
        "available_providers": ort.get_available_providers(),
        "cuda_loaded": cuda is None,
        "cuda_problem": cuda,
        "gpu": gpu_name(),
    }


def write_config(path: Path, port: int, name: str, model: Path, provider: str, interface: str = "wsgi") -> Path:
    """The one deployment on `provider` (harness.write_config names none and pins the CPU's threads)."""
    deployment = {"name": name, "model_path": model, "provider": provider, "batcher": BATCHER}
    if provider == "cpu":
        deployment["cpu"] = {"intra_op_threads": 1, "allow_spinning": False}
    server = {"port": port, "max_body_bytes": 67108864, "interface": interface}
    return save_config({"server": server, "deployments": [deployment]}, path)


def layout(label: str) -> tuple[int, str]:
    """A --frontends entry as (front ends, interface): a count serves WSGI ("2": Granian's workers); "native" is
    one native process; a count and n ("4n") that many native front-end processes feeding the engine."""
    if label == "native":
        return 1, "native"
    if label.endswith("n"):
        return int(label[:-1]), "native"
    return int(label), "wsgi"


def valid_layout(label: str) -> bool:
    count = label[:-1] if label.endswith("n") and label != "native" else label
    return label == "native" or (count.isdigit() and int(count) >= 1)


@contextlib.contextmanager
def serving(folder: Path, label: str, name: str, model: Path, provider: str) -> Iterator[tuple[str, int]]:
    """frontends.layout_serving with our config: the server ready, (its URL, its pid); stopped on leaving."""
    frontends, interface = layout(label)
    port = procs.free_port()
    config = write_config(folder / f"fe{label}.toml", port, name, model, provider, interface)
    log = folder / f"fe{label}.log"
    process = start(config, log, frontends, frontends > 1)
    url = f"http://127.0.0.1:{port}"
    try:
        procs.wait_ready(f"{url}/v2/health/ready", process, timeout_s=300, log_path=log)
        yield url, process.pid
    finally:
        procs.stop(process)


def loadtest_options(args: argparse.Namespace) -> list[str]:
    slo_steps, decide = ("3", "2") if args.quick else ("6", "6")
    return [
        *("--rates", args.rates, "--max-rate", f"{args.max_rate:g}", "--slos", args.slos),
        *("--seq-len", str(args.seq_len), "--step-seconds", f"{args.step_seconds:g}", "--warmup-seconds", "0.5"),
        *("--resolution", "0.2", "--slo-steps", slo_steps, "--decide-windows", decide, "--max-windows", "4"),
    ]


def slo_label(bracket: dict) -> str:
    return f"{bracket['slo_p99_s'] * 1e3:g}ms"


def measure(folder: Path, label: str, name: str, model: Path, args: argparse.Namespace) -> dict:
    """One layout: its server, one loadtest with SLO brackets, the server's CPU per request answered."""
    frontends, interface = layout(label)
    with serving(folder, label, name, model, args.provider) as (url, pid):
        cpu_before, count_before = server_cpu(pid), mean_request_s(url, name)[1]
        (curve,) = loadtest(url, [name], folder / f"fe{label}-loadtest", *loadtest_options(args))
        cpu_after, answered = server_cpu(pid), mean_request_s(url, name)[1] - count_before
    steps = [
        {
            "target_rps": s.target_rps,
            "achieved_rps": s.achieved_rps,
            "p99_ms": s.p99_s * 1e3 if s.p99_s is not None else None,
            "errors": s.errors,
            "avg_batch_size": s.avg_batch_size,
            "generator_bound": s.generator_bound,
        }
        for s in curve.steps
    ]
    return {
        "layout": label,
        "frontends": frontends,
        "interface": interface,
        "engine_process": frontends > 1,
        "brackets": {slo_label(b): b for b in curve.slo_brackets},
        "steps": steps,
        "generator_bound": any(s["generator_bound"] for s in steps),
        "answered": answered,
        "server_cpu_us_per_request": {k: (cpu_after[k] - cpu_before[k]) / max(answered, 1) * 1e6 for k in cpu_after},
    }


def bracket_text(label: str, bracket: dict) -> str:
    met, broke = bracket["met_rps"], bracket["broke_rps"]
    if met is None:
        return f"p99<={label} not met ({bracket['meaning']})"
    if broke is None:
        return f"p99<={label} met at {met:.0f} req/s (never broken: {bracket['meaning']})"
    return f"p99<={label} met at {met:.0f} req/s (broken at {broke:.0f})"


def describe(row: dict) -> str:
    count = row["frontends"]
    who = "1 front end (one process)" if count == 1 else f"{count} front ends + engine"
    if row.get("layout") == "native":
        who = "one process, native interface"
    elif row.get("interface") == "native" or str(row.get("layout", "")).endswith("n"):
        who = f"{count} native front ends + engine"
    if "error" in row:
        return f"{who}: failed: {row['error'].splitlines()[0]} (logs in the work folder)"
    parts = [bracket_text(label, bracket) for label, bracket in row["brackets"].items()]
    cpu = row["server_cpu_us_per_request"]
    note = "; load generator bound at some step" if row["generator_bound"] else ""
    return f"{who}: {'; '.join(parts)}; server CPU {cpu['all']:.0f} us/request answered{note}"


def ratios(rows: list[dict]) -> dict[str, dict[str, float | None]]:
    """Each layout's rate met over the one-process WSGI rate, per bound (None where either is missing)."""
    base = next((r for r in rows if r.get("layout", str(r["frontends"])) == "1" and "error" not in r), None)
    if base is None:
        return {}
    found: dict[str, dict[str, float | None]] = {}
    for row in (r for r in rows if "error" not in r):
        found[row.get("layout", str(row["frontends"]))] = {
            label: (b["met_rps"] / base["brackets"][label]["met_rps"])
            if b["met_rps"] and (base["brackets"].get(label) or {}).get("met_rps")
            else None
            for label, b in row["brackets"].items()
        }
    return found


def save(out: Path, record: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(out.suffix + ".partial")
    partial.write_text(json.dumps(record, indent=2, default=str))
    partial.replace(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--provider", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument(
        "--frontends",
        help="layouts in order: counts (WSGI), native (one process), or counts with n (native front ends: 2n); "
        "default 1,native,2n,4n,8n; --quick 1,native,2n",
    )
    parser.add_argument("--slos", default="25ms,50ms", help="p99 bounds to bracket")
    parser.add_argument("--rates", help="starting rates (default 500,1000,2000,4000; --quick 20,50,100)")
    parser.add_argument(
        "--max-rate", type=float, help="past --rates, raise x1.5 up to this (default 20000; --quick 400)"
    )
    parser.add_argument("--step-seconds", type=float, help="per step (default 2; --quick 1)")
    parser.add_argument("--seq-len", type=int, default=16, help="tokens per request")
    parser.add_argument("--models-dir", type=Path, default=Path("models/bench"))
    parser.add_argument("--out", type=Path, default=Path("runs/frontends-gpu.json"))
    parser.add_argument("--quick", action="store_true", help="CPU rehearsal: short, few steps")
    args = parser.parse_args(argv)
    defaults = (
        ("1,native,2n", "20,50,100", 400.0, 1.0)
        if args.quick
        else ("1,native,2n,4n,8n", "500,1000,2000,4000", 20000.0, 2.0)
    )
    for key, value in zip(("frontends", "rates", "max_rate", "step_seconds"), defaults):
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.counts = [v.strip() for v in args.frontends.split(",") if v.strip()]
    if not args.counts or not all(valid_layout(v) for v in args.counts):
        parser.error(
            f"--frontends: counts, native or counts of native front ends, e.g. 1,native,2,4n; got {args.frontends!r}"
        )
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    problem = cuda_problem()
    if problem and args.provider == "cuda":
        raise SystemExit(f"--provider cuda: CUDA does not load on this machine: {problem}")
    name = f"minilm-{args.provider}-batch"
    model = export_zoo(args.models_dir.resolve(), "minilm")
    if model is None:
        raise SystemExit("could not export minilm (see the line above)")
    folder = args.out.resolve().with_name(args.out.stem + "-work")
    folder.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("counts",)}
    record = {
        "machine": machine(args.provider, problem),
        "settings": {**settings, "deployment": name, "batcher": BATCHER, "loadtest": loadtest_options(args)},
        "work_dir": str(folder),
        "results": [],
        "ratios": {},
        "complete": False,
    }
    print(f"{name}, {args.seq_len} tokens, bounds {args.slos}; machine {record['machine']}", flush=True)
    for count in args.counts:
        started = time.monotonic()
        try:
            row = measure(folder, count, name, model, args)
        except Exception as exc:  # a layout that fails (e.g. does not start) is recorded; the next one still runs
            row = {"layout": count, "frontends": layout(count)[0], "error": str(exc).strip() or repr(exc)}
        row["seconds"] = time.monotonic() - started
        record["results"].append(row)
        record["ratios"] = ratios(record["results"])
        save(args.out, record)
        print(describe(row), flush=True)
    record["complete"] = True
    save(args.out, record)
    print_ratios(record["ratios"])
    print(f"wrote {args.out}")
    if any("error" in row for row in record["results"]):
        raise SystemExit(1)


def print_ratios(found: dict[str, dict[str, float | None]]) -> None:
    if not found:
        print("no one-process rate to compare with")
    for count, by_slo in found.items():
        shown = ", ".join(f"p99<={label} {'-' if r is None else f'{r:.2f}x'}" for label, r in by_slo.items())
        who = f"{count} front end{'s' if count != '1' else ''}"
        if count == "native":
            who = "one native process"
        elif count.endswith("n"):
            who = f"{count[:-1]} native front ends"
        print(f"{who} over one WSGI process: {shown}")


if __name__ == "__main__":
    main()
