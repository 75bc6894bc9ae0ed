"""Request bodies the load generator sends: random valid inputs from a model's metadata, as JSON
tensors or with the binary tensor extension."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import orjson

HEADER_LENGTH = "Inference-Header-Content-Length"
JSON_HEADERS = {"Content-Type": "application/json"}
MAX_BODIES = 32
BODY_BUDGET_BYTES = 16 * 2**20
"""Bodies kept per user: a 3x224x224 image is 0.6 MB binary, ~3 MB as JSON text; a few are enough
to vary the inputs without holding hundreds of MB per user."""

_NUMPY_TYPES = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
}


@dataclass(frozen=True)
class PayloadOptions:
    """How requests are built and sent: the encoding, the size of dynamic non-batch dimensions
    (e.g. a token sequence's length) and the HTTP client."""

    binary: bool = False
    """Send inputs with the binary tensor extension and ask for binary outputs."""
    seq_len: int = 8
    """Length given to every dynamic dimension after the batch one."""
    client: str = "lean"
    """How infer requests are sent: "lean" (loadtest/lean_http.py, for http:// hosts) or "locust"
    (Locust's FastHttpSession: https, or to compare the two generators' costs)."""


@dataclass(frozen=True)
class Body:
    data: bytes
    headers: dict[str, str]


def random_bodies(metadata: dict, seed: int, options: PayloadOptions = PayloadOptions()) -> list[Body]:
    """Valid infer bodies of batch 1 with random data, from the model's metadata; as many as fit the budget."""
    rng = np.random.default_rng(seed)
    bodies = [_body(metadata, rng, options)]
    count = max(1, min(MAX_BODIES, BODY_BUDGET_BYTES // max(len(bodies[0].data), 1)))
    bodies += [_body(metadata, rng, options) for _ in range(count - 1)]
    return bodies


def _body(metadata: dict, rng: np.random.Generator, options: PayloadOptions) -> Body:
    tensors = []
    for spec in metadata["inputs"]:
        shape = [1] + [d if d > 0 else options.seq_len for d in spec["shape"][1:]]
        tensors.append((spec["name"], spec["datatype"], shape, random_tensor(rng, spec, shape)))
    if not options.binary:
        doc = {"inputs": [{"name": n, "shape": s, "datatype": t, "data": a.reshape(-1)} for n, t, s, a in tensors]}
        return Body(orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY), JSON_HEADERS)
    header = orjson.dumps({
        "inputs": [{"name": n, "shape": s, "datatype": t, "parameters": {"binary_data_size": a.nbytes}}
                   for n, t, s, a in tensors],
        "parameters": {"binary_data_output": True},
    })
    raw = b"".join(np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
                   for *_, a in tensors)
    return Body(header + raw, {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(header))})


def random_tensor(rng: np.random.Generator, spec: dict, shape: list[int]) -> np.ndarray:
    """Random values a model accepts: floats from N(0, 1); for integer inputs small ids (valid
    token ids for any vocabulary), and ones for attention masks (a mask of random ids is not a mask)."""
    datatype = spec["datatype"]
    if datatype not in _NUMPY_TYPES:
        raise ValueError(f"input '{spec['name']}' has datatype {datatype}, which the load generator cannot fill")
    dtype = np.dtype(_NUMPY_TYPES[datatype])
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if "mask" in spec["name"].lower():
        return np.ones(shape, dtype)
    return rng.integers(0, 100, shape).astype(dtype)
