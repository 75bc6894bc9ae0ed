"""latlab's closed-loop sender alone: the loop sender's connections (loadtest/loop_sender.py, or with `--native`
the native closed loop's: native_loop.py) with nothing around them, no Locust, recorder, statistics or driver: what
the sender costs here, the floor under `latlab loadtest --mode closed` (closed_vs_wrk.py's `--bare` runs both beside
wrk and the load test).

    .venv/bin/python benchmarks/bare_sender.py URL DEPLOYMENT [--users 16] [--seconds 5] [--native]

Each connection sends the deployment's request bodies (payloads.request_bodies, as the load test draws them) in
a random order drawn once, the next the moment an answer is read. Prints one JSON line: requests/s over the
seconds after a one-second start, and the process's CPU (% of one core) over the same seconds."""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402 - gevent patches the standard library first
import itertools  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402
from urllib.parse import urlsplit  # noqa: E402

import gevent  # noqa: E402
import requests  # noqa: E402

from latlab.loadtest import native_loop  # noqa: E402
from latlab.loadtest.loop_sender import LoopSender  # noqa: E402
from latlab.loadtest.payloads import request_bodies  # noqa: E402
from latlab.loadtest.raw_http import Finished  # noqa: E402


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("deployment")
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--native", action="store_true", help="the native closed loop's sender (native_loop.py)")
    args = parser.parse_args(argv)
    address = urlsplit(args.url)
    metadata = requests.get(f"{args.url}/v2/models/{args.deployment}", timeout=10).json()
    path = f"/v2/models/{args.deployment}/infer"
    raws = [
        f"POST {path} HTTP/1.1\r\nHost: {address.netloc}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body.data)}\r\n\r\n".encode()
        + body.data
        for body in request_bodies(metadata, seed=0)
    ]
    answered = [0, 0]  # requests, of which not a 200

    def record(finished: list[Finished], _in_flight: float | None) -> None:
        answered[0] += len(finished)
        answered[1] += sum(f.status != 200 for f in finished)

    rng = random.Random(0)
    target = (address.hostname, address.port)
    if args.native:
        lib, why = native_loop.library()
        if lib is None:
            raise SystemExit(f"the native closed loop is not built: {why}")
        senders = [native_loop.NativeSender(lib, target, rng.choices(raws, k=4096)) for _ in range(args.users)]
    else:
        senders = [LoopSender(target, itertools.cycle(rng.choices(raws, k=4096)).__next__) for _ in range(args.users)]
    running = [gevent.spawn(sender.run, record) for sender in senders]
    gevent.sleep(1.0)
    for sender in senders:
        sender.collect()
    count, cpu, began = answered[0], _cpu_s(), time.monotonic()
    gevent.sleep(args.seconds)
    for sender in senders:
        sender.collect()
    elapsed = time.monotonic() - began
    done = answered[0] - count
    print(json.dumps({"rps": done / elapsed, "cpu_percent": 100.0 * (_cpu_s() - cpu) / elapsed, "failed": answered[1]}))
    gevent.killall(running)


if __name__ == "__main__":
    main()
