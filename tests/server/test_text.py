"""Text deployments: the [tokenizer] config, tokenization before queueing, padding inside a batch, truncation
said in the response, metadata showing the text input, and the preprocess histogram (in process; the real
server process and the real model are in tests/reliability/test_text_input.py and tests/e2e/test_text_embeddings.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import orjson
import pytest
from prometheus_client import CollectorRegistry
from tokenizers import Tokenizer

from latlab.loadtest.payloads import HEADER_LENGTH, text_body
from latlab.server.config import PaddingSettings, TokenizerSettings, parse_config
from latlab.server.errors import BadRequest, ConfigError
from latlab.server.http.app import create_app
from latlab.server.protocol import decode_request
from latlab.server.runtime.text import TextFrontEnd

from tests.text_models import TOKENIZER, WIDTH, token_model


def text_deployment(path: Path, max_length: int = 16, **batcher: object) -> dict:
    return {
        "name": "toy-text",
        "model_path": str(path),
        "batcher": batcher,
        "tokenizer": {"file": str(TOKENIZER), "max_length": max_length},
    }


def front(max_length: int = 16, inputs: tuple[str, ...] = ("input_ids", "attention_mask")) -> TextFrontEnd:
    return TextFrontEnd(TokenizerSettings(TOKENIZER, max_length), {n: np.dtype(np.int64) for n in inputs}, "toy")


def text(*sentences: bytes) -> dict[str, np.ndarray]:
    array = np.empty(len(sentences), dtype=object)
    array[:] = list(sentences)
    return {"text": array}


def test_a_request_is_tokenized_with_its_own_padding_and_mask() -> None:
    tensors, truncated = front().encode(text(b"hello world", b"a much longer sentence than that one"))
    reference = Tokenizer.from_file(str(TOKENIZER))
    reference.no_padding()
    want = reference.encode("hello world").ids
    assert tensors["input_ids"].dtype == np.int64 and tensors["input_ids"].shape[0] == 2
    assert list(tensors["input_ids"][0, : len(want)]) == want and (tensors["input_ids"][0, len(want) :] == 0).all()
    assert list(tensors["attention_mask"].sum(1)) == [len(want), tensors["input_ids"].shape[1]]
    assert truncated == 0 and set(tensors) == {"input_ids", "attention_mask"}


def test_long_sentences_are_cut_at_max_length_and_counted() -> None:
    tensors, truncated = front(max_length=8).encode(text(b"word " * 50, b"short", b"two " * 7))
    assert tensors["input_ids"].shape == (3, 8) and truncated == 2
    assert tensors["input_ids"][0, -1] == 102  # [SEP] still ends a cut sentence


def test_the_batcher_pads_token_inputs_and_keeps_the_configured_length_buckets() -> None:
    padding = front(inputs=("input_ids", "attention_mask", "token_type_ids")).padding(PaddingSettings(bucket=16))
    assert padding == PaddingSettings(
        axis=1, values={"input_ids": 0, "attention_mask": 0, "token_type_ids": 0}, bucket=16
    )
    assert front().padding(PaddingSettings(values={"input_ids": 7})).values == {"input_ids": 7, "attention_mask": 0}


def test_token_type_ids_are_zeros_when_the_model_takes_them() -> None:
    tensors, _ = front(inputs=("input_ids", "attention_mask", "token_type_ids")).encode(text(b"hi there"))
    assert tensors["token_type_ids"].shape == tensors["input_ids"].shape and not tensors["token_type_ids"].any()


@pytest.mark.parametrize(
    "inputs, message",
    [
        (text(b"fine", b"caf\xe9"), "sentence 1 is not UTF-8"),
        (text(b"fine", b""), "sentence 1 is empty"),
        (text(b"   \n"), "sentence 0 is empty"),
        ({"text": np.array([1.0], np.float32)}, "must be BYTES"),
        ({"text": np.array([[b"a", b"b"]], dtype=object)}, "must have shape [-1]"),
        ({"text": np.empty(0, dtype=object)}, "at least one sentence"),
        ({"input_ids": np.ones((1, 3), np.int64)}, "takes one input 'text'"),
    ],
)
def test_bad_text_is_refused_naming_the_problem(inputs: dict, message: str) -> None:
    with pytest.raises(BadRequest, match=message.replace("[", r"\[").replace("]", r"\]")):
        front().encode(inputs)


def test_config_reads_the_tokenizer_table(tmp_path: Path) -> None:
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_bytes(TOKENIZER.read_bytes())
    config = parse_config(
        {
            "deployments": [
                {"name": "t", "model_path": "m.onnx", "tokenizer": {"file": "tok/tokenizer.json", "max_length": 256}}
            ]
        },
        base_dir=tmp_path,
    )
    assert config.deployments[0].tokenizer == TokenizerSettings(tmp_path / "tok" / "tokenizer.json", 256)
    assert parse_config({"deployments": [{"name": "t", "model_path": "m.onnx"}]}).deployments[0].tokenizer is None


@pytest.mark.parametrize(
    "table, message",
    [
        ({"max_length": 8}, "file must name"),
        ({"file": str(TOKENIZER)}, "max_length is required"),
        ({"file": str(TOKENIZER), "max_length": 2}, "max_length must be in 3..8192"),
        ({"file": str(TOKENIZER), "max_length": "8"}, "max_length must be an integer"),
        ({"file": "nowhere/tokenizer.json", "max_length": 8}, "does not exist"),
        ({"file": str(TOKENIZER), "max_length": 8, "lowercase": True}, "unknown setting"),
        ("tokenizer.json", "must be a table"),
    ],
)
def test_bad_tokenizer_tables_are_config_errors(table: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"deployments": [{"name": "t", "model_path": "m.onnx", "tokenizer": table}]})


def test_a_file_that_is_no_tokenizer_and_a_model_without_token_inputs_fail_to_load(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ConfigError, match="is not a tokenizers tokenizer.json"):
        TextFrontEnd(TokenizerSettings(tmp_path / "tokenizer.json", 8), {"input_ids": np.dtype(np.int64)}, "t")
    with pytest.raises(ConfigError, match="must take input_ids"):
        TextFrontEnd(TokenizerSettings(TOKENIZER, 8), {"x": np.dtype(np.float32)}, "t")


@pytest.fixture
def client(tmp_path: Path):
    config = parse_config(
        {
            "deployments": [
                text_deployment(
                    token_model(tmp_path / "toy" / "model.onnx"), max_batch_size=8, max_queue_delay_ms=200.0
                )
            ]
        }
    )
    registry = CollectorRegistry()
    app = create_app(config, registry)
    yield app.test_client(), registry
    app.extensions["latlab"].close()


def infer(client, sentences: list[str], binary: bool = False):
    body = text_body(sentences, binary)
    response = client.post("/v2/models/toy-text/infer", data=body.data, headers=body.headers)
    length = response.headers.get(HEADER_LENGTH)
    return response, (None if length is None else int(length))


def embedding_of(response, header_length: int | None) -> np.ndarray:
    doc = response.json if header_length is None else orjson.loads(response.data[:header_length])
    (output,) = doc["outputs"]
    if header_length is None:
        return np.array(output["data"], np.float32).reshape(output["shape"])
    return np.frombuffer(response.data[header_length:], "<f4").reshape(output["shape"])


def test_metadata_shows_the_text_input_and_the_limit(client) -> None:
    doc = client[0].get("/v2/models/toy-text").json
    assert doc["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert doc["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, WIDTH]}]
    assert doc["parameters"]["max_length"] == 16
    assert client[0].get("/v2/models/toy-text/config").json["tokenizer"]["max_length"] == 16


@pytest.mark.parametrize("binary", [False, True])
def test_response_says_how_many_sentences_were_truncated(client, binary: bool) -> None:
    response, length = infer(client[0], ["short one", "long " * 40, "another " * 20], binary)
    assert response.status_code == 200, response.data[:300]
    doc = response.json if length is None else orjson.loads(response.data[:length])
    assert doc["parameters"] == {"truncated": 2}
    assert embedding_of(response, length).shape == (3, WIDTH)


def test_requests_of_different_lengths_batched_together_equal_each_alone(client) -> None:
    """Padding inside a batch: the mask keeps the padded positions out of every request's result."""
    test_client, registry = client
    sentences = ["hi", "a somewhat longer sentence, with punctuation!", "Ünïcödé wörds ✓", "long " * 40]
    alone = [embedding_of(*infer(test_client, [s])) for s in sentences]
    batched: dict[int, np.ndarray] = {}
    start = threading.Barrier(len(sentences))

    def send(index: int) -> None:
        start.wait()
        batched[index] = embedding_of(*infer(test_client, [sentences[index]]))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(sentences))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    for index, want in enumerate(alone):
        np.testing.assert_allclose(batched[index], want, rtol=1e-6, atol=1e-6)
    labels = {"deployment": "toy-text", "model": "toy", "provider": "cpu"}
    batch_sum = registry.get_sample_value("latlab_batcher_batch_size_sum", labels)
    batches = registry.get_sample_value("latlab_batcher_batch_size_count", labels)
    assert batch_sum / batches > 1  # some requests really shared a batch
    assert registry.get_sample_value("latlab_server_preprocess_duration_seconds_count", labels) == 2 * len(sentences)


