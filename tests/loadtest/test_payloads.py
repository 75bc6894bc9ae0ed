"""The load generator's bodies decode, with the server's own decoder, to valid inputs of the model."""

import numpy as np
import pytest

from latlab.loadtest.payloads import BODY_BUDGET_BYTES, HEADER_LENGTH, PayloadOptions, random_bodies
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
    with pytest.raises(ValueError, match="'text' has datatype BYTES"):
        random_bodies({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}]}, seed=0)
