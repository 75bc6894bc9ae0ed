"""The load generator's bodies decode, with the server's own decoder, to valid inputs of the model."""

import numpy as np
import pytest

from latlab.loadtest.payloads import BODY_BUDGET_BYTES, HEADER_LENGTH, PayloadOptions, random_bodies, text_body
from latlab.server.protocol import decode_request

TOKENS = {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]},
                     {"name": "attention_mask", "datatype": "INT64", "shape": [-1, -1]}]}
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
