"""CPU per request of the server under batched closed-loop load, this checkout beside another version of the code in
one run: one process, and front ends + engine, split by process.

    git archive HEAD | tar -x -C /tmp/before/src      # laid out as a package: /tmp/before/pkg/latlab/{server,...}
    .venv/bin/python benchmarks/server_cpu.py --other /tmp/before/pkg [--rounds 8] [--seconds 3] [--frontends 1 2]
                                              [--interfaces wsgi rsgi] [--models-dir DIR] [--profile DIR]
                                              [--served-rate ROUNDS]

mlp (batching <= 64 / 2 ms, one ORT thread) served by both versions at once, `wrk` (16 connections, 2 threads,
a fixed JSON body) as the load: the cheapest client there is, so the CPU measured is the server's. Bursts of
--seconds alternate between the versions for --rounds rounds, so a neighbour's load lands on both. Per burst:
requests answered per second, and the CPU time of the server's processes (all; the engine; the front ends)
divided by the requests answered; then the medians, and the median of each round's ratio now / before.
--interfaces runs this checkout once per [server] interface named (with front ends, RSGI is left out: they serve
WSGI or native), each beside the others ("now-wsgi", "now-native"); without --other the first is the baseline.
--other-interface: the other version's interface (WSGI unless said).
--served-rate N then measures, N rounds, ffn-batch's served rate at p99 <= 25 ms behind each version with one process
(`latlab loadtest --slos 25ms` bracketing it to 10%, as benchmarks/frontends.py does): one version at a time, since
each load test saturates the machine, the order reversed every round.
--tokens N serves minilm-sized requests instead (N token ids and their mask as JSON, to a model of almost no work:
benchmarks/frontends.py's token_sized_model), so that the CPU measured is the server's per request of that size.
--profile writes py-spy raw profiles (collapsed stacks, `--gil`: only the thread running Python) of every process
of this checkout's server during its first burst.
"""

from __future__ import annotations

import argparse
import re
import signal
import statistics
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import orjson
import psutil

from frontends import token_sized_model
from harness import batching, export_zoo, json_infer_body, loadtest, serve_version

from latlab.common import procs
from latlab.server.config import save_config

WRK_SCRIPT = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = io.open("{body}", "rb"):read()
"""


def config(path: Path, port: int, model: Path, frontends: int, interface: str = "wsgi", name: str = "mlp") -> Path:
    cpu = {"intra_op_threads": 1, "allow_spinning": False}
    server = {"port": port, "max_body_bytes": 67108864, "frontends": frontends}
    if interface != "wsgi":  # only then: code from before the setting refuses it
        server["interface"] = interface
    return save_config(
        {
            "server": server,
            "deployments": [{"name": name, "model_path": model, "cpu": cpu, "batcher": batching(64, 2.0)}],
        },
        path,
    )


def server_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of the server's processes: all, the engine's, the front ends' (one process: all of it)."""
    root = psutil.Process(pid)
    split = {"all": 0.0, "engine": 0.0, "front ends": 0.0}
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
            line = " ".join(process.cmdline())
        except psutil.Error:
            continue
        seconds = times.user + times.system
        split["all"] += seconds
        if "latlab.server.processes.engine" in line:
            split["engine"] += seconds
        elif process.pid != root.pid:
            split["front ends"] += seconds
    return split


