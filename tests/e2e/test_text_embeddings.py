"""Sentences in, embeddings out: the real all-MiniLM-L6-v2 export served by the real server process with its
own tokenizer, equal to sentence-transformers' `encode` within 1e-5, through latlab's client (lean HTTP +
payloads.text_body) and through `tritonclient.http` BYTES, JSON and binary, alone and batched together."""

from __future__ import annotations

import os
import sys
import threading
from typing import Iterator

import numpy as np
import orjson
import pytest
import torch
import tritonclient.http as tritonclient_http

from latlab.common import procs
from latlab.export.minilm import model_dir
from latlab.export.onnx_export import export
from latlab.export.zoo import build_minilm
from latlab.loadtest.lean_http import LeanClient
from latlab.loadtest.payloads import HEADER_LENGTH, text_body

pytestmark = pytest.mark.e2e
CLI = [sys.executable, "-m", "latlab.cli"]
TOLERANCE = 1e-5
SENTENCES = [
    "hello world",
    "A much longer sentence about latency, GPUs and the batching of requests; does the GPU pay off?",
    "Grüße aus Köln: café, naïve, façade — and ✓ marks.",
    "汉字とカタカナ, emoji 🙂 and numbers 3.14159!",
    "?!...",
    "CPUs hold their own at batch one. " * 40,  # about 360 tokens: cut at max_length (256)
]


@pytest.fixture(scope="module")
def expected() -> np.ndarray:
    """sentence-transformers' own embeddings, from the package's files (modules.json: Transformer, mean
    Pooling, Normalize), nothing fetched."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir()), device="cpu", local_files_only=True)
    assert model.max_seq_length == 256
    return model.encode(SENTENCES, convert_to_numpy=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`latlab serve` of the exported model with the [tokenizer] its metadata names (batches of up to 8)."""
    models = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    metadata = export("minilm", build_minilm(seq_len=8), models, source="test")
    text = metadata["text_deployment"]
    folder = models / "minilm"
    port = procs.free_port()
    config = folder / "server.toml"
    config.write_text(f"""
[server]
port = {port}
[[deployments]]
name = "minilm-text"
model_path = "{folder / "model.onnx"}"
[deployments.batcher]
max_batch_size = 8
max_queue_delay_ms = 50
[deployments.tokenizer]
file = "{text["tokenizer"]["file"]}"
max_length = {text["tokenizer"]["max_length"]}
""")
    log = folder / "server.log"
    process = procs.start([*CLI, "serve", "--config", str(config)], log_path=log)
    try:
        procs.wait_ready(f"http://127.0.0.1:{port}/v2/health/ready", process, timeout_s=120, log_path=log)
        yield f"127.0.0.1:{port}"
    finally:
        procs.stop(process)


def latlab_infer(server: str, sentences: list[str], binary: bool) -> tuple[np.ndarray, dict]:
    """Through latlab's own client: the load generator's body encoder and its lean HTTP client."""
    client = LeanClient(f"http://{server}")
    try:
        body = text_body(sentences, binary)
        answer = client.send(client.prepare("POST", "/v2/models/minilm-text/infer", body.data, body.headers))
    finally:
        client.close()
    assert answer.status == 200, answer.body[:300]
    length = answer.headers.get(HEADER_LENGTH.lower())
    header = orjson.loads(answer.body if length is None else answer.body[: int(length)])
    (output,) = header["outputs"]
    if length is None:
        return np.array(output["data"], np.float32).reshape(output["shape"]), header
    return np.frombuffer(answer.body[int(length) :], "<f4").reshape(output["shape"]), header


def triton_infer(server: str, sentences: list[str], binary: bool) -> np.ndarray:
    client = tritonclient_http.InferenceServerClient(server)
    try:
        text = tritonclient_http.InferInput("text", [len(sentences)], "BYTES")
        text.set_data_from_numpy(np.array([s.encode("utf-8") for s in sentences], dtype=object), binary_data=binary)
        output = tritonclient_http.InferRequestedOutput("embedding", binary_data=binary)
        return client.infer("minilm-text", [text], outputs=[output]).as_numpy("embedding")
    finally:
        client.close()


def batch_totals(server: str) -> tuple[float, float]:
    """(model runs, samples run) of the deployment so far, from its batch-size histogram on /metrics."""
    client = LeanClient(f"http://{server}")
    try:
        page = client.send(client.prepare("GET", "/metrics")).body.decode()
    finally:
        client.close()
    totals = {}
    for line in page.splitlines():
        if line.startswith("latlab_batcher_batch_size_") and 'deployment="minilm-text"' in line:
            totals[line.split("{")[0]] = float(line.split()[-1])
    return totals["latlab_batcher_batch_size_count"], totals["latlab_batcher_batch_size_sum"]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_latlab_client_gets_sentence_transformers_embeddings(server: str, expected: np.ndarray, binary: bool) -> None:
    have, header = latlab_infer(server, SENTENCES, binary)
    assert have.shape == (len(SENTENCES), 384)
    assert np.max(np.abs(have - expected)) < TOLERANCE
    assert header["parameters"] == {"truncated": 1}  # the long sentence, cut at 256 tokens, and said so


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_tritonclient_bytes_gets_sentence_transformers_embeddings(
    server: str, expected: np.ndarray, binary: bool
) -> None:
    have = triton_infer(server, SENTENCES, binary)
    assert np.max(np.abs(have - expected)) < TOLERANCE


def test_sentences_sent_at_once_are_batched_padded_and_still_equal(server: str, expected: np.ndarray) -> None:
    """One sentence per request, all at once: the batcher pads them to the longest; masks keep it exact."""
    results: dict[int, np.ndarray] = {}
    start = threading.Barrier(len(SENTENCES))
    before = batch_totals(server)

    def send(index: int) -> None:
        start.wait()
        results[index] = triton_infer(server, [SENTENCES[index]], binary=index % 2 == 0)[0]

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(SENTENCES))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    have = np.stack([results[i] for i in range(len(SENTENCES))])
    assert np.max(np.abs(have - expected)) < TOLERANCE
    runs, samples = batch_totals(server)
    assert samples - before[1] > runs - before[0]  # fewer runs than requests: some shared a padded batch


def test_metadata_shows_the_text_input_not_the_token_tensors(server: str) -> None:
    client = tritonclient_http.InferenceServerClient(server)
    try:
        metadata = client.get_model_metadata("minilm-text")
    finally:
        client.close()
    assert metadata["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert metadata["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]}]
    assert metadata["parameters"]["max_length"] == 256
