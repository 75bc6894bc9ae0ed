"""Two versions of the server side by side: this checkout and another version's code, each serving the same
almost free model, with one keep-alive client alternating requests between them, so both see the same phase of a
VM whose speed drifts by tens of percent within minutes (run one after the other, they cannot be compared).

    git archive OLD | tar -x -C /tmp/old/src      # then lay it out as a package: /tmp/old/pkg/latlab/{server,...}
    .venv/bin/python benchmarks/ab_request_path.py --other /tmp/old/pkg [--rounds 5] [--n 2000]

Prints per round each version's median request time (client side, batching off) and the ratio new / other.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson
import requests

from harness import build_cheap_model, serve_version, write_config

from latlab.common import procs

BODY = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}]})


def alternate(urls: list[str], n: int) -> list[float]:
    """Median seconds per request of each URL, requests interleaved one by one."""
    sessions = [requests.Session() for _ in urls]
    times: list[list[float]] = [[] for _ in urls]
    for i in range(n + 200):
        for which, (url, session) in enumerate(zip(urls, sessions)):
            started = time.perf_counter()
            response = session.post(url, data=BODY, headers={"Content-Type": "application/json"}, timeout=10)
            elapsed = time.perf_counter() - started
            assert response.status_code == 200, response.text
            if i >= 200:  # warm-up
                times[which].append(elapsed)
    return [float(np.median(t)) for t in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--other", required=True, help="PYTHONPATH holding the other version's `latlab` package")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=2000, help="requests per version per round")
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a [server] setting for this checkout's server only, e.g. threads=64 (repeatable)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = build_cheap_model(folder / "cheap" / "model.onnx", [4], reduce=False)
        servers, urls = [], []
        try:
            for pythonpath, settings in ((None, args.setting), (args.other, [])):
                port = procs.free_port()
                config = write_config(folder / f"{port}.toml", port, {"cheap": (model, {"max_batch_size": 1})})
                text = config.read_text().replace("[server]\n", "[server]\n" + "".join(f"{s}\n" for s in settings), 1)
                config.write_text(text)
                servers.append(serve_version(config, port, folder, pythonpath))
                urls.append(f"http://127.0.0.1:{port}/v2/models/cheap/infer")
            ratios = []
            for round_ in range(args.rounds):
                new, other = alternate(urls, args.n)
                ratios.append(new / other)
                print(
                    f"round {round_ + 1}: this checkout {new * 1e6:.0f} us, other {other * 1e6:.0f} us, "
                    f"ratio {new / other:.3f}",
                    flush=True,
                )
            print(f"ratio this / other: median {np.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f})")
        finally:
            for server in servers:
                procs.stop(server)


if __name__ == "__main__":
    main()
