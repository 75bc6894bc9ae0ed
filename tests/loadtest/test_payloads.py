"""The load generator's bodies decode, with the server's own decoder, to valid inputs of the model."""

import numpy as np
import pytest

from latlab.loadtest.payloads import (
    BODY_BUDGET_BYTES,
    HEADER_LENGTH,
    check_samples,
    load_samples,
    random_bodies,
    request_bodies,
    save_samples,
    text_body,
)
from latlab.loadtest.plan import PayloadOptions
from latlab.server.protocol import decode_request

TOKENS = {
    "inputs": [
        {"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]},
        {"name": "attention_mask", "datatype": "INT64", "shape": [-1, -1]},
    ]
}
IMAGE = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3, 224, 224]}]}


def _decode(body):
    length = body.headers.get(HEADER_LENGTH)
    return decode_request(body.data, int(length) if length else None)


@pytest.mark.parametrize("binary", [False, True])
def test_token_bodies_have_the_sequence_length_and_a_mask_of_ones(binary):
    bodies = random_bodies(TOKENS, seed=1, options=PayloadOptions(binary=binary, seq_len=16))
    request = _decode(bodies[0])
    assert request.inputs["input_ids"].shape == (1, 16) and request.inputs["input_ids"].dtype == np.int64
    assert (request.inputs["attention_mask"] == 1).all()
    assert request.inputs["input_ids"].min() >= 0
    assert request.binary_outputs if binary else not request.binary_outputs


def test_binary_and_json_carry_the_same_kind_of_tensor_and_binary_is_smaller():
    as_json = random_bodies(IMAGE, seed=2, options=PayloadOptions(binary=False))
    as_binary = random_bodies(IMAGE, seed=2, options=PayloadOptions(binary=True))
    a, b = _decode(as_json[0]).inputs["x"], _decode(as_binary[0]).inputs["x"]
    assert a.shape == b.shape == (1, 3, 224, 224) and a.dtype == b.dtype == np.float32
    np.testing.assert_array_equal(a, b)  # same seed, same values: only the encoding differs
    assert len(as_binary[0].data) < len(as_json[0].data) / 2
    assert sum(len(x.data) for x in as_json) <= BODY_BUDGET_BYTES + len(as_json[0].data)


def test_an_input_the_generator_cannot_fill_is_named():
    with pytest.raises(ValueError, match="'x' has datatype BF16"):
        random_bodies({"inputs": [{"name": "x", "datatype": "BF16", "shape": [-1]}]}, seed=0)


