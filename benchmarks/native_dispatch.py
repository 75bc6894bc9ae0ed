"""A native front end's Python per request, in process: taking (records of a take parsed, checked, admitted,
decoded and sent to the engine as one group) and answering (the engine's grouped answer read, each call's outputs
decoded, encoded and written), both on the front end's one thread, each timed over many requests without HTTP
or an engine, then profiled (cProfile, cumulative time per function) to show which steps cost what.

    .venv/bin/python benchmarks/native_dispatch.py [--requests 20000] [--take 8] [--tokens 0] [--profile]

--take: requests per take (what one wake-up of the dispatcher finds); --tokens N: minilm-sized requests (N token ids
and a mask) instead of mlp's 4 floats. The engine's answer is a [1, 8] FP32 output per call. The native part is
built as the server builds it (cc). Sockets: the sends go nowhere (the client's send is replaced by dropping the
group it was given, after it was packed), and the answers' writes go to tokens of no connection."""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from pathlib import Path

import numpy as np
import orjson
from prometheus_client import CollectorRegistry

from latlab.server.config import parse_config
from latlab.server.http.native import RECORD, library, listening_socket
from latlab.server.metrics import ServerMetrics, use_multiprocess_values
from latlab.server.processes.client import EngineClient
from latlab.server.processes.frontend import RemoteDeployment
from latlab.server.processes.hop import group_message, unpack
from latlab.server.processes.native_frontend import NativeFrontEnd
from latlab.server.processes.shared import EngineStatus, SharedAdmission, metrics_folder
from latlab.server.processes.supervisor import run_folder

from harness import export_zoo


CHUNK_TAKES = 32


class State:
    """The part of FrontState the dispatcher reads: the config and one RemoteDeployment."""

    def __init__(self, config, deployment) -> None:
        self.config, self.deployment = config, deployment

    def get(self, name, version):
        return self.deployment


def record(body: bytes, token: int) -> bytes:
    """One request as native_http.c queues it: the record, the head, the peer, the body."""
    head = (
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    fields = [0, 4, 5, len(b"/v2/models/m/infer"), 0, 0]  # method, path, query
    content_type = head.index(b"application/json")
    fields += [content_type, len(b"application/json"), 0, 0, 0, 0]  # content type, authorization, binary header
    length_at = head.index(b"Content-Length: ") + len(b"Content-Length: ")
    fields += [length_at, len(str(len(body))), 0, 0]  # content length, transfer encoding
    peer = b"127.0.0.1"
    total = RECORD.size + len(head) + len(peer) + len(body)
    total += -total % 8
    packed = RECORD.pack(token, 0, len(head), len(body), len(peer), total, time.perf_counter(), *fields)
    return (packed + head + peer + body).ljust(total, b"\0")


def body_of(tokens: int) -> bytes:
    if tokens:
        ids = np.random.default_rng(0).integers(0, 30000, tokens).tolist()
        inputs = [
            {"name": "input_ids", "shape": [1, tokens], "datatype": "INT64", "data": ids},
            {"name": "attention_mask", "shape": [1, tokens], "datatype": "INT64", "data": [1] * tokens},
        ]
    else:
        inputs = [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}]
    return orjson.dumps({"inputs": inputs})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--take", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=0)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    assert library()[0] is not None, library()[1]
    run_dir = run_folder(1)
    use_multiprocess_values(metrics_folder(run_dir))
    model = export_zoo(Path(run_dir) / "models", "mlp")
    config = parse_config({"deployments": [{"name": "m", "model_path": str(model)}]})
    status = EngineStatus(run_dir)
    status.starting(1)
    status.set_ready(True)
    client = EngineClient(run_dir, status)
    client._ready = status.up()
    sent: list = []

    def dropped() -> None:  # what _send_queued does up to the socket: the group packed, then dropped
        with client._lock:
            calls, client._queue[:] = list(client._queue), []
            client._sending = False
        for call in calls:
            call.sent = True
        sent.append(group_message([(c.header, c.key, c.arrays) for c in calls], client._rx_id)[0])

    client._send_queued = dropped
    admission = SharedAdmission(run_dir, 1)
    admission.claim()
    metrics = ServerMetrics(CollectorRegistry(), process=False)
    inputs = {"input_ids": "<i8", "attention_mask": "<i8"} if args.tokens else {"x": "<f4"}
    # admission counted but unbounded: every request of the run is held until the answers' half
    deployment = RemoteDeployment(config.deployments[0], 0, client, metrics, admission, inputs, False, announce=False)
    sock = listening_socket("127.0.0.1", 0)
    server = NativeFrontEnd(State(config, deployment), lambda environ, start: [], sock)
    body = body_of(args.tokens)
    takes = [
        b"".join(record(body, (7 << 32) | (t * args.take + i)) for i in range(args.take))
        for t in range(args.requests // args.take)
    ]
    output = {"y": np.ones((1, 8), np.float32)}

    def dispatch_half(chunk: list) -> None:
        for take in chunk:
            server._dispatch(memoryview(take))

    def answer_half(_chunk: list) -> None:  # the calls the chunk left waiting
        calls = list(server.waiting.values())
        ids = [c.header["id"] for c in calls]
        for start in range(0, len(calls), args.take):
            frames, _ = group_message([({"id": i}, "outputs", output) for i in ids[start : start + args.take]])
            for answer in unpack(frames[0])["group"]:
                call = client._waiting.pop(answer["id"])
                call.answered(answer, frames[1:], None)

    # a few hundred requests held at a time, as a busy front end holds them (not the whole run: the garbage
    # collector's passes over tens of thousands of held requests would be timed too)
    spent = {dispatch_half: 0.0, answer_half: 0.0}
    profilers = {half: cProfile.Profile() for half in spent}
    for start in range(0, len(takes), CHUNK_TAKES):
        chunk = takes[start : start + CHUNK_TAKES]
        for half in spent:
            started = time.process_time()
            if args.profile:
                profilers[half].runcall(half, chunk)
            else:
                half(chunk)
            spent[half] += time.process_time() - started
    for half, name in ((dispatch_half, "taking"), (answer_half, "answering")):
        print(
            f"{name}: {spent[half] / args.requests * 1e6:.1f} us CPU a request "
            f"({args.requests} in takes of {args.take})"
        )
        if args.profile:
            pstats.Stats(profilers[half]).sort_stats("cumulative").print_stats(25)
    assert not server.waiting and len(sent) == len(takes), (len(server.waiting), len(sent))
    server.close()
    sock.close()
    client.close()
    admission.close()
    status.close()


if __name__ == "__main__":
    main()
