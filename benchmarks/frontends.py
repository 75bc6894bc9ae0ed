"""Front-end processes against one process, side by side in one run: the cost of the hop to the engine
per request, and the rate each layout serves at p99 <= 25 ms.

    .venv/bin/python benchmarks/frontends.py [--models-dir DIR] [--requests 2000] [--rounds 3] [--skip-rates]
                                             [--split-rate 1000] [--engine-window N]

Layouts: "one process" (frontends = 1, today's server), "1 front end + engine" and "2 front ends + engine".
1. The hop: batch-1 mlp (max_batch_size 1), one client sending requests one after another on a kept-alive
   connection, the layouts in turn for --rounds rounds (a neighbour's load lands on all of them). Per layout:
   the median over rounds of the mean client-observed latency, of the server's own mean request time (its
   latlab_server_request_duration_seconds), and of the CPU time per request of every server process, split
   into front ends and engine. The hop's cost is what the engine layout adds to the one-process figures.
2. CPU per request under batched load: mlp-batch at --split-rate req/s (open loop, 10 s) behind each layout,
   the CPU time of the front ends and of the engine divided by the requests answered: what a projection to
   more cores needs (each front end and the engine is one interpreter, one core at most).
3. The engine alone, saturated: mlp-batch's engine process fed by 16 threads of this process through the
   front ends' client (no HTTP), 8 s: the rate it answers and its CPU per request, where wake-ups are shared
   by many requests (what an engine behind many front ends sees), and this process's CPU per request (the
   client's side of the hop without HTTP). `--engine-window N` runs this part alone, for mlp and for
   minilm-sized calls (token_sized_model), each fed so, by one thread keeping N calls in flight without
   waiting (`send_many`), and the same with each send's calls stacked (hop.stacked, as native front ends feed
   it); N within the deployment's admission bound.
4. Served rate: mlp-batch and ffn-batch (the lab's batcher settings) behind each layout, `latlab loadtest
   --slos 25ms` bracketing the highest rate that meets p99 <= 25 ms to 10%.
Every deployment runs ORT on one intra-op thread without spinning, as the lab's CPU plan does on 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import psutil
import requests


from harness import export_zoo, json_infer_body, loadtest, write_config

from latlab.common import procs

LAYOUTS = {"one process": (1, False), "1 front end + engine": (1, True), "2 front ends + engine": (2, True)}


def start(config: Path, log: Path, frontends: int, engine: bool) -> subprocess.Popen:
    code = (
        "from latlab.server.processes.wsgi import serve; "
        f"serve({str(config)!r}, frontends={frontends}, separate_engine={engine})"
    )
    return procs.start([sys.executable, "-c", code], log_path=log)


def server_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of the server's processes: all, the engine's, the front ends' (one process: all of it)."""
    root = psutil.Process(pid)
    split = {"all": 0.0, "engine": 0.0, "front ends": 0.0}
    for process in [root, *root.children(recursive=True)]:
        times = process.cpu_times()
        seconds = times.user + times.system
        split["all"] += seconds
        if "latlab.server.processes.engine" in " ".join(process.cmdline()):
            split["engine"] += seconds
        elif process.pid != root.pid:
            split["front ends"] += seconds
    return split


def mean_request_s(url: str, deployment: str) -> tuple[float, float]:
    """(sum, count) of the server's request duration histogram for one deployment."""
    text = requests.get(f"{url}/metrics", timeout=10).text
    found = {}
    for line in text.splitlines():
        for part in ("_sum", "_count"):
            if (
                line.startswith(f"latlab_server_request_duration_seconds{part}{{")
                and f'deployment="{deployment}"' in line
            ):
                found[part] = float(line.split()[-1])
    return found.get("_sum", 0.0), found.get("_count", 0.0)


@contextlib.contextmanager
def layout_serving(
    folder: Path, name: str, models: dict[str, tuple[Path, dict]], layout: str
) -> Iterator[tuple[str, int]]:
    """The server of `models` in one of LAYOUTS, ready: (its URL, its pid); stopped on leaving."""
    frontends, engine = LAYOUTS[layout]
    port = procs.free_port()
    process = start(write_config(folder / f"{name}.toml", port, models), folder / f"{name}.log", frontends, engine)
    url = f"http://127.0.0.1:{port}"
    try:
        procs.wait_ready(f"{url}/v2/health/ready", process, timeout_s=120, log_path=folder / f"{name}.log")
        yield url, process.pid
    finally:
        procs.stop(process)