TEXT = {"name": "minilm-text", "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}]}


def _tokenizer():
    from tokenizers import Tokenizer

    from latlab.export.minilm import model_dir

    tokenizer = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


@pytest.mark.parametrize("binary", [False, True])
def test_text_bodies_are_one_sentence_of_exactly_the_asked_tokens(binary):
    """Counted with the model's own tokenizer: [CLS] + words + period + [SEP] is seq_len tokens."""
    tokenizer = _tokenizer()
    bodies = random_bodies(TEXT, seed=3, options=PayloadOptions(binary=binary, seq_len=24, text=True))
    assert len(bodies) > 1 and len({b.data for b in bodies}) == len(bodies)  # varied sentences
    for body in bodies:
        (sentence,) = _decode(body).inputs["text"]
        assert len(tokenizer.encode(sentence.decode("utf-8")).ids) == 24


def test_text_lengths_follow_a_uniform_distribution_when_a_maximum_is_given():
    tokenizer = _tokenizer()
    bodies = random_bodies(TEXT, seed=4, options=PayloadOptions(seq_len=8, seq_len_max=40))
    lengths = {len(tokenizer.encode(_decode(b).inputs["text"][0].decode()).ids) for b in bodies}
    assert min(lengths) >= 8 and max(lengths) <= 40 and len(lengths) > 5


def test_every_shipped_word_is_one_token_of_the_models_vocabulary():
    from latlab.loadtest.sentences import WORDS

    tokenizer = _tokenizer()
    assert [w for w in WORDS if len(tokenizer.encode(w, add_special_tokens=False).ids) != 1] == []


def test_text_asked_of_a_token_model_is_refused_by_name():
    with pytest.raises(ValueError, match="takes no text"):
        random_bodies(TOKENS, seed=0, options=PayloadOptions(text=True))


@pytest.mark.parametrize("binary", [False, True])
def test_text_body_carries_any_utf8_sentence_unchanged(binary):
    sentences = ["Grüße aus Köln — ✓", "plain", "汉字 and emoji 🙂"]
    request = _decode(text_body(sentences, binary=binary))
    assert [s.decode("utf-8") for s in request.inputs["text"]] == sentences


@pytest.mark.parametrize("binary", [False, True])
def test_sample_rows_are_sent_one_per_request_as_given(tmp_path, binary):
    ids = np.arange(5 * 16, dtype=np.int64).reshape(5, 16)
    mask = np.tri(5, 16, dtype=np.int64)
    save_samples(tmp_path / "samples.npz", {"input_ids": ids, "attention_mask": mask})
    options = PayloadOptions(binary=binary, inputs=str(tmp_path / "samples.npz"))
    bodies = request_bodies(TOKENS, seed=0, options=options)
    assert len(bodies) == 5
    for row, body in enumerate(bodies):
        sent = _decode(body).inputs
        np.testing.assert_array_equal(sent["input_ids"], ids[row : row + 1])
        np.testing.assert_array_equal(sent["attention_mask"], mask[row : row + 1])


def test_samples_are_saved_under_any_input_name_and_read_back(tmp_path):
    arrays = {"file": np.ones((2, 3), np.float32), "input.1": np.arange(4, dtype=np.int32).reshape(2, 2)}
    save_samples(tmp_path / "s.npz", arrays)  # numpy.savez(path, file=...) would refuse the first name
    loaded = load_samples(tmp_path / "s.npz")
    assert loaded.keys() == arrays.keys()
    assert all(loaded[n].dtype == a.dtype and (loaded[n] == a).all() for n, a in arrays.items())


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"input_ids": np.zeros((2, 4), np.int64)}, r"missing \['attention_mask'\]"),
        (
            {"input_ids": np.zeros((2, 4), np.int32), "attention_mask": np.ones((2, 4), np.int64)},
            "'input_ids' is INT64, but its samples are int32",
        ),
        ({"input_ids": np.zeros((2, 4, 1), np.int64), "attention_mask": np.ones((2, 4), np.int64)}, "has shape"),
    ],
)
def test_samples_that_do_not_fit_the_model_are_named(arrays, message):
    with pytest.raises(ValueError, match=message):
        check_samples(TOKENS, arrays)
    with pytest.raises(ValueError, match="has shape"):
        check_samples(IMAGE, {"x": np.zeros((1, 3, 224, 225), np.float32)})  # a fixed size differs


def test_a_file_that_is_not_an_npz_of_rows_is_refused_in_one_line(tmp_path):
    np.save(tmp_path / "one.npy", np.zeros(3))
    (tmp_path / "text.npz").write_text("hello")
    np.savez(tmp_path / "ragged.npz", a=np.zeros((2, 1)), b=np.zeros((3, 1)))
    np.savez(tmp_path / "empty.npz")
    for name, message in (
        ("one.npy", "one unnamed array"),
        ("text.npz", "not an .npz of named arrays"),
        ("ragged.npz", "same number of rows"),
        ("empty.npz", "holds no arrays"),
        ("missing.npz", "does not exist"),
    ):
        with pytest.raises(ValueError, match=message) as caught:
            load_samples(tmp_path / name)
        assert "\n" not in str(caught.value)


def test_loadtest_refuses_a_sample_file_it_cannot_read_before_any_load(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "latlab.cli",
            "loadtest",
            "--host",
            "http://127.0.0.1:9",
            "--deployment",
            "tiny",
            "--inputs",
            str(tmp_path / "missing.npz"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        f"latlab: error: --inputs: sample file {tmp_path / 'missing.npz'} does not exist"
    ]
    assert not out.exists()  # a refused run leaves no folder behind
