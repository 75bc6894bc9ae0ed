"""latlab.server.protocol: JSON and binary tensors <-> numpy, requested outputs and every malformed body."""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latlab.server.errors import BadRequest
from latlab.server.protocol import (
    DATATYPES,
    HEADER_LENGTH,
    InferRequest,
    _from_json_data,
    datatype_of,
    decode_request,
    encode_error,
    encode_response,
)

# BYTES elements: empty, ASCII, multi-byte UTF-8, a NUL inside, and long enough for a multi-byte length.
BYTES_EDGES = [b"", b"a", "h\u00e9llo \u2603".encode(), b"nul\x00inside", b"x" * 300]


def bytes_array(values: list[bytes], shape: tuple[int, ...]) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array.reshape(shape)


def bytes_wire(array: np.ndarray) -> bytes:
    """BYTES the way a client writes them: per element a 4-byte little-endian length, then the bytes."""
    return b"".join(len(item).to_bytes(4, "little") + item for item in array.flat)


# Values at each datatype's edges, so a narrowing or sign slip shows.
def sample(datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    dtype = DATATYPES[datatype]
    count = int(np.prod(shape))
    if datatype == "BYTES":
        return bytes_array([BYTES_EDGES[i % len(BYTES_EDGES)] for i in range(count)], shape)
    if dtype.kind == "b":
        values = [i % 3 == 0 for i in range(count)]
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        edges = [int(info.min), int(info.max), 0, 1, int(info.max) - 1]
        values = [edges[i % len(edges)] for i in range(count)]
    else:
        info = np.finfo(dtype)
        edges = [0.0, -2.5, 1.5, float(info.max), float(info.tiny), -0.125]
        values = [edges[i % len(edges)] for i in range(count)]
    return np.array(values, dtype=dtype).reshape(shape)


def json_body(*inputs: dict, **extra: object) -> bytes:
    return orjson.dumps({"inputs": list(inputs), **extra})


def json_tensor(name: str, array: np.ndarray, nested: bool = False) -> dict:
    if array.dtype == object:
        array = np.vectorize(bytes.decode, otypes=[object])(array)
    data = array.tolist() if nested else array.reshape(-1).tolist()
    return {"name": name, "shape": list(array.shape), "datatype": datatype_of(array.dtype), "data": data}


def binary_tensor(name: str, array: np.ndarray) -> tuple[dict, bytes]:
    raw = bytes_wire(array) if array.dtype == object else array.astype(array.dtype.newbyteorder("<")).tobytes()
    return (
        {
            "name": name,
            "shape": list(array.shape),
            "datatype": datatype_of(array.dtype),
            "parameters": {"binary_data_size": len(raw)},
        },
        raw,
    )


def binary_body(doc: dict, *chunks: bytes) -> tuple[bytes, int]:
    header = orjson.dumps(doc)
    return header + b"".join(chunks), len(header)


def decode_response(body: bytes, header_length: int | None) -> tuple[dict, dict[str, np.ndarray]]:
    """Parse a response the way a client would: JSON header, then binary outputs in order."""
    doc = orjson.loads(body if header_length is None else body[:header_length])
    arrays, offset = {}, header_length or 0
    for tensor in doc["outputs"]:
        dtype = DATATYPES[tensor["datatype"]]
        if tensor["datatype"] == "BYTES":
            arrays[tensor["name"]], offset = client_bytes(tensor, body, offset)
        elif "data" in tensor:
            arrays[tensor["name"]] = np.array(tensor["data"], dtype=dtype).reshape(tensor["shape"])
        else:
            size = tensor["parameters"]["binary_data_size"]
            raw = body[offset : offset + size]
            arrays[tensor["name"]] = np.frombuffer(raw, dtype=dtype.newbyteorder("<")).reshape(tensor["shape"])
            offset += size
    assert offset == len(body) or header_length is None
    return doc, arrays


def client_bytes(tensor: dict, body: bytes, offset: int) -> tuple[np.ndarray, int]:
    """A BYTES output as a client reads it: JSON strings, or length-prefixed elements in the binary part."""
    if "data" in tensor:
        return bytes_array([text.encode() for text in tensor["data"]], tuple(tensor["shape"])), offset
    end, values = offset + tensor["parameters"]["binary_data_size"], []
    while offset < end:
        length = int.from_bytes(body[offset : offset + 4], "little")
        values.append(body[offset + 4 : offset + 4 + length])
        offset += 4 + length
    return bytes_array(values, tuple(tensor["shape"])), offset


def assert_same(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    np.testing.assert_array_equal(actual, expected)


ALL = sorted(DATATYPES)


# --- datatype_of -----------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", ALL)
def test_datatype_of_names_every_dtype(datatype: str) -> None:
    assert datatype_of(DATATYPES[datatype]) == datatype


@pytest.mark.parametrize("datatype", [d for d in ALL if DATATYPES[d].itemsize > 1 and d != "BYTES"])
def test_datatype_of_ignores_byte_order(datatype: str) -> None:
    assert datatype_of(DATATYPES[datatype].newbyteorder(">")) == datatype
    assert datatype_of(DATATYPES[datatype].newbyteorder("<")) == datatype


def test_datatype_of_accepts_scalar_types() -> None:
    assert datatype_of(np.float32) == "FP32"
    assert datatype_of(np.int64) == "INT64"


@pytest.mark.parametrize("dtype", [np.complex64, np.dtype("U3"), np.dtype("S3"), np.dtype("datetime64[s]")])
def test_datatype_of_refuses_dtypes_without_protocol_name(dtype: object) -> None:
    with pytest.raises(BadRequest, match="no Open Inference Protocol datatype"):
        datatype_of(dtype)


def test_datatypes_cover_every_protocol_type() -> None:
    assert set(DATATYPES) == {
        "BOOL",
        "UINT8",
        "UINT16",
        "UINT32",
        "UINT64",
        "INT8",
        "INT16",
        "INT32",
        "INT64",
        "FP16",
        "FP32",
        "FP64",
        "BYTES",
    }
    assert datatype_of(np.dtype(object)) == "BYTES"


# --- JSON round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
@pytest.mark.parametrize("datatype", ALL)
def test_json_data_round_trips(datatype: str, nested: bool) -> None:
    array = sample(datatype, (2, 3))
    request = decode_request(json_body(json_tensor("a", array, nested)))
    assert list(request.inputs) == ["a"]
    assert_same(request.inputs["a"], array)

    body, header_length = encode_response("m", "1", request, request.inputs)
    assert header_length is None
    doc, outputs = decode_response(body, None)
    [tensor] = doc["outputs"]
    assert {k: v for k, v in tensor.items() if k != "data"} == {"name": "a", "datatype": datatype, "shape": [2, 3]}
    assert len(tensor["data"]) == 6  # flat on the wire, whatever the request's nesting
    assert_same(outputs["a"], array)  # exact after parsing back as the datatype (floats print shortest)


@pytest.mark.parametrize("datatype", ALL)
def test_binary_data_round_trips(datatype: str) -> None:
    array = sample(datatype, (3, 2))
    tensor, raw = binary_tensor("a", array)
    body, header_length = binary_body(
        {"inputs": [tensor], "outputs": [{"name": "a", "parameters": {"binary_data": True}}]}, raw
    )
    request = decode_request(body, header_length)
    assert_same(request.inputs["a"], array)
    assert request.binary_outputs == {"a"}

    out, out_header = encode_response("m", "1", request, request.inputs)
    assert out_header is not None
    doc, outputs = decode_response(out, out_header)
    assert doc["outputs"] == [
        {"name": "a", "datatype": datatype, "shape": [3, 2], "parameters": {"binary_data_size": len(raw)}}
    ]
    assert out[out_header:] == raw  # little-endian bytes on the wire, exactly
    assert_same(outputs["a"], array)


def test_binary_outputs_are_little_endian_even_from_big_endian_arrays() -> None:
    native = np.arange(4, dtype=np.int32)
    request = InferRequest(inputs={}, binary_outputs={"*"})
    body, header_length = encode_response("m", "1", request, {"y": native.astype(">i4")})
    assert body[header_length:] == native.astype("<i4").tobytes()


def test_binary_input_decoding_reads_little_endian() -> None:
    raw = np.array([1, 256], dtype="<u2").tobytes()
    body, header_length = binary_body(
        {"inputs": [{"name": "a", "shape": [2], "datatype": "UINT16", "parameters": {"binary_data_size": 4}}]}, raw
    )
    assert decode_request(body, header_length).inputs["a"].tolist() == [1, 256]


def test_several_binary_inputs_are_read_in_order() -> None:
    a, b = sample("FP32", (2, 2)), sample("INT8", (5,))
    (ta, ra), (tb, rb) = binary_tensor("a", a), binary_tensor("b", b)
    body, header_length = binary_body({"inputs": [ta, tb]}, ra, rb)
    request = decode_request(body, header_length)
    assert_same(request.inputs["a"], a)
    assert_same(request.inputs["b"], b)


def test_binary_and_json_inputs_mix() -> None:
    a, b = sample("FP64", (2,)), sample("UINT32", (3,))
    ta, ra = binary_tensor("a", a)
    body, header_length = binary_body({"inputs": [json_tensor("b", b), ta]}, ra)
    request = decode_request(body, header_length)
    assert list(request.inputs) == ["b", "a"]
    assert_same(request.inputs["a"], a)
    assert_same(request.inputs["b"], b)


def test_header_length_equal_to_body_means_json_only() -> None:
    body = json_body(json_tensor("a", sample("INT16", (2,))))
    assert_same(decode_request(body, len(body)).inputs["a"], sample("INT16", (2,)))


def test_scalar_and_empty_shapes() -> None:
    scalar = decode_request(json_body({"name": "s", "shape": [], "datatype": "FP32", "data": [2.5]})).inputs["s"]
    assert scalar.shape == () and scalar == np.float32(2.5)
    empty = decode_request(json_body({"name": "e", "shape": [0, 3], "datatype": "INT64", "data": []})).inputs["e"]
    assert empty.shape == (0, 3) and empty.dtype == np.int64


def test_json_data_is_reshaped_to_the_declared_shape() -> None:
    request = decode_request(json_body({"name": "a", "shape": [2, 2], "datatype": "INT32", "data": [1, 2, 3, 4]}))
    assert request.inputs["a"].tolist() == [[1, 2], [3, 4]]


def test_multidimensional_output_is_flattened_in_row_major_order() -> None:
    array = np.arange(6, dtype=np.float64).reshape(2, 3).T  # not C-contiguous
    body, _ = encode_response("m", "1", InferRequest(inputs={}), {"y": array})
    tensor = orjson.loads(body)["outputs"][0]
    assert tensor["shape"] == [3, 2]
    assert tensor["data"] == [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]


# --- id, parameters and requested outputs ----------------------------------------------------------


def test_id_is_echoed() -> None:
    request = decode_request(json_body(json_tensor("a", sample("FP32", (1,))), id="req-42"))
    assert request.id == "req-42"
    doc = orjson.loads(encode_response("m", "7", request, request.inputs)[0])
    assert doc["id"] == "req-42"
    assert doc["model_name"] == "m" and doc["model_version"] == "7"


def test_no_id_no_id_in_response() -> None:
    request = decode_request(json_body(json_tensor("a", sample("FP32", (1,)))))
    assert request.id is None
    assert "id" not in orjson.loads(encode_response("m", "1", request, request.inputs)[0])


def test_id_must_be_a_string() -> None:
    with pytest.raises(BadRequest, match="'id' must be a string"):
        decode_request(json_body(json_tensor("a", sample("FP32", (1,))), id=5))


def test_request_parameters_are_kept() -> None:
    request = decode_request(json_body(json_tensor("a", sample("FP32", (1,))), parameters={"priority": 3}))
    assert request.parameters == {"priority": 3}


def test_no_outputs_requested_means_all_as_json() -> None:
    request = decode_request(json_body(json_tensor("a", sample("FP32", (1,)))))
    assert request.outputs is None
    assert request.binary_outputs == set()
    body, header_length = encode_response("m", "1", request, {"y": np.ones(2, np.float32), "z": np.zeros(1, np.int8)})
    assert header_length is None
    assert [t["name"] for t in orjson.loads(body)["outputs"]] == ["y", "z"]


def test_requested_outputs_are_listed_in_order_and_binary_only_where_asked() -> None:
    request = decode_request(
        json_body(
            json_tensor("a", sample("FP32", (1,))),
            outputs=[
                {"name": "z"},
                {"name": "y", "parameters": {"binary_data": True}},
                {"name": "w", "parameters": {"binary_data": False}},
            ],
        )
    )
    assert request.outputs == ["z", "y", "w"]
    assert request.binary_outputs == {"y"}

    y, z = np.array([1.0, 2.0], np.float32), np.array([3], np.int64)
    body, header_length = encode_response("m", "1", request, {"y": y, "z": z})
    doc, arrays = decode_response(body, header_length)
    by_name = {t["name"]: t for t in doc["outputs"]}
    assert by_name["z"]["data"] == [3]
    assert by_name["y"]["parameters"] == {"binary_data_size": 8} and "data" not in by_name["y"]
    assert_same(arrays["y"], y)


def test_binary_data_output_makes_every_output_binary() -> None:
    request = decode_request(json_body(json_tensor("a", sample("FP32", (1,))), parameters={"binary_data_output": True}))
    assert request.outputs is None and request.binary_outputs == {"*"}
    y, z = sample("FP16", (2, 2)), sample("UINT64", (3,))
    body, header_length = encode_response("m", "1", request, {"y": y, "z": z})
    doc, arrays = decode_response(body, header_length)
    assert all("data" not in t for t in doc["outputs"])
    assert_same(arrays["y"], y)
    assert_same(arrays["z"], z)


def test_binary_data_output_applies_to_named_outputs_too() -> None:
    request = decode_request(
        json_body(
            json_tensor("a", sample("FP32", (1,))),
            parameters={"binary_data_output": True},
            outputs=[{"name": "y", "parameters": {"binary_data": False}}, {"name": "z"}],
        )
    )
    assert request.outputs == ["y", "z"]
    assert request.binary_outputs == {"y", "z"}


def test_binary_data_output_false_keeps_json() -> None:
    request = decode_request(
        json_body(json_tensor("a", sample("FP32", (1,))), parameters={"binary_data_output": False})
    )
    assert request.binary_outputs == set()


def test_empty_outputs_list_asks_for_nothing() -> None:
    request = decode_request(json_body(json_tensor("a", sample("FP32", (1,))), outputs=[]))
    assert request.outputs == []


def test_encode_error_is_the_protocol_error_body() -> None:
    assert orjson.loads(encode_error("model 'x' is gone")) == {"error": "model 'x' is gone"}


def test_header_length_name() -> None:
    assert HEADER_LENGTH == "Inference-Header-Content-Length"


# --- malformed requests ----------------------------------------------------------------------------

GOOD = {"name": "a", "shape": [2], "datatype": "FP32", "data": [1.0, 2.0]}


def with_(**changes: object) -> dict:
    tensor = dict(GOOD)
    for key, value in changes.items():
        if value is None:
            tensor.pop(key, None)
        else:
            tensor[key] = value
    return tensor


@pytest.mark.parametrize(
    "body, message",
    [
        (b"{not json", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'"inputs"', "must be a JSON object"),
        (b"null", "must be a JSON object"),
        (b"{}", "'inputs' must be a non-empty list"),
        (orjson.dumps({"inputs": []}), "'inputs' must be a non-empty list"),
        (orjson.dumps({"inputs": {"a": GOOD}}), "'inputs' must be a non-empty list"),
        (orjson.dumps({"inputs": ["a"]}), "each input must be an object"),
        (json_body(with_(name=None)), "has no 'name'"),
        (json_body(with_(name="")), "has no 'name'"),
        (json_body(with_(name=3)), "has no 'name'"),
        (json_body(with_(shape=None)), "input 'a': 'shape' must be a list of non-negative integers"),
        (json_body(with_(shape="2")), "'shape' must be a list of non-negative integers"),
        (json_body(with_(shape=[-2])), "'shape' must be a list of non-negative integers"),
        (json_body(with_(shape=[2.0])), "'shape' must be a list of non-negative integers"),
        (json_body(with_(shape=[True, 2])), "'shape' must be a list of non-negative integers"),
        (json_body(with_(datatype="FLOAT32")), "unsupported datatype 'FLOAT32'"),
        (
            json_body(with_(datatype="BYTES")),
            "input 'a': data is not a valid BYTES array: BYTES elements must be strings",
        ),
        (json_body(with_(datatype=None)), "unsupported datatype None"),
        (json_body(with_(data=None)), "input 'a' has neither 'data' nor parameters.binary_data_size"),
        (json_body(with_(data=[1.0, 2.0, 3.0])), "shape [2] needs 2 elements but data has 3"),
        (json_body(with_(data=[1.0])), "shape [2] needs 2 elements but data has 1"),
        (json_body(with_(shape=[2, 2])), "shape [2, 2] needs 4 elements but data has 2"),
        (json_body(with_(data=[[1.0], [2.0, 3.0]])), "input 'a': data is not a valid FP32 array"),
        (json_body(with_(data=["x", "y"])), "input 'a': data is not a valid FP32 array"),
        (json_body(with_(datatype="UINT8", data=[1, 256])), "input 'a': data is not a valid UINT8 array"),
        (json_body(with_(datatype="INT8", data=[-129, 0])), "input 'a': data is not a valid INT8 array"),
        (json_body(with_(datatype="UINT64", data=[-1, 0])), "input 'a': data is not a valid UINT64 array"),
        (json_body(GOOD, GOOD), "input 'a' is given twice"),
        (json_body(GOOD, parameters=[1]), "'parameters' of the request must be an object"),
        (json_body(with_(parameters="binary")), "'parameters' of the input 'a' must be an object"),
        (json_body(GOOD, outputs={"name": "y"}), "'outputs' must be a list"),
        (json_body(GOOD, outputs=["y"]), "each requested output must be an object with a 'name'"),
        (json_body(GOOD, outputs=[{"name": 1}]), "each requested output must be an object with a 'name'"),
        (json_body(GOOD, outputs=[{"name": "y", "parameters": 1}]), "'parameters' of the output 'y' must be an object"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_malformed_json_requests_name_the_problem(body: bytes, message: str) -> None:
    with pytest.raises(BadRequest) as caught:
        decode_request(body)
    assert message in str(caught.value)


def binary_request(
    size: object, raw: bytes, shape: list[int] | None = None, datatype: str = "FP32"
) -> tuple[bytes, int]:
    tensor = {"name": "a", "shape": shape or [2], "datatype": datatype, "parameters": {"binary_data_size": size}}
    return binary_body({"inputs": [tensor]}, raw)


@pytest.mark.parametrize(
    "size, raw, message",
    [
        (4, b"\0" * 4, "binary_data_size is 4 but shape [2] of FP32 needs 8"),
        (16, b"\0" * 16, "binary_data_size is 16 but shape [2] of FP32 needs 8"),
        ("8", b"\0" * 8, "binary_data_size is '8' but shape [2] of FP32 needs 8"),
        (8.0, b"\0" * 8, "binary_data_size is 8.0"),
        (True, b"\0" * 8, "binary_data_size is True"),
        (8, b"\0" * 7, "binary_data_size 8 runs past the end of the body"),
        (8, b"", "runs past the end of the body"),
        (8, b"\0" * 9, "binary part has 9 bytes but the inputs use 8"),
    ],
)
def test_malformed_binary_requests_name_the_problem(size: object, raw: bytes, message: str) -> None:
    body, header_length = binary_request(size, raw)
    with pytest.raises(BadRequest) as caught:
        decode_request(body, header_length)
    assert message in str(caught.value)


def test_leftover_bytes_after_json_inputs_are_refused() -> None:
    header = json_body(GOOD)
    with pytest.raises(BadRequest, match="binary part has 3 bytes but the inputs use 0"):
        decode_request(header + b"abc", len(header))


def test_second_binary_input_running_past_the_end() -> None:
    (ta, ra), (tb, rb) = binary_tensor("a", sample("FP32", (2,))), binary_tensor("b", sample("FP32", (2,)))
    body, header_length = binary_body({"inputs": [ta, tb]}, ra, rb[:-1])
    with pytest.raises(BadRequest, match="input 'b': binary_data_size 8 runs past the end"):
        decode_request(body, header_length)


def test_duplicate_binary_input_is_refused() -> None:
    ta, ra = binary_tensor("a", sample("INT32", (2,)))
    body, header_length = binary_body({"inputs": [ta, ta]}, ra, ra)
    with pytest.raises(BadRequest, match="input 'a' is given twice"):
        decode_request(body, header_length)


@pytest.mark.parametrize("extra", [1, 100])
def test_header_length_beyond_body_is_refused(extra: int) -> None:
    body = json_body(GOOD)
    with pytest.raises(BadRequest) as caught:
        decode_request(body, len(body) + extra)
    assert HEADER_LENGTH in str(caught.value)
    assert f"is {len(body) + extra} but the body has {len(body)} bytes" in str(caught.value)


def test_negative_header_length_is_refused() -> None:
    with pytest.raises(BadRequest, match=f"{HEADER_LENGTH} is -1"):
        decode_request(json_body(GOOD), -1)


def test_header_length_cutting_the_json_is_invalid_json() -> None:
    body = json_body(GOOD)
    with pytest.raises(BadRequest, match="not valid JSON"):
        decode_request(body, len(body) - 1)


@pytest.mark.parametrize(
    "datatype, data",
    [
        ("INT32", [1.5, 2.7]),  # would truncate to [1, 2]
        ("FP32", ["1.5", "2"]),  # strings parsed as numbers
        ("FP32", [None, 2.0]),  # null becomes NaN
        ("BOOL", [2, 0]),  # 2 becomes True
    ],
)
def test_json_data_of_the_wrong_kind_is_refused(datatype: str, data: list) -> None:
    """Data whose JSON type does not match the datatype must be a 400, never silently coerced."""
    with pytest.raises(BadRequest, match=f"input 'a': data is not a valid {datatype} array"):
        decode_request(json_body({"name": "a", "shape": [2], "datatype": datatype, "data": data}))


FLOAT_EDGES = [
    0.0,
    -0.0,
    1.5,
    -2.25e-8,
    3.4028234663852886e38,
    3.4028235677973366e38,
    3.5e38,
    1e39,
    65504.0,
    65520.0,
    7e4,
    1.7976931348623157e308,
    5e-324,
    1e-46,
    7,
    -3,
    2**63,
    2**70,
    2**1030,
]


def decoded_or_refused(decode) -> tuple[str, np.ndarray | None]:
    try:
        return "ok", decode()
    except BadRequest as exc:
        return str(exc), None


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64"])
@pytest.mark.parametrize(
    "data",
    [[x] for x in FLOAT_EDGES]
    + [FLOAT_EDGES, [1.0, "2"], ["1.5"], [None], [1.0, None], [[1.0], 2.0], [1.0, [2.0]], [{"a": 1}], [1.0, 2**70]],
)
def test_the_float_fast_path_decodes_and_refuses_exactly_as_numpy(datatype: str, data: list) -> None:
    """A flat JSON list for a float datatype is packed by struct, not converted by numpy: values, dtype and
    every refusal (a value the type cannot hold, a string, a null, a nested list) must be the same."""
    fast = decoded_or_refused(lambda: _from_json_data("a", data, datatype, [len(data)], booleans=False))
    general = decoded_or_refused(lambda: _from_json_data("a", data, datatype, [len(data)], booleans=True))
    assert fast[0] == general[0]
    if general[1] is not None:
        assert fast[1] is not None and fast[1].dtype == general[1].dtype == DATATYPES[datatype]
        np.testing.assert_array_equal(fast[1], general[1])


@given(
    st.lists(st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers()), min_size=1, max_size=40),
    st.sampled_from(["FP16", "FP32", "FP64"]),
)
@settings(max_examples=300, deadline=None)
def test_the_float_fast_path_agrees_with_numpy_on_any_numbers(data: list, datatype: str) -> None:
    fast = decoded_or_refused(lambda: _from_json_data("a", data, datatype, [len(data)], booleans=False))
    general = decoded_or_refused(lambda: _from_json_data("a", data, datatype, [len(data)], booleans=True))
    assert fast[0] == general[0]
    if general[1] is not None:
        np.testing.assert_array_equal(fast[1], general[1])


def test_booleans_in_float_data_are_refused_and_a_true_elsewhere_changes_nothing() -> None:
    """struct would pack true as 1.0: a JSON boolean anywhere sends the body down numpy's path, which refuses
    booleans for a float datatype, and decodes every other input just the same."""
    with pytest.raises(BadRequest, match="got boolean values"):
        decode_request(json_body({"name": "a", "shape": [2], "datatype": "FP32", "data": [True, False]}))
    data = [0.5, -1.0, 3.4028234663852886e38]
    plain = decode_request(json_body({"name": "a", "shape": [3], "datatype": "FP32", "data": data}))
    flagged = decode_request(
        json_body(
            {"name": "a", "shape": [3], "datatype": "FP32", "data": data},
            id="true",
            parameters={"binary_data_output": True},
        )
    )
    np.testing.assert_array_equal(plain.inputs["a"], flagged.inputs["a"])
    assert plain.inputs["a"].dtype == flagged.inputs["a"].dtype == np.float32


def test_json_float_inputs_are_marked_finite_and_binary_ones_are_not() -> None:
    """Validation skips the NaN search for `finite` inputs: only JSON floats (which cannot carry NaN) go there."""
    header = {
        "inputs": [
            {"name": "j", "shape": [1], "datatype": "FP32", "data": [1.0]},
            {"name": "i", "shape": [1], "datatype": "INT32", "data": [1]},
            {"name": "b", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": 4}},
        ]
    }
    raw = orjson.dumps(header)
    request = decode_request(raw + np.array([np.nan], np.float32).tobytes(), len(raw))
    assert request.finite == {"j"} and np.isnan(request.inputs["b"][0])


# --- BYTES -----------------------------------------------------------------------------------------


def test_bytes_json_strings_become_utf8_bytes_in_an_object_array() -> None:
    request = decode_request(
        json_body({"name": "s", "shape": [2, 2], "datatype": "BYTES", "data": [["a", "h\u00e9"], ["", "\u2603"]]})
    )
    array = request.inputs["s"]
    assert array.dtype == object and array.shape == (2, 2)
    assert array.tolist() == [[b"a", "h\u00e9".encode()], [b"", "\u2603".encode()]]


def test_bytes_binary_keeps_bytes_that_are_not_utf8() -> None:
    array = bytes_array([b"\xff\xfe", b"", b"\x00"], (3,))
    tensor, raw = binary_tensor("s", array)
    assert raw == b"\x02\x00\x00\x00\xff\xfe" + b"\x00\x00\x00\x00" + b"\x01\x00\x00\x00\x00"
    body, header_length = binary_body({"inputs": [tensor]}, raw)
    assert_same(decode_request(body, header_length).inputs["s"], array)


def test_bytes_and_numeric_binary_inputs_are_read_in_order() -> None:
    (ts, rs), (tx, rx) = binary_tensor("s", sample("BYTES", (2,))), binary_tensor("x", sample("FP32", (2,)))
    body, header_length = binary_body({"inputs": [ts, tx]}, rs, rx)
    request = decode_request(body, header_length)
    assert_same(request.inputs["s"], sample("BYTES", (2,)))
    assert_same(request.inputs["x"], sample("FP32", (2,)))


def test_bytes_outputs_from_onnx_runtime_strings_are_sent_as_utf8() -> None:
    strings = np.array(["caf\u00e9", ""], dtype=object)  # ORT returns tensor(string) as str elements
    as_json, _ = encode_response("m", "1", InferRequest({}), {"t": strings})
    assert orjson.loads(as_json)["outputs"][0]["data"] == ["caf\u00e9", ""]
    as_binary, header = encode_response("m", "1", InferRequest({}, binary_outputs={"*"}), {"t": strings})
    assert as_binary[header:] == b"\x05\x00\x00\x00caf\xc3\xa9" + b"\x00\x00\x00\x00"
    _, outputs = decode_response(as_binary, header)
    assert outputs["t"].tolist() == ["caf\u00e9".encode(), b""]


def test_bytes_output_that_is_not_utf8_cannot_go_as_json() -> None:
    with pytest.raises(BadRequest, match="output 't' holds bytes that are not UTF-8.*binary_data = true"):
        encode_response("m", "1", InferRequest({}), {"t": bytes_array([b"\xff"], (1,))})


@pytest.mark.parametrize(
    "size, raw, message",
    [
        (3, b"\x01\x00\x00", "BYTES element 0 has no complete 4-byte length prefix"),
        (7, b"\x01\x00\x00\x00a\x01\x00", "BYTES element 1 has no complete 4-byte length prefix"),
        (9, b"\x09\x00\x00\x00abcde", "BYTES element 0 claims 9 bytes, past the end of its binary_data_size 9"),
        (10, b"\x01\x00\x00\x00a\x01\x00\x00\x00", "binary_data_size 10 runs past the end of the body"),
        (11, b"\x01\x00\x00\x00a\x01\x00\x00\x00bc", "binary_data_size is 11 but its 2 BYTES element(s) use 10"),
        (-1, b"", "binary_data_size must be a non-negative integer, got -1"),
        ("10", b"\x01\x00\x00\x00a\x01\x00\x00\x00b", "binary_data_size must be a non-negative integer, got '10'"),
        (True, b"\x01\x00\x00\x00a", "got True"),
    ],
    ids=[
        "truncated-prefix",
        "truncated-second-prefix",
        "length-past-end",
        "size-past-body",
        "leftover",
        "negative-size",
        "string-size",
        "bool-size",
    ],
)
def test_malformed_binary_bytes_name_the_problem(size: object, raw: bytes, message: str) -> None:
    body, header_length = binary_request(size, raw, shape=[2] if size not in (9, True) else [1], datatype="BYTES")
    with pytest.raises(BadRequest) as caught:
        decode_request(body, header_length)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    "data, shape, message",
    [
        ([1, 2], [2], "BYTES elements must be strings"),
        (["a", None], [2], "BYTES elements must be strings"),
        ([["a"], ["b", "c"]], [2, 2], "nested lists of different lengths"),
        ([["a", "b"], ["c", "d"]], [4], "nested more than 1 deep, the shape's dimensions"),
        ([[[["a"]]]] * 2, [2, 1], "nested more than 2 deep"),
        ([["a", "b"]], [2, 1], "nested as [1, 2] but shape is [2, 1]"),
        (["a", "b", "c"], [2], "shape [2] needs 2 elements but data has 3"),
        ("ab", [2], "shape [2] needs 2 elements but data has 1"),
    ],
)
def test_malformed_json_bytes_name_the_problem(data: object, shape: list[int], message: str) -> None:
    with pytest.raises(BadRequest) as caught:
        decode_request(json_body({"name": "a", "shape": shape, "datatype": "BYTES", "data": data}))
    assert message in str(caught.value)


INTEGER_TYPES = ["INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"]


@pytest.mark.parametrize("datatype", INTEGER_TYPES)
def test_a_flat_integer_list_decodes_as_the_nested_one(datatype: str) -> None:
    """Flat JSON integers take struct's fast path, nested ones numpy's: the same values and dtype, and the same
    refusals (a value past the type's range, a float, a string, a boolean among integers is the general path's)."""
    info = np.iinfo(DATATYPES[datatype])
    values = [int(info.min), 0, 1, int(info.max)]

    def decoded(data: list, shape: list[int]) -> np.ndarray:  # json: orjson writes no integer past 64 bits
        body = json.dumps({"inputs": [{"name": "a", "shape": shape, "datatype": datatype, "data": data}]})
        return decode_request(body.encode()).inputs["a"]

    flat, nested = decoded(values, [4]), decoded([values], [1, 4])
    assert flat.dtype == nested.dtype == DATATYPES[datatype] and flat.tolist() == nested.tolist()[0] == values
    for bad in ([int(info.max) + 1, 0], [int(info.min) - 1, 0], [1.5, 0], [1.0, 0], ["1", 0], [None, 0]):
        for data, shape in ((bad, [2]), ([bad], [1, 2])):
            with pytest.raises(BadRequest, match=f"input 'a': data is not a valid {datatype} array"):
                decoded(data, shape)
    assert decoded([True, 2], [2]).tolist() == decoded([[True, 2]], [1, 2]).tolist()[0]
