"""Open Inference Protocol tensors <-> numpy: JSON and the binary tensor extension, pure functions only."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

import numpy as np
import orjson

from latlab.server.bytes_tensors import bytes_from_binary, bytes_from_json, bytes_to_binary, bytes_to_json
from latlab.server.errors import BadRequest

HEADER_LENGTH = "Inference-Header-Content-Length"
MAX_ID_LENGTH = 256
"""Longest request `id` accepted (it is echoed in the response)."""
MAX_RANK = 32
"""Most dimensions a tensor may declare."""
MAX_JSON_DEPTH = 1024
"""orjson's nesting limit; deeper documents are refused as invalid JSON."""

DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}
"""BYTES tensors are numpy object arrays of `bytes` (what the requests carry); str elements (what ONNX
Runtime returns for tensor(string)) are sent as their UTF-8 bytes."""
_DATATYPE_OF = {dtype: name for name, dtype in DATATYPES.items()}
# Little-endian on the wire whatever the host's byte order.
_WIRE = {name: dtype.newbyteorder("<") for name, dtype in DATATYPES.items() if name != "BYTES"}


def datatype_of(dtype: np.dtype) -> str:
    """The protocol's datatype name for a numpy dtype."""
    name = _DATATYPE_OF.get(dtype)  # a native dtype, the usual case, needs no conversion
    if name is not None:
        return name
    try:
        return _DATATYPE_OF[np.dtype(dtype).newbyteorder("=")]
    except KeyError:
        raise BadRequest(f"dtype {dtype} has no Open Inference Protocol datatype") from None


@dataclass
class InferRequest:
    """A decoded infer request: named input arrays plus what the client asked back."""

    inputs: dict[str, np.ndarray]
    id: str | None = None
    parameters: dict = field(default_factory=dict)
    outputs: list[str] | None = None  # None: every output
    binary_outputs: set[str] = field(default_factory=set)
    finite: set[str] = field(default_factory=set)
    """Floating-point inputs known to hold no NaN or infinity: those sent as JSON, which has neither (a value
    a narrower type cannot hold is refused while decoding), so validation need not look again."""
    response_parameters: dict = field(default_factory=dict)
    """What the server adds to the response's `parameters` (a text deployment: sentences truncated)."""


def decode_request(body: bytes, header_length: int | None = None) -> InferRequest:
    """Decode an infer request body; with `header_length`, the JSON header is followed by raw tensors."""
    if header_length is None:
        header_length = len(body)
    elif not 0 <= header_length <= len(body):
        raise BadRequest(f"{HEADER_LENGTH} is {header_length} but the body has {len(body)} bytes")
    header = body if header_length == len(body) else body[:header_length]
    doc = _load_json(header)
    binary = memoryview(body)[header_length:]
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadRequest("'id' must be a string")
    if request_id is not None and len(request_id) > MAX_ID_LENGTH:
        raise BadRequest(f"'id' has {len(request_id)} characters; at most {MAX_ID_LENGTH} are allowed")
    parameters = _dict_field(doc, "parameters", "request")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise BadRequest("'inputs' must be a non-empty list of tensors")
    inputs: dict[str, np.ndarray] = {}
    finite: set[str] = set()
    offset = 0
    # No JSON boolean anywhere in the header: then no data array holds one (see _from_json_data).
    booleans = b"true" in header or b"false" in header
    for raw in raw_inputs:
        name, array, used = _decode_input(raw, binary, offset, len(body), booleans)
        if name in inputs:
            raise BadRequest(f"input '{shown(name)}' is given twice")
        inputs[name] = array
        if not used and array.dtype.kind == "f":
            finite.add(name)
        offset += used
    if offset != len(binary):
        raise BadRequest(f"binary part has {len(binary)} bytes but the inputs use {offset}")
    outputs, binary_outputs = _decode_requested_outputs(doc, bool(parameters.get("binary_data_output")))
    return InferRequest(inputs, request_id, parameters, outputs, binary_outputs, finite)


def _load_json(raw: bytes | memoryview) -> dict:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"body is not valid JSON: {_json_problem(raw, exc)}") from None
    if not isinstance(doc, dict):
        raise BadRequest("body must be a JSON object")
    return doc


def _json_problem(raw: bytes | memoryview, exc: orjson.JSONDecodeError) -> str:
    """Name what is wrong in words a client can act on (only on the error path: it may decode the body)."""
    try:
        bytes(raw).decode("utf-8")
    except UnicodeDecodeError as bad:
        return f"not UTF-8 (byte 0x{bad.object[bad.start]:02x} at position {bad.start})"
    if "depth" in str(exc):
        return f"nested deeper than {MAX_JSON_DEPTH} levels ({exc})"
    return str(exc)


