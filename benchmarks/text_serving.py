"""What host-side tokenization costs minilm: measured side by side in one run, on this machine.

    .venv/bin/python benchmarks/text_serving.py [--seq-len 16] [--slo-ms 50] [--rounds 1] [--provider cpu]

Prints (1) the tokenizer's cost per request in process (the text front end on one sentence of --seq-len
tokens) next to one ORT batch-1 run of the same tokens, and per batch of 32 (tokenizers' Rust batch
encoding, the alternative to tokenizing per request); (2) the served rates at p99 <= --slo-ms of the same
model behind the same batcher, fed token ids (`minilm-ids`) and fed sentences (`minilm-text`), from latlab's
own open-loop SLO search with real Locust, plus the tokenization time the server itself recorded
(latlab_server_preprocess_duration_seconds) during the search. On a GPU box pass --provider cuda."""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path

import numpy as np

from harness import export_zoo, loadtest, serving

from latlab.common import procs
from latlab.loadtest.sentences import sentence
from latlab.server.config import load_config, save_config
from latlab.server.runtime.model import OnnxModel
from latlab.server.runtime.text import TextFrontEnd

DEPLOYMENTS = ("minilm-ids", "minilm-text")


def write_config(path: Path, port: int, model: Path, provider: str, batch: int, delay_ms: float) -> Path:
    """Two deployments of one model behind the same batcher settings; only the text one has a tokenizer."""
    tokenizer = {"file": model.parent / "tokenizer" / "tokenizer.json", "max_length": 256}
    return save_config(
        {
            "server": {"port": port},
            "deployments": [
                {
                    "name": name,
                    "model": "minilm",
                    "model_path": model,
                    "provider": provider,
                    "cpu": {"intra_op_threads": 1, "allow_spinning": False},
                    "batcher": {"max_batch_size": batch, "max_queue_delay_ms": delay_ms},
                    "tokenizer": tokenizer if name == "minilm-text" else None,
                }
                for name in DEPLOYMENTS
            ],
        },
        path,
    )