def test_a_bad_sentence_fails_its_request_alone(client) -> None:
    test_client, _ = client
    bad = b'{"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["fine", ""]}]}'
    answers: dict[str, object] = {}
    start = threading.Barrier(2)

    def send_bad() -> None:
        start.wait()
        answers["bad"] = test_client.post(
            "/v2/models/toy-text/infer", data=bad, headers={"Content-Type": "application/json"}
        )

    def send_good() -> None:
        start.wait()
        answers["good"] = infer(test_client, ["a valid sentence"])[0]

    threads = [threading.Thread(target=send_bad), threading.Thread(target=send_good)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert answers["bad"].status_code == 400 and "sentence 1 is empty" in answers["bad"].json["error"]
    assert answers["good"].status_code == 200


def test_decoded_text_reaches_the_tokenizer_as_sent() -> None:
    """The protocol keeps BYTES elements as bytes; the front end decodes them once (UTF-8)."""
    body = text_body(["Grüße ✓"], binary=True)
    request = decode_request(body.data, int(body.headers[HEADER_LENGTH]))
    tensors, _ = front().encode(request.inputs)
    reference = Tokenizer.from_file(str(TOKENIZER))
    reference.no_padding()  # the file pads to 128 itself; the server pads only inside a batch
    assert list(tensors["input_ids"][0]) == reference.encode("Grüße ✓").ids


@pytest.mark.gpu
def test_a_text_deployment_on_cuda_equals_the_cpu_one(tmp_path: Path) -> None:
    """The tokenizer runs on the host either way; the token tensors go to the device through I/O binding."""
    from latlab.server.runtime.providers import provider_load_error

    if provider_load_error("CUDAExecutionProvider"):
        pytest.skip("CUDAExecutionProvider does not load here")
    model = token_model(tmp_path / "toy" / "model.onnx")
    cpu = {**text_deployment(model, max_batch_size=4), "name": "on-cpu"}
    gpu = {**text_deployment(model, max_batch_size=4), "name": "on-cuda", "provider": "cuda"}
    app = create_app(parse_config({"deployments": [cpu, gpu]}), CollectorRegistry())
    try:
        body = text_body(["a sentence on the device", "long " * 40])
        answers = [
            app.test_client().post(f"/v2/models/{name}/infer", data=body.data, headers=body.headers)
            for name in ("on-cpu", "on-cuda")
        ]
        assert [a.status_code for a in answers] == [200, 200]
        assert app.extensions["latlab"].deployments["on-cuda"].model.bound
        np.testing.assert_allclose(embedding_of(answers[1], None), embedding_of(answers[0], None), rtol=1e-5, atol=1e-6)
        assert answers[1].json["parameters"] == {"truncated": 1}
    finally:
        app.extensions["latlab"].close()
