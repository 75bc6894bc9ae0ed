"""Bad input against the real server: every case is a 4xx {"error"} naming the problem, and valid requests
sent at the same time are all answered correctly."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
import requests

from latlab.server.protocol import HEADER_LENGTH, MAX_ERROR_LENGTH

from tests.reliability.conftest import COUNTS, MAX_BATCH, MAX_BODY, Server, assert_error, tiny_body

pytestmark = pytest.mark.e2e
X = np.arange(8, dtype=np.float32).reshape(2, 4)
GOOD = {"name": "x", "shape": [2, 4], "datatype": "FP32", "data": X.reshape(-1).tolist()}
JSON = {"Content-Type": "application/json"}


def body(*tensors: dict, **extra: object) -> bytes:
    return orjson.dumps({"inputs": list(tensors) or [GOOD], **extra})


def tensor(**changes: object) -> dict:
    return {k: v for k, v in {**GOOD, **changes}.items() if v is not None}


def binary(array: np.ndarray, size: object = None, shape: list | None = None) -> tuple[bytes, dict]:
    """A binary-extension body: JSON header then the raw little-endian bytes."""
    raw = array.astype("<f4").tobytes()
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": shape or list(array.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": len(raw) if size is None else size},
                }
            ]
        }
    )
    return header + raw, {HEADER_LENGTH: str(len(header)), "Content-Type": "application/octet-stream"}


def nested(depth: int) -> object:
    value: object = 1.0
    for _ in range(depth):
        value = [value]
    return value


NAN_BODY, NAN_HEADERS = binary(np.array([[1, np.nan, 3, 4]], np.float32))
INF_BODY, INF_HEADERS = binary(np.array([[1, 2, -np.inf, 4]], np.float32))
OK_BINARY, OK_BINARY_HEADERS = binary(X)

# (id, body, headers, status, fragments of the error message); path is the tiny model's infer route.
CASES = [
    # malformed or truncated JSON, wrong encodings
    ("malformed-json", b"{nope", JSON, 400, ["not valid JSON"]),
    ("truncated-json", body()[:40], JSON, 400, ["not valid JSON"]),
    ("empty-body", b"", JSON, 400, ["not valid JSON"]),
    ("not-an-object", b"[1, 2]", JSON, 400, ["must be a JSON object"]),
    ("non-utf8", b'{"id": "\xff\xfe", "inputs": []}', JSON, 400, ["not UTF-8", "0xff"]),
    ("latin1-charset", body(), {"Content-Type": "application/json; charset=latin-1"}, 415, ["UTF-8", "latin-1"]),
    ("text-plain", body(), {"Content-Type": "text/plain"}, 415, ["'text/plain' is not accepted"]),
    (
        "form-urlencoded",
        body(),
        {"Content-Type": "application/x-www-form-urlencoded"},
        415,
        ["application/x-www-form-urlencoded"],
    ),
    ("multipart", body(), {"Content-Type": "multipart/form-data; boundary=x"}, 415, ["multipart/form-data"]),
    ("octet-stream-without-header", body(), {"Content-Type": "application/octet-stream"}, 415, [HEADER_LENGTH]),
    ("nan-literal", body().replace(b"0.0", b"NaN", 1), JSON, 400, ["not valid JSON"]),
    ("infinite-number", body().replace(b"0.0", b"1e999", 1), JSON, 400, ["not valid JSON", "infinity"]),
    ("deep-json", b"[" * 5000 + b"]" * 5000, JSON, 400, ["nested deeper than 1024"]),
    # missing fields
    ("no-inputs", b"{}", JSON, 400, ["'inputs' must be a non-empty list"]),
    ("empty-inputs", b'{"inputs": []}', JSON, 400, ["'inputs' must be a non-empty list"]),
    ("input-not-object", b'{"inputs": [3]}', JSON, 400, ["each input must be an object"]),
    ("no-name", body(tensor(name=None)), JSON, 400, ["has no 'name'"]),
    ("no-shape", body(tensor(shape=None)), JSON, 400, ["'shape' must be a list"]),
    ("no-datatype", body(tensor(datatype=None)), JSON, 400, ["unsupported datatype None"]),
    ("no-data", body(tensor(data=None)), JSON, 400, ["neither 'data' nor parameters.binary_data_size"]),
    # wrong names, counts, shapes, dtypes
    ("wrong-input-name", body(tensor(name="z")), JSON, 400, ["takes inputs ['x']", "unknown ['z']"]),
    ("extra-input", body(GOOD, tensor(name="w")), JSON, 400, ["unknown ['w']"]),
    ("duplicate-input", body(GOOD, GOOD), JSON, 400, ["input 'x' is given twice"]),
    ("wrong-shape", body(tensor(shape=[4, 2])), JSON, 400, ["must have shape [-1, 4]", "got [4, 2]"]),
    ("wrong-rank", body(tensor(shape=[8])), JSON, 400, ["must have shape [-1, 4]", "got [8]"]),
    ("empty-batch", body(tensor(shape=[0, 4], data=[])), JSON, 400, ["batch dimension of at least 1"]),
    ("wrong-dtype", body(tensor(datatype="INT64", data=[1] * 8)), JSON, 400, ["must be FP32, got INT64"]),
    ("unknown-datatype", body(tensor(datatype="FLOAT32")), JSON, 400, ["unsupported datatype 'FLOAT32'"]),
    ("bytes-of-numbers", body(tensor(datatype="BYTES")), JSON, 400, ["not a valid BYTES array", "strings"]),
    ("bytes-for-fp32", body(tensor(datatype="BYTES", data=["a"] * 8)), JSON, 400, ["must be FP32, got BYTES"]),
    ("strings-as-data", body(tensor(data=["1"] * 8)), JSON, 400, ["not a valid FP32 array", "string"]),
    ("null-in-data", body(tensor(data=[None] * 8)), JSON, 400, ["not a valid FP32 array"]),
    ("bools-as-floats", body(tensor(data=[True] * 8)), JSON, 400, ["not a valid FP32 array", "boolean"]),
    ("float-beyond-fp32", body(tensor(data=[1e300] * 8)), JSON, 400, ["outside FP32's range"]),
    ("too-few-elements", body(tensor(data=[1.0] * 7)), JSON, 400, ["needs 8 elements but data has 7"]),
    ("too-many-elements", body(tensor(data=[1.0] * 9)), JSON, 400, ["needs 8 elements but data has 9"]),
    ("ragged-data", body(tensor(data=[[1.0] * 4, [1.0] * 3])), JSON, 400, ["not a valid FP32 array"]),
    (
        "nested-deeper-than-shape",
        body(tensor(data=[nested(30)] * 8)),
        JSON,
        400,
        ["nested 31 deep but shape [2, 4] has 2 dimension(s)"],
    ),
    (
        "nested-against-shape",
        body(tensor(data=X.reshape(4, 2).tolist())),
        JSON,
        400,
        ["nested as [4, 2] but shape is [2, 4]"],
    ),
    (
        "batch-over-max",
        body(tensor(shape=[MAX_BATCH + 1, 4], data=[0.0] * (4 * MAX_BATCH + 4))),
        JSON,
        400,
        [f"batch of {MAX_BATCH + 1} exceeds", f"max_batch_size {MAX_BATCH}"],
    ),
    # negative and absurd sizes
    ("negative-dim", body(tensor(shape=[-2, 4])), JSON, 400, ["non-negative integers"]),
    ("float-dim", body(tensor(shape=[2.0, 4])), JSON, 400, ["non-negative integers"]),
    ("absurd-shape", body(tensor(shape=[10**12, 4])), JSON, 400, ["more elements than a body of"]),
    (
        "absurd-shape-zero-sized",
        body(tensor(shape=[0, 2**62, 2**62], data=[])),
        JSON,
        400,
        ["more elements than a body of"],
    ),
    ("absurd-rank", body(tensor(shape=[1] * 40)), JSON, 400, ["40 dimensions; at most 32"]),
    # NaN / Inf where the model does not take them (allow_non_finite = false)
    ("nan-binary", NAN_BODY, NAN_HEADERS, 400, ["input 'x' holds NaN or infinite values"]),
    ("inf-binary", INF_BODY, INF_HEADERS, 400, ["input 'x' holds NaN or infinite values"]),
    # the binary extension
    (
        "header-length-beyond-body",
        OK_BINARY,
        {**OK_BINARY_HEADERS, HEADER_LENGTH: str(len(OK_BINARY) + 1)},
        400,
        [f"{HEADER_LENGTH} is {len(OK_BINARY) + 1} but the body has {len(OK_BINARY)} bytes"],
    ),
    ("header-length-negative", OK_BINARY, {**OK_BINARY_HEADERS, HEADER_LENGTH: "-5"}, 400, ["non-negative integer"]),
    ("header-length-text", OK_BINARY, {**OK_BINARY_HEADERS, HEADER_LENGTH: "ten"}, 400, ["non-negative integer"]),
    ("header-length-huge", OK_BINARY, {**OK_BINARY_HEADERS, HEADER_LENGTH: "9" * 5000}, 400, ["non-negative integer"]),
    ("header-length-cuts-json", OK_BINARY, {**OK_BINARY_HEADERS, HEADER_LENGTH: "10"}, 400, ["not valid JSON"]),
    ("binary-size-negative", *binary(X, size=-32), 400, ["binary_data_size is -32"]),
    ("binary-size-absurd", *binary(X, size=2**62), 400, [f"binary_data_size is {2**62}"]),
    ("binary-size-mismatch", *binary(X, size=16), 400, ["binary_data_size is 16 but shape [2, 4] of FP32 needs 32"]),
    ("binary-past-end", binary(X)[0][:-4], binary(X)[1], 400, ["runs past the end of the body"]),
    (
        "binary-leftover",
        binary(X)[0] + b"\0" * 4,
        binary(X)[1],
        400,
        ["binary part has 36 bytes but the inputs use 32"],
    ),
    # ids, parameters, requested outputs
    ("huge-id", body(id="i" * 30_000), JSON, 400, ["'id' has 30000 characters; at most 256"]),
    ("id-not-string", body(id=7), JSON, 400, ["'id' must be a string"]),
    ("timeout-negative", body(parameters={"timeout": -1}), JSON, 400, ["parameters.timeout"]),
    ("timeout-text", body(parameters={"timeout": "soon"}), JSON, 400, ["parameters.timeout"]),
    ("parameters-not-object", body(parameters=[1]), JSON, 400, ["'parameters' of the request must be an object"]),
    ("unknown-output", body(outputs=[{"name": "logits"}]), JSON, 400, ["has no output(s) ['logits']"]),
    ("outputs-not-list", body(outputs={"name": "y"}), JSON, 400, ["'outputs' must be a list"]),
    # too large for the server
    (
        "body-over-limit",
        body(id="p", parameters={"pad": "x" * MAX_BODY}),
        JSON,
        413,
        [f"over this server's limit of {MAX_BODY} bytes"],
    ),
]


@pytest.mark.parametrize(
    "case_body, headers, status, fragments", [pytest.param(*case[1:], id=case[0]) for case in CASES]
)
def test_bad_input_is_a_named_4xx_and_nobody_else_suffers(
    shared_server: Server, valid_traffic, case_body: bytes, headers: dict, status: int, fragments: list[str]
) -> None:
    for _ in range(3):  # a few times, so the valid traffic surely overlaps it
        response = shared_server.session.post(
            f"{shared_server.url}/v2/models/tiny/infer", data=case_body, headers=headers, timeout=15
        )
        assert_error(response, status, *fragments)
        COUNTS["bad requests (table)"] += 1
    assert shared_server.alive()


@pytest.mark.parametrize(
    "path, method, status, fragments",
    [
        ("/v2/models/nope/infer", "post", 404, ["unknown model 'nope'", "serving ['tiny']"]),
        ("/v2/models/tiny/versions/2/infer", "post", 404, ["unknown model 'tiny' version '2'"]),
        ("/v2/models/" + "n" * 5000 + "/infer", "post", 404, ["unknown model 'nnnn"]),
        ("/v2/models/tiny/infer", "get", 405, []),
        ("/v2/nowhere", "get", 404, []),
    ],
    ids=["unknown-model", "unknown-version", "huge-model-name", "wrong-method", "unknown-route"],
)
def test_unknown_models_and_routes_are_json_errors(
    shared_server: Server, valid_traffic, path: str, method: str, status: int, fragments: list[str]
) -> None:
    response = shared_server.session.request(method, shared_server.url + path, data=tiny_body(X), timeout=15)
    message = assert_error(response, status, *fragments)
    assert len(message) < MAX_ERROR_LENGTH + 10
    COUNTS["bad requests (table)"] += 1


def test_error_messages_stay_bounded_whatever_the_client_sent(shared_server: Server, valid_traffic) -> None:
    huge_name = "z" * 20_000
    response = shared_server.infer(body(tensor(name=huge_name), tensor(name=huge_name + "2")))
    message = assert_error(response, 400, "takes inputs ['x']")
    assert len(message) <= MAX_ERROR_LENGTH + 3
    COUNTS["bad requests (table)"] += 1


def test_absent_content_type_and_binary_extension_still_work(shared_server: Server, valid_traffic) -> None:
    """The content-type rule refuses what it should and nothing more: no Content-Type, JSON with charset=utf-8,
    and octet-stream with the binary header are all answered."""
    url = f"{shared_server.url}/v2/models/tiny/infer"
    for headers, data in [
        ({}, tiny_body(X)),
        ({"Content-Type": "application/json; charset=utf-8"}, tiny_body(X)),
        (OK_BINARY_HEADERS, OK_BINARY),
    ]:
        response = requests.post(url, data=data, headers=headers, timeout=15)
        assert response.status_code == 200, response.content
        assert response.json()["outputs"][0]["shape"] == [2, 3]


def test_a_refused_body_is_drained_so_the_answer_arrives_and_the_connection_lives(shared_server: Server) -> None:
    """The body is over the limit and refused before it is read; the client has already sent all of it.
    Closing with those bytes unread would reset the connection, possibly before the 413 reaches the
    client. The server drains them after answering: every try gets its 413, and the same connection
    then serves a valid request."""
    import socket
    from urllib.parse import urlsplit

    address = urlsplit(shared_server.url)
    big = b'{"inputs": [], "pad": "' + b"x" * (4 * MAX_BODY) + b'"}'
    valid = tiny_body(np.ones((1, 4), np.float32))
    for _ in range(10):
        with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
            for body in (big, valid):
                sock.sendall(
                    b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = sock.recv(65536)
                    assert chunk, "connection closed before the answer"
                    head += chunk
                head, _, rest = head.partition(b"\r\n\r\n")
                length = int(
                    next(
                        line.split(b":")[1]
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    )
                )
                while len(rest) < length:
                    rest += sock.recv(65536)
                status = int(head.split()[1])
                assert status == (413 if body is big else 200), (status, rest[:300])