def _dict_field(doc: dict, key: str, where: str) -> dict:
    value = doc.get(key) or {}
    if not isinstance(value, dict):
        raise BadRequest(f"'{key}' of the {where} must be an object")
    return value


def _decode_input(
    raw: object, binary: memoryview, offset: int, body_size: int, booleans: bool
) -> tuple[str, np.ndarray, int]:
    """One input tensor; returns (name, array, bytes of the binary part it used). `booleans`: whether the
    JSON may hold a true or false anywhere (False allows _from_json_data's fast path)."""
    if not isinstance(raw, dict):
        raise BadRequest("each input must be an object with name, shape, datatype and data")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest("an input has no 'name'")
    name = shown(name)
    shape = _decode_shape(raw.get("shape"), name, body_size)
    datatype = raw.get("datatype")
    if datatype not in DATATYPES:
        raise BadRequest(f"input '{name}': unsupported datatype {shown(datatype)!r}; one of {', '.join(DATATYPES)}")
    count = math.prod(shape)
    parameters = _dict_field(raw, "parameters", f"input '{name}'")
    size = parameters.get("binary_data_size")
    if size is not None:
        decode = bytes_from_binary if datatype == "BYTES" else _from_binary
        return raw["name"], decode(name, shape, datatype, size, binary, offset), size
    if "data" not in raw:
        raise BadRequest(f"input '{name}' has neither 'data' nor parameters.binary_data_size")
    if datatype == "BYTES":
        array = bytes_from_json(name, raw["data"], datatype, shape)
    else:
        array = _from_json_data(name, raw["data"], datatype, shape, booleans)
    if array.size != count:
        raise BadRequest(f"input '{name}': shape {shape} needs {count} elements but data has {array.size}")
    return raw["name"], array.reshape(shape), 0


def shown(value: object, limit: int = 64) -> object:
    """A client's string as it may appear in an error message: cut to `limit` characters."""
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + "..."
    return value


# numpy's kinds of array that JSON data may arrive as, per datatype family: numbers are never
# silently truncated (1.5 as INT32), strings and nulls never parsed as numbers, 2 never taken for true.
_ACCEPTED_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}


_PACKED = dict(FP16="e", FP32="f", FP64="d", INT8="b", INT16="h", INT32="i", INT64="q")
_PACKED.update(UINT8="B", UINT16="H", UINT32="I", UINT64="Q")
"""struct's codes for the numeric datatypes: packing a flat list of JSON numbers is a fast path (below)."""


def _from_json_data(name: str, data: object, datatype: str, shape: list[int], booleans: bool = True) -> np.ndarray:
    """A JSON `data` array as a numpy array of `datatype`, refused (BadRequest, naming the problem) unless every
    value is a number of the datatype's family that the datatype can hold.

    Fast path: a flat list for a numeric datatype is packed by `struct` straight into the type's bytes, a
    fraction of the work of numpy's list conversion and range checks. `struct` refuses strings, nulls
    and nested lists, floats for an integer type, and raises on a value the type cannot hold (an integer out of
    range; a float where numpy's cast would give infinity); only booleans would pass (as 1 and 0), so it runs
    only when the JSON holds no `true` or `false` at all. Anything it refuses goes down the general path, which
    names the problem."""
    code = _PACKED.get(datatype)
    if code is not None and not booleans and type(data) is list and data and type(data[0]) is not list:
        try:
            return np.frombuffer(struct.pack(f"<{len(data)}{code}", *data), _WIRE[datatype])
        except (struct.error, OverflowError):
            pass
    dtype = DATATYPES[datatype]
    try:
        depth = _nesting_depth(data)
        if depth > max(1, len(shape)):
            raise ValueError(f"nested {depth} deep but shape {shape} has {len(shape)} dimension(s)")
        parsed = np.asarray(data)
        if parsed.dtype.kind in "fO" and dtype.kind == "u" and _all_ints(data):
            parsed = np.asarray(data, dtype=dtype)  # ints past INT64's range: numpy would pick float64
        elif parsed.dtype.kind == "O" and dtype.kind == "f" and _all_numbers(data):
            parsed = np.asarray(data, dtype=np.float64)  # ints past INT64's range are numbers all the same
        if parsed.ndim > 1 and list(parsed.shape) != shape:
            raise ValueError(f"nested as {list(parsed.shape)} but shape is {shape}")
        if parsed.size:
            if parsed.dtype.kind not in _ACCEPTED_KINDS[dtype.kind]:
                raise ValueError(f"got {_json_kind(parsed)} values")
            if dtype.kind in "iu" and (parsed.min() < np.iinfo(dtype).min or parsed.max() > np.iinfo(dtype).max):
                raise ValueError(f"values outside {datatype}'s range")
        with np.errstate(over="ignore"):
            array = parsed.astype(dtype, copy=False)
        # JSON carries no NaN or Inf (orjson refuses them), so a non-finite value here is an overflow,
        # which only a cast to a narrower float can produce (FP64 holds every JSON number).
        if dtype.kind == "f" and dtype.itemsize < 8 and array.size and not np.isfinite(array).all():
            raise ValueError(f"values outside {datatype}'s range")
        return array
    except (ValueError, TypeError, OverflowError) as exc:
        raise BadRequest(f"input '{name}': data is not a valid {datatype} array: {exc}") from None