def hop_round(folder: Path, model: Path, layout: str, n: int) -> dict:
    with layout_serving(folder, "hop", {"mlp-b1": (model, {"max_batch_size": 1})}, layout) as (url, pid):
        session = requests.Session()
        body = json_infer_body(np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32))
        post = f"{url}/v2/models/mlp-b1/infer"
        for _ in range(200):
            session.post(post, data=body, headers={"Content-Type": "application/json"}).raise_for_status()
        server_before, cpu_before = mean_request_s(url, "mlp-b1"), server_cpu(pid)
        started = time.perf_counter()
        for _ in range(n):
            session.post(post, data=body, headers={"Content-Type": "application/json"})
        client_s = (time.perf_counter() - started) / n
        cpu_after, server_after = server_cpu(pid), mean_request_s(url, "mlp-b1")
        served = (server_after[0] - server_before[0]) / max(1.0, server_after[1] - server_before[1])
        return {
            "client_us": client_s * 1e6,
            "server_us": served * 1e6,
            **{f"cpu {k} us": (cpu_after[k] - cpu_before[k]) / n * 1e6 for k in cpu_after},
        }


def served_rate(folder: Path, models: dict[str, tuple[Path, dict]], layout: str) -> dict[str, dict]:
    found = {}
    with layout_serving(folder, "rate", models, layout) as (url, _):
        for name in models:
            out = folder / f"{name}-{layout.replace(' ', '_').replace('+', 'and')}"
            (curve,) = loadtest(
                url,
                [name],
                out,
                "--rates",
                "2000,4000,6000,8000",
                "--slos",
                "25ms",
                "--resolution",
                "0.1",
                "--slo-steps",
                "8",
                "--step-seconds",
                "3",
                "--max-windows",
                "4",
                "--warmup-seconds",
                "1",
            )
            (bracket,) = curve["slo_brackets"]
            found[name] = bracket
    return found


def cpu_split(folder: Path, model: Path, layout: str, rate: float) -> dict:
    batched = {"mlp-batch": (model, {"max_batch_size": 64, "max_queue_delay_ms": 2.0})}
    with layout_serving(folder, "split", batched, layout) as (url, pid):
        before, count_before = server_cpu(pid), mean_request_s(url, "mlp-batch")[1]
        out = folder / f"split-{layout.replace(' ', '_').replace('+', 'and')}"
        (curve,) = loadtest(
            url,
            ["mlp-batch"],
            out,
            "--rates",
            f"{rate:g}",
            "--step-seconds",
            "10",
            "--max-windows",
            "1",
            "--warmup-seconds",
            "0",
            "--slo-steps",
            "0",
        )
        after, count_after = server_cpu(pid), mean_request_s(url, "mlp-batch")[1]
        answered = count_after - count_before
        (step,) = curve.steps
        return {
            "answered": answered,
            "p99_ms": step.p99_s * 1e3,
            **{k: (after[k] - before[k]) / answered * 1e6 for k in after},
        }