def median_seconds(call, n: int) -> float:
    for _ in range(min(50, n)):
        call()
    times = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def tokenize_costs(front: TextFrontEnd, seq_len: int, n: int) -> tuple[float, float, dict[str, np.ndarray]]:
    """Median seconds per sentence: 32 one-sentence requests one at a time, and one request of all 32
    (tokenizers' batch encoding); and the token tensors of one request, to feed the model."""
    rng = random.Random(seq_len)
    requests = []
    for _ in range(32):
        one = np.empty(1, dtype=object)
        one[0] = sentence(rng, seq_len).encode()
        requests.append({"text": one})
    many = np.empty(32, dtype=object)
    many[:] = [r["text"][0] for r in requests]
    rounds = max(n // 32, 20)
    single = median_seconds(lambda: [front.encode(r) for r in requests], rounds) / 32
    batched = median_seconds(lambda: front.encode({"text": many}), rounds) / 32
    return single, batched, front.encode(requests[0])[0]


def in_process_costs(config: Path, lengths: list[int], n: int) -> dict[int, dict[str, float]]:
    """Per length in tokens: tokenizing per request and per sentence of a 32-sentence request, and one ORT
    batch-1 run of the same tokens with the served deployment's session options (median seconds)."""
    deployments = {d.name: d for d in load_config(config).deployments}
    text = deployments["minilm-text"]
    model = OnnxModel(deployments["minilm-ids"])
    front = TextFrontEnd(text.tokenizer, {s.name: s.dtype for s in model.inputs}, text.name)
    costs = {}
    for length in lengths:
        single, batched, feeds = tokenize_costs(front, length, n)
        costs[length] = {
            "tokenize_request_s": single,
            "tokenize_batch32_per_sentence_s": batched,
            "ort_b1_s": median_seconds(lambda: model.run(feeds), max(n // 10, 30)),
        }
    return costs


def slo_search(url: str, names: list[str], out: Path, args: argparse.Namespace) -> dict[str, dict]:
    options = [
        "--slo",
        f"p99={args.slo_ms:g}ms",
        "--rates",
        f"{args.start_rate:g}",
        "--seq-len",
        str(args.seq_len),
        "--step-seconds",
        str(args.step_seconds),
        "--warmup-seconds",
        str(args.warmup_seconds),
        "--resolution",
        str(args.resolution),
    ]
    return {d.name: d.search or {} for d in loadtest(url, names, out, *options)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq-len", type=int, default=16, help="tokens per request, [CLS] and [SEP] included")
    parser.add_argument("--slo-ms", type=float, default=50.0)
    parser.add_argument("--provider", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--delay-ms", type=float, default=3.0)
    parser.add_argument("--start-rate", type=float, default=50.0)
    parser.add_argument("--step-seconds", type=float, default=3.0)
    parser.add_argument("--warmup-seconds", type=float, default=1.0)
    parser.add_argument("--resolution", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=1, help="repeat the searches, alternating their order")
    parser.add_argument("--in-process-runs", type=int, default=2000)
    parser.add_argument("--lengths", default="16,64,256", help="in process: sentence lengths in tokens to time")
    parser.add_argument("--in-process-only", action="store_true", help="skip the served SLO searches")
    parser.add_argument("--models-dir", default="models/bench")
    parser.add_argument("--out", default=f"runs/text-serving-{time.strftime('%Y%m%d-%H%M%S')}")
    args = parser.parse_args(argv)
    work = Path(args.out).resolve()
    work.mkdir(parents=True, exist_ok=True)
    started, load = time.monotonic(), "/".join(f"{v:.1f}" for v in os.getloadavg())
    model = export_zoo(Path(args.models_dir).resolve(), "minilm")
    if model is None:
        raise SystemExit("could not export minilm")
    port = procs.free_port()
    config = write_config(work / "text.toml", port, model, args.provider, args.max_batch_size, args.delay_ms)
    lengths = sorted({args.seq_len, *(int(v) for v in args.lengths.split(",") if v)})
    costs = in_process_costs(config, lengths, args.in_process_runs)
    print_costs(args, costs)
    if args.in_process_only:
        return
    rounds = []
    with serving(config, port, work / "server.log") as served:
        for i in range(args.rounds):
            names = list(DEPLOYMENTS) if i % 2 == 0 else list(reversed(DEPLOYMENTS))
            rounds.append(slo_search(served.url, names, work / f"slo-{i}", args))
        count = served.value("latlab_server_preprocess_duration_seconds_count", "minilm-text")
        total = served.value("latlab_server_preprocess_duration_seconds_sum", "minilm-text")
    report(args, rounds, total / count if count else float("nan"))
    print(f"\n{time.monotonic() - started:.0f} s; load average before {load}; results in {work}")


def print_costs(args: argparse.Namespace, costs: dict[int, dict[str, float]]) -> None:
    print(f"\nin process, median per sentence (provider {args.provider}, one ORT thread):")
    print(f"{'tokens':>6} {'tokenize per request':>22} {'per sentence of 32':>20} {'ORT batch-1 run':>16} {'share':>7}")
    for length, cost in costs.items():
        print(
            f"{length:>6} {cost['tokenize_request_s'] * 1e6:>19.1f} us "
            f"{cost['tokenize_batch32_per_sentence_s'] * 1e6:>17.1f} us "
            f"{cost['ort_b1_s'] * 1e6:>13.1f} us {cost['tokenize_request_s'] / cost['ort_b1_s']:>7.1%}"
        )


def report(args: argparse.Namespace, rounds: list[dict], served_tokenize_s: float) -> None:
    print(
        f"\nminilm, {args.seq_len} tokens per request, provider {args.provider}, batcher "
        f"{args.max_batch_size}/{args.delay_ms:g} ms, p99 <= {args.slo_ms:g} ms"
    )
    print(f"tokenize per request, served (histogram mean over the searches): {served_tokenize_s * 1e6:.1f} us")
    for i, found in enumerate(rounds):
        ids, text = (found.get(name, {}) for name in DEPLOYMENTS)
        ids_rate, text_rate = ids.get("rate") or 0.0, text.get("rate") or 0.0
        print(
            f"round {i + 1}: served rate at p99 <= {args.slo_ms:g} ms: token ids {ids_rate:.0f} req/s "
            f"({'VALID' if ids.get('valid') else 'not valid'}), text {text_rate:.0f} req/s "
            f"({'VALID' if text.get('valid') else 'not valid'}); text / ids = "
            f"{text_rate / ids_rate if ids_rate else float('nan'):.2f}"
        )


if __name__ == "__main__":
    main()
