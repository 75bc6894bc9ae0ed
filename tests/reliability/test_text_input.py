"""Bad text against the real server process: non-UTF-8 bytes, empty sentences, a non-BYTES datatype, a wrong
shape, a body past the limit each get a 4xx naming the problem, while valid requests of the same batch are
answered correctly and the server keeps serving."""

from __future__ import annotations

import threading
from typing import Iterator

import numpy as np
import orjson
import psutil
import pytest
import requests

from latlab.common import procs
from latlab.loadtest.payloads import HEADER_LENGTH, text_body
from tests.reliability.conftest import CLI, COUNTS, Server, assert_error, wait_live
from tests.text_models import TOKENIZER, token_model

MAX_BODY = 16 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A text deployment of the toy encoder that waits up to 300 ms for a batch of 8: requests sent together
    share one, so a bad request would spoil its neighbours if it were validated after queueing."""
    folder = tmp_path_factory.mktemp("text-server")
    port = procs.free_port()
    config = folder / "server.toml"
    config.write_text(f"""
[server]
port = {port}
max_body_bytes = {MAX_BODY}
[[deployments]]
name = "text"
model_path = "{token_model(folder / "toy" / "model.onnx")}"
[deployments.batcher]
max_batch_size = 8
max_queue_delay_ms = 300
[deployments.tokenizer]
file = "{TOKENIZER}"
max_length = 32
""")
    log = folder / "server.log"
    process = procs.start([*CLI, "serve", "--config", str(config)], log_path=log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_live(url, process, log)
        yield Server(url, process, log, in_process=not psutil.Process(process.pid).children())
    finally:
        procs.stop(process)


def binary_text(elements: list[bytes], shape: list[int] | None = None) -> tuple[bytes, dict]:
    """Raw BYTES elements (any bytes, UTF-8 or not) with the binary tensor extension."""
    raw = b"".join(len(e).to_bytes(4, "little") + e for e in elements)
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "text",
                    "shape": shape or [len(elements)],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(raw)},
                }
            ]
        }
    )
    return header + raw, {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(header))}


def json_input(**tensor: object) -> bytes:
    return orjson.dumps({"inputs": [{"name": "text", **tensor}]})


BAD = {
    "non-utf8": (binary_text([b"fine", b"caf\xe9 au lait"]), 400, ["sentence 1 is not UTF-8", "byte 3"]),
    "empty": ((json_input(shape=[2], datatype="BYTES", data=["fine", ""]), None), 400, ["sentence 1 is empty"]),
    "blank": ((json_input(shape=[1], datatype="BYTES", data=[" \t "]), None), 400, ["sentence 0 is empty"]),
    "fp32": ((json_input(shape=[1], datatype="FP32", data=[1.5]), None), 400, ["must be BYTES", "FP32"]),
    "2d": ((json_input(shape=[1, 2], datatype="BYTES", data=["a", "b"]), None), 400, ["shape [-1]", "[1, 2]"]),
    "no-sentence": ((json_input(shape=[0], datatype="BYTES", data=[]), None), 400, ["at least one sentence"]),
    "token-ids": (
        (
            orjson.dumps({"inputs": [{"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "data": [101, 102]}]}),
            None,
        ),
        400,
        ["takes one input 'text'"],
    ),
    "too-long": ((text_body(["word " * (MAX_BODY // 5)]).data, None), 413, [str(MAX_BODY)]),
}


def post(server: Server, body: bytes, headers: dict | None) -> requests.Response:
    return requests.post(
        f"{server.url}/v2/models/text/infer",
        data=body,
        headers=headers or {"Content-Type": "application/json"},
        timeout=30,
    )


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_text_fails_alone_and_its_batch_neighbours_are_answered(server: Server, case: str) -> None:
    (body, headers), status, fragments = BAD[case]
    good_sentences = ["a valid sentence that shares the batch", "another, longer valid sentence " * 3]
    reference = [post(server, text_body([s]).data, None).json()["outputs"][0]["data"] for s in good_sentences]
    answers: dict[str, requests.Response] = {}
    start = threading.Barrier(3)

    def send(key: str, data: bytes, head: dict | None) -> None:
        start.wait()
        answers[key] = post(server, data, head)

    threads = [threading.Thread(target=send, args=("bad", body, headers))]
    threads += [
        threading.Thread(target=send, args=(f"good{i}", text_body([s]).data, None))
        for i, s in enumerate(good_sentences)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert_error(answers["bad"], status, *fragments)
    for i, want in enumerate(reference):
        assert answers[f"good{i}"].status_code == 200, answers[f"good{i}"].content[:300]
        np.testing.assert_allclose(answers[f"good{i}"].json()["outputs"][0]["data"], want, rtol=1e-6, atol=1e-6)
    assert server.alive()
    COUNTS["bad text requests refused"] += 1


def test_the_bad_requests_are_counted_and_none_reached_the_model(server: Server) -> None:
    labels = {"deployment": "text", "model": "toy", "provider": "cpu"}
    assert server.metric("latlab_server_requests_total", **labels, outcome="bad_request") >= len(BAD)
    assert server.metric("latlab_batcher_batches_total", **labels, outcome="error") == 0
    assert server.metric("latlab_server_preprocess_duration_seconds_count", **labels) > 0