def engine_alone(
    folder: Path,
    model: Path,
    seconds: float = 8.0,
    threads: int = 16,
    window: int = 0,
    tokens: int = 0,
    stack: bool = False,
) -> dict:
    """The engine fed by `threads` threads each waiting on its call; or, with `window`, by one thread keeping up to
    `window` calls in flight without waiting (`send_many`, as a native front end sends), which is how an engine
    behind several native front ends is fed; `stack`: each send's calls stacked as a native front end stacks a
    take's (hop.stacked, up to 64 a send). `tokens`: `model` takes minilm's inputs of that many token ids
    (token_sized_model) instead of mlp's."""
    import signal
    import threading

    from latlab.server.processes.client import EngineClient
    from latlab.server.processes.hop import stacked
    from latlab.server.processes.shared import EngineStatus
    from latlab.server.processes.supervisor import run_folder

    config = write_config(
        folder / "engine.toml",
        procs.free_port(),
        {"mlp-batch": (model, {"max_batch_size": 64, "max_queue_delay_ms": 2.0})},
    )
    run_dir = run_folder(1)
    status = EngineStatus(run_dir)
    engine = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "latlab.server.processes.engine",
            str(config),
            str(run_dir),
            f"127.0.0.1:{procs.free_port()}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    status.starting(engine.pid)
    client = None
    try:
        while not status.ready:
            assert engine.poll() is None, "the engine did not start"
            time.sleep(0.05)
        client = EngineClient(run_dir, status)
        if tokens:
            ids = np.random.default_rng(0).integers(0, 30000, (1, tokens), dtype=np.int64)
            inputs = {"input_ids": ids, "attention_mask": np.ones((1, tokens), np.int64)}
        else:
            inputs = {"x": np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)}
        answered = [0] * threads

        def send(index: int, until: float) -> None:
            while time.monotonic() < until:
                client.call(
                    {"kind": "infer", "model": "mlp-batch", "outputs": None, "parameters": {}, "finite": []}, inputs
                )
                answered[index] += 1

        def send_async(index: int, until: float) -> None:
            lock, room, inflight = threading.Lock(), threading.Event(), [0]

            def reached(answer: dict, frames: list, error: BaseException | None) -> None:
                with lock:
                    inflight[0] -= 1
                    answered[index] += error is None and "error" not in answer
                room.set()

            while time.monotonic() < until:
                with lock:
                    free = min(window - inflight[0], 64)
                    inflight[0] += max(free, 0)
                if free <= 0:
                    room.wait(0.01)
                    room.clear()
                    continue
                header = {"kind": "infer", "model": "mlp-batch", "outputs": None, "parameters": {}, "finite": []}
                calls = [(dict(header), inputs, reached) for _ in range(free)]
                client.send_many(stacked(calls, {"mlp-batch": 64}) if stack else calls)
            while inflight[0] > 0 and time.monotonic() < until + 5:
                time.sleep(0.01)

        if window:
            threads, answered, send = 1, [0], send_async
            client.call({"kind": "describe"})  # the engine answered this client's hello: it can take calls
        before, client_before = psutil.Process(engine.pid).cpu_times(), time.process_time()
        until = time.monotonic() + seconds
        workers = [threading.Thread(target=send, args=(i, until)) for i in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        after, client_after = psutil.Process(engine.pid).cpu_times(), time.process_time()
        total = sum(answered)
        cpu = (after.user + after.system) - (before.user + before.system)
        return {
            "rps": total / seconds,
            "cpu_us": cpu / total * 1e6,
            "cores": cpu / seconds,
            "client_us": (client_after - client_before) / total * 1e6,
        }
    finally:
        if client is not None:
            client.close()
        engine.send_signal(signal.SIGTERM)
        engine.wait(60)
        status.close()


def token_sized_model(path: Path, width: int = 384) -> Path:
    """A model with minilm's inputs and output sizes and almost no work: input_ids and attention_mask [n, seq]
    int64 in, [n, width] float out (each row the mean id, broadcast), so that the engine's own cost per request
    with minilm-sized tensors is what a run measures, not the model's."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Add", ["input_ids", "attention_mask"], ["summed"]),
        helper.make_node("Cast", ["summed"], ["as_float"], to=TensorProto.FLOAT),
        helper.make_node("ReduceMean", ["as_float", "axes"], ["mean"], keepdims=1),
        helper.make_node("Mul", ["mean", "ones"], ["embedding"]),
    ]
    graph = helper.make_graph(
        nodes,
        "token_sized",
        [
            helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
            for n in ("input_ids", "attention_mask")
        ],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", width])],
        initializer=[
            numpy_helper.from_array(np.array([1], np.int64), "axes"),
            numpy_helper.from_array(np.ones((1, width), np.float32), "ones"),
        ],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), str(path))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models-dir", type=Path, default=None)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-rates", action="store_true")
    parser.add_argument("--skip-hop", action="store_true")
    parser.add_argument("--split-rate", type=float, default=1000.0)
    parser.add_argument("--only-split", action="store_true", help="measure the CPU split alone")
    parser.add_argument(
        "--engine-window", type=int, default=0, help="part 3 only: the engine fed N calls in flight without waiting"
    )
    args = parser.parse_args()
    if args.engine_window:
        folder = Path(tempfile.mkdtemp(prefix="latlab-frontends-"))
        mlp = export_zoo(args.models_dir or folder / "models", "mlp")
        sized = token_sized_model(folder / "token-sized.onnx")
        for name, model, tokens in (("mlp", mlp, 0), ("minilm-sized (128 token ids)", sized, 128)):
            for window, stack in ((0, False), (args.engine_window, False), (args.engine_window, True)):
                alone = engine_alone(folder, model, window=window, tokens=tokens, stack=stack)
                fed = f"{window} calls in flight, one thread, no waiting" if window else "16 threads, each waiting"
                fed += ", stacked" if stack else ""
                print(
                    f"engine alone, {name}, fed by {fed}: {alone['rps']:.0f} req/s, {alone['cpu_us']:.0f} us CPU "
                    f"per request, {alone['cores']:.2f} cores (the client's side: {alone['client_us']:.0f} us)"
                )
        return
    folder = Path(tempfile.mkdtemp(prefix="latlab-frontends-"))
    models_dir = args.models_dir or folder / "models"
    mlp = export_zoo(models_dir, "mlp")
    ffn = export_zoo(models_dir, "ffn", "--d-model", "128", "--n-layers", "128")
    print(
        f"machine: {psutil.cpu_count()} cores; {args.requests} sequential batch-1 mlp requests per layout, "
        f"{args.rounds} rounds"
    )
    print(f"CPU per request answered, mlp-batch at {args.split_rate:g} req/s for 10 s (us: all, front ends, engine)")
    for layout in LAYOUTS:
        row = cpu_split(folder, mlp, layout, args.split_rate)
        print(
            f"  {layout:<24}{row['all']:>6.0f}{row['front ends']:>8.0f}{row['engine']:>8.0f}   "
            f"({row['answered']:.0f} answered, p99 {row['p99_ms']:.1f} ms)"
        )
    alone = engine_alone(folder, mlp)
    print(
        f"engine alone, saturated by 16 client threads: {alone['rps']:.0f} req/s, {alone['cpu_us']:.0f} us CPU "
        f"per request, {alone['cores']:.2f} cores (the client's side: {alone['client_us']:.0f} us per request)"
    )
    if args.only_split:
        return
    rounds: dict[str, list[dict]] = {layout: [] for layout in LAYOUTS}
    for _ in range(0 if args.skip_hop else args.rounds):
        for layout in LAYOUTS:
            rounds[layout].append(hop_round(folder, mlp, layout, args.requests))
    if not args.skip_hop:
        hop_table(rounds)
    if args.skip_rates:
        return
    batched = {
        "mlp-batch": (mlp, {"max_batch_size": 64, "max_queue_delay_ms": 2.0}),
        "ffn-batch": (ffn, {"max_batch_size": 64, "max_queue_delay_ms": 2.0}),
    }
    print("served rate at p99 <= 25 ms (bracket: highest rate met .. lowest broken above it)")
    for layout in LAYOUTS:
        for name, bracket in served_rate(folder, batched, layout).items():
            met = bracket["met_rps"]
            print(
                f"  {layout:<24}{name:<11}{(met or 0):>7.0f} req/s  (broke at {bracket['broke_rps']}; "
                f"{bracket['meaning']})",
                flush=True,
            )


def hop_table(rounds: dict[str, list[dict]]) -> None:
    table = {
        layout: {key: statistics.median(r[key] for r in results) for key in results[0]}
        for layout, results in rounds.items()
    }
    print(f"{'layout':<24}{'client us':>11}{'server us':>11}{'CPU us':>9}{'front ends':>12}{'engine':>9}")
    for layout, row in table.items():
        print(
            f"{layout:<24}{row['client_us']:>11.0f}{row['server_us']:>11.0f}{row['cpu all us']:>9.0f}"
            f"{row['cpu front ends us']:>12.0f}{row['cpu engine us']:>9.0f}"
        )
    one, hop = table["one process"], table["1 front end + engine"]
    print(
        f"hop: +{hop['client_us'] - one['client_us']:.0f} us per request as the client sees it "
        f"({(hop['client_us'] - one['client_us']) / one['client_us']:.0%} of a one-process batch-1 mlp request), "
        f"+{hop['server_us'] - one['server_us']:.0f} us of server time, "
        f"+{hop['cpu all us'] - one['cpu all us']:.0f} us of CPU "
        f"({(hop['cpu all us'] - one['cpu all us']) / one['cpu all us']:.0%})"
    )


if __name__ == "__main__":
    main()