def wrk(url: str, script: Path, seconds: float, connections: int = 16) -> int:
    """Requests answered with 2xx in `seconds` of closed-loop load."""
    done = subprocess.run(
        ["wrk", "-t2", f"-c{connections}", f"-d{max(1, round(seconds))}s", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
    )
    total = int(re.search(r"(\d+) requests in", done.stdout).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", done.stdout)
    return total - (int(errors.group(1)) if errors else 0)


def profile(pid: int, out: Path, seconds: float) -> list[subprocess.Popen]:
    """py-spy record of every Python process of the server, for `seconds`."""
    root = psutil.Process(pid)
    spies = []
    for process in [root, *root.children(recursive=True)]:
        spies.append(
            subprocess.Popen(
                [
                    str(Path(__file__).resolve().parents[1] / ".venv/bin/py-spy"),
                    "record",
                    "--pid",
                    str(process.pid),
                    "--duration",
                    str(int(seconds)),
                    "--rate",
                    "250",
                    "--format",
                    "raw",
                    "--gil",
                    "-o",
                    str(out / f"prof-{process.pid}.txt"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    return spies


def started(folder: Path, model: Path, frontends: int, version: tuple[str | None, str], port: int) -> subprocess.Popen:
    """A server of `version` ((PYTHONPATH or None for this checkout, interface)) on `port`."""
    pythonpath, interface = version
    cfg = config(folder / f"server-{port}.toml", port, model, frontends, interface)
    return serve_version(cfg, port, folder, pythonpath)


def burst(process: subprocess.Popen, url: str, script: Path, seconds: float, spy: Path | None) -> dict:
    """One burst of load on a running server: its rate and CPU per request, by process kind."""
    before = server_cpu(process.pid)
    spies = profile(process.pid, spy, seconds) if spy else []
    answered = wrk(url, script, seconds)
    after = server_cpu(process.pid)
    for spied in spies:
        spied.wait()
    us = {k: (after[k] - before[k]) / max(answered, 1) * 1e6 for k in after}
    return {"rate": answered / seconds, **{f"{k} µs": v for k, v in us.items()}}


def alternate(
    folder: Path, model: Path, frontends: int, versions: dict, script: Path, args: argparse.Namespace
) -> dict[str, list]:
    """Both versions up at once, bursts alternating between them: a neighbour's load lands on both alike."""
    servers, results = {}, {name: [] for name in versions}
    try:
        for index, (name, version) in enumerate(versions.items()):
            port = 18600 + 100 * frontends + 10 * index  # the observer port takes the next one
            url = f"http://127.0.0.1:{port}/v2/models/mlp/infer"
            servers[name] = (started(folder, model, frontends, version, port), url)
            wrk(url, script, 1.0)  # warm: connections, batch sizes, the engine's sockets
        for round_ in range(args.rounds):
            for name in list(versions) if round_ % 2 == 0 else list(reversed(versions)):
                spy = None
                if args.profile and name.startswith("now") and round_ == 0:
                    spy = args.profile / f"frontends-{frontends}-{name}"
                    spy.mkdir(parents=True, exist_ok=True)
                got = burst(*servers[name], script, args.seconds, spy)
                results[name].append(got)
                shown = "  ".join(f"{k} {v:.0f}" for k, v in got.items())
                print(f"round {round_} frontends={frontends} {name:6s} {shown}", flush=True)
    finally:
        for process, _ in servers.values():
            process.send_signal(signal.SIGTERM)
            procs.stop(process)
    return results


def summary(frontends: int, got: dict[str, list[dict]]) -> None:
    """Each version's medians against the first version's, and the median of the per-round ratios."""
    base, *others = got
    before = got[base]
    for name in others:
        now = got[name]
        for key in now[0]:
            ratios = [n[key] / b[key] for n, b in zip(now, before) if b[key]]
            ratio = statistics.median(ratios) if ratios else float("nan")
            old, new = statistics.median(b[key] for b in before), statistics.median(n[key] for n in now)
            print(f"frontends={frontends} {key:16s} {base} {old:8.0f}  {name} {new:8.0f}  ratio {ratio:.2f}")


def versions_for(
    frontends: int, other: str | None, interfaces: list[str], other_interface: str = "wsgi"
) -> dict[str, tuple[str | None, str]]:
    """The versions to run side by side: the other code (under `other_interface`), then this checkout under each
    interface (front ends serve WSGI or native: RSGI is left out with several of them)."""
    versions: dict[str, tuple[str | None, str]] = {"before": (other, other_interface)} if other else {}
    for interface in interfaces if frontends == 1 else [i for i in interfaces if i != "rsgi"] or ["wsgi"]:
        versions["now" if len(interfaces) == 1 else f"now-{interface}"] = (None, interface)
    return versions


RATE_OPTIONS = (
    *("--rates", "250,500,1000,2000,4000,8000", "--slos", "25ms", "--resolution", "0.1", "--slo-steps", "8"),
    *("--step-seconds", "3", "--max-windows", "4", "--warmup-seconds", "1"),
)
"""benchmarks/frontends.py's served-rate load test, with lower rates to start from on a loaded machine."""


def served_rates(folder: Path, model: Path, versions: dict, rounds: int) -> dict[str, list[float]]:
    """ffn-batch's served rate at p99 <= 25 ms (the bracket's highest rate met) behind each version, one at a time."""
    found: dict[str, list[float]] = {name: [] for name in versions}
    for round_ in range(rounds):
        for name in list(versions) if round_ % 2 == 0 else list(reversed(versions)):
            port = 19100 + 10 * list(versions).index(name)
            cfg = config(folder / f"rate-{port}.toml", port, model, 1, versions[name][1], name="ffn-batch")
            process = serve_version(cfg, port, folder, versions[name][0])
            try:
                url, out = f"http://127.0.0.1:{port}", folder / f"rate-{name}-{round_}"
                (curve,) = loadtest(url, ["ffn-batch"], out, *RATE_OPTIONS)
            finally:
                process.send_signal(signal.SIGTERM)
                procs.stop(process)
            (bracket,) = curve.slo_brackets
            found[name].append(bracket["met_rps"] or 0.0)
            print(f"served rate round {round_} {name:8s} {bracket['met_rps']} req/s (broke at {bracket['broke_rps']})")
    return found


def token_body(tokens: int) -> bytes:
    """A minilm-sized infer request: `tokens` token ids and their attention mask, INT64 as JSON."""
    ids = np.random.default_rng(0).integers(0, 30000, tokens).tolist()
    inputs = [
        {"name": "input_ids", "shape": [1, tokens], "datatype": "INT64", "data": ids},
        {"name": "attention_mask", "shape": [1, tokens], "datatype": "INT64", "data": [1] * tokens},
    ]
    return orjson.dumps({"inputs": inputs})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--other", default=None, help="PYTHONPATH of the other version (the baseline)")
    parser.add_argument("--interfaces", nargs="+", choices=("wsgi", "rsgi", "native"), default=["wsgi"])
    parser.add_argument(
        "--other-interface", choices=("wsgi", "rsgi", "native"), default="wsgi", help="the other version's interface"
    )
    parser.add_argument("--models-dir", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--frontends", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--profile", type=Path, default=None, help="py-spy raw profiles of this checkout's server")
    parser.add_argument("--served-rate", type=int, default=0, metavar="ROUNDS", help="ffn-batch's rate at p99 <= 25 ms")
    parser.add_argument(
        "--tokens",
        type=int,
        default=0,
        help="minilm-sized requests (N token ids and a mask, JSON) to a model of no work",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        body = folder / "body.json"
        if args.tokens:
            model = token_sized_model(folder / "token-sized.onnx")
            body.write_bytes(token_body(args.tokens))
        else:
            model = export_zoo(args.models_dir or folder / "models", "mlp")
            body.write_bytes(json_infer_body(np.ones((1, 4), dtype=np.float32)))
        script = folder / "post.lua"
        script.write_text(WRK_SCRIPT.format(body=body))
        results = {
            n: alternate(
                folder, model, n, versions_for(n, args.other, args.interfaces, args.other_interface), script, args
            )
            for n in args.frontends
        }
        rates = {}
        if args.served_rate:
            ffn = export_zoo(args.models_dir or folder / "models", "ffn", "--d-model", "128", "--n-layers", "128")
            rates = served_rates(
                folder, ffn, versions_for(1, args.other, args.interfaces, args.other_interface), args.served_rate
            )
    print("\nmedians over rounds (each version / the first per round, then the median ratio)")
    for frontends, got in results.items():
        if len(got) > 1:
            summary(frontends, got)
    if rates:
        base, *others = rates
        for name in others:
            ratios = [n / b for n, b in zip(rates[name], rates[base]) if b]
            ratio = statistics.median(ratios) if ratios else float("nan")
            old, new = statistics.median(rates[base]), statistics.median(rates[name])
            print(f"ffn-batch served rate at p99 <= 25 ms: {base} {old:.0f}  {name} {new:.0f}  ratio {ratio:.2f}")


if __name__ == "__main__":
    main()