def _nesting_depth(data: object) -> int:
    """How deep lists nest along the first elements (numpy checks the rest agree)."""
    depth = 0
    while isinstance(data, list):
        depth += 1
        if not data:
            break
        data = data[0]
    return depth


def _all_ints(data: object) -> bool:
    if isinstance(data, list):
        return all(_all_ints(item) for item in data)
    return type(data) is int


def _all_numbers(data: object) -> bool:
    if isinstance(data, list):
        return all(_all_numbers(item) for item in data)
    return type(data) in (int, float)


def _json_kind(array: np.ndarray) -> str:
    return {"b": "boolean", "i": "integer", "u": "integer", "f": "floating-point", "U": "string"}.get(
        array.dtype.kind, "null or mixed"
    )


def _decode_shape(shape: object, name: str, body_size: int) -> list[int]:
    """The declared shape, refused before anything is allocated when no body of this size could fill it."""
    if not isinstance(shape, list):
        raise BadRequest(f"input '{name}': 'shape' must be a list of non-negative integers")
    if len(shape) > MAX_RANK:
        raise BadRequest(f"input '{name}': shape has {len(shape)} dimensions; at most {MAX_RANK} are allowed")
    # Every element takes at least one byte of body, in JSON or binary; zero dimensions are skipped so that
    # [0, 10**30] cannot pass as an empty tensor numpy could never shape.
    elements = 1
    for d in shape:
        if type(d) is not int or d < 0:
            raise BadRequest(f"input '{name}': 'shape' must be a list of non-negative integers")
        elements *= d or 1
    if elements > max(body_size, 1):
        raise BadRequest(
            f"input '{name}': shape {shown(str(shape))} has more elements than a body of {body_size} bytes can carry"
        )
    return shape


def _from_binary(
    name: str, shape: list[int], datatype: str, size: object, binary: memoryview, offset: int
) -> np.ndarray:
    dtype = _WIRE[datatype]
    expected = math.prod(shape) * dtype.itemsize
    if type(size) is not int or size != expected:
        raise BadRequest(
            f"input '{name}': binary_data_size is {size!r} but shape {shape} of {datatype} needs {expected}"
        )
    if offset + size > len(binary):
        raise BadRequest(f"input '{name}': binary_data_size {size} runs past the end of the body")
    # frombuffer shares the request's bytes: no copy.
    return np.frombuffer(binary[offset : offset + size], dtype=dtype).reshape(shape)


def _decode_requested_outputs(doc: dict, all_binary: bool) -> tuple[list[str] | None, set[str]]:
    raw = doc.get("outputs")
    if raw is None:
        return None, ({"*"} if all_binary else set())
    if not isinstance(raw, list):
        raise BadRequest("'outputs' must be a list of {\"name\": ...} objects")
    names, binary = [], set()
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise BadRequest("each requested output must be an object with a 'name'")
        names.append(item["name"])
        if all_binary or _dict_field(item, "parameters", f"output '{shown(item['name'])}'").get("binary_data"):
            binary.add(item["name"])
    return names, binary


def encode_response(
    model_name: str, model_version: str, request: InferRequest, outputs: dict[str, np.ndarray]
) -> tuple[bytes, int | None]:
    """The response body, and the JSON header's length when any output travels as binary."""
    wanted = request.binary_outputs
    tensors, chunks = [], []
    for name, array in outputs.items():
        datatype = datatype_of(array.dtype)
        tensor = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if wanted and ("*" in wanted or name in wanted):
            raw = (
                bytes_to_binary(array)
                if datatype == "BYTES"
                else np.ascontiguousarray(array, dtype=_WIRE[datatype]).tobytes()
            )
            tensor["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        elif datatype == "BYTES":
            tensor["data"] = bytes_to_json(name, array)
        else:
            tensor["data"] = array.ravel()  # contiguous, as orjson needs: a view when it already is
        tensors.append(tensor)
    doc = {"model_name": model_name, "model_version": model_version, "outputs": tensors}
    if request.id is not None:
        doc["id"] = request.id
    if request.response_parameters:
        doc["parameters"] = request.response_parameters
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)


MAX_ERROR_LENGTH = 1000


def encode_error(message: str) -> bytes:
    """The protocol's error body, bounded in length whatever the client's names were."""
    if len(message) > MAX_ERROR_LENGTH:
        message = message[:MAX_ERROR_LENGTH] + "..."
    return orjson.dumps({"error": message})
