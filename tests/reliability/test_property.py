"""Property: whatever infer request arrives, built from the protocol's shapes, valid or broken, the real server
answers it without a 5xx, stays alive, and its memory stays bounded; valid ones are answered correctly."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from latlab.server.protocol import DATATYPES, HEADER_LENGTH

from tests.reliability.conftest import COUNTS, MAX_BATCH, MAX_BODY, Server, output_of, tiny_body, tiny_y

pytestmark = pytest.mark.e2e
EXAMPLES = 300
RSS_GROWTH_LIMIT = 100 * 1024 * 1024


def dumps(doc: object) -> bytes:
    """The stdlib's JSON: it writes ints past 64 bits, NaN and Infinity, which the server must refuse."""
    return json.dumps(doc).encode()


@dataclass
class Case:
    """One generated HTTP request; `x` is set when it is a valid request for the tiny model."""

    path: str
    body: bytes
    headers: dict[str, str]
    x: np.ndarray | None = None


ascii_text = st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=30)  # valid header values
names = st.sampled_from(["x", "y", "X", ""]) | st.text(max_size=12)
dims = st.integers(-2, 12) | st.sampled_from([2**31, 2**63 - 1, 10**7])
absurd_shapes = st.lists(st.sampled_from([0, 1, 4, 2**31, 2**62, 2**63 - 1]), min_size=1, max_size=5)
shapes = st.lists(dims, max_size=5) | st.integers(0, MAX_BATCH + 2).map(lambda n: [n, 4]) | absurd_shapes
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.text(max_size=4)
    | st.floats(allow_nan=False, allow_infinity=False)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=30,
)
datatypes = st.sampled_from([*DATATYPES, "BYTES", "FLOAT", "fp32"]) | ascii_text


@st.composite
def valid_x(draw: st.DrawFn) -> np.ndarray:
    n = draw(st.integers(1, MAX_BATCH))
    values = draw(st.lists(st.floats(-1e6, 1e6, width=32), min_size=4 * n, max_size=4 * n))
    return np.array(values, np.float32).reshape(n, 4)


def mostly(good: st.SearchStrategy, bad: st.SearchStrategy) -> st.SearchStrategy:
    """Three times in four a plausible value, so that the checks behind the first one get reached too."""
    return st.one_of(good, good, good, bad)


@st.composite
def absurd_tensor(draw: st.DrawFn) -> dict:
    """Everything right but a shape no body can fill (or an empty one with huge dimensions)."""
    tensor = {"name": "x", "shape": draw(absurd_shapes), "datatype": draw(st.sampled_from(list(DATATYPES)))}
    if draw(st.booleans()):
        return tensor | {"data": draw(st.just([]) | st.lists(st.integers(0, 1), max_size=8))}
    return tensor | {"parameters": {"binary_data_size": draw(st.sampled_from([0, 1, 2**62]))}}


absurd_case = absurd_tensor().map(
    lambda tensor: Case("/v2/models/tiny/infer", dumps({"inputs": [tensor]}), {"Content-Type": "application/json"})
)


@st.composite
def broken_tensor(draw: st.DrawFn) -> dict:
    tensor = {
        "name": draw(mostly(st.just("x"), names)),
        "shape": draw(mostly(shapes, json_values)),
        "datatype": draw(mostly(st.sampled_from(list(DATATYPES)), datatypes)),
        "data": draw(st.just([]) | st.lists(scalars, max_size=40) | json_values),
    }
    if draw(st.booleans()):
        tensor["parameters"] = {"binary_data_size": draw(st.integers(-8, 200) | json_values)}
    for key in draw(st.sets(st.sampled_from(list(tensor)), max_size=2)):
        del tensor[key]
    return tensor


@st.composite
def json_case(draw: st.DrawFn) -> Case:
    """Half valid requests (with valid optional fields), half anything the JSON shapes allow."""
    path, headers = "/v2/models/tiny/infer", {"Content-Type": "application/json"}
    if draw(st.booleans()):
        x = draw(valid_x())
        doc = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.reshape(-1).tolist()}]}
        doc |= draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "id": st.text(max_size=256),
                    "outputs": st.just([{"name": "y"}]),
                    "parameters": st.fixed_dictionaries(
                        {}, optional={"timeout": st.integers(10**6, 10**7), "binary_data_output": st.booleans()}
                    ),
                },
            )
        )
        return Case(path, dumps(doc), headers, x)
    # Timeouts the client may legitimately make too short (a 504) are left out: only invalid ones.
    bad_timeouts = st.integers(-5, -1) | st.floats() | st.text(max_size=4) | st.booleans()
    doc = {"inputs": draw(mostly(st.lists(broken_tensor(), min_size=1, max_size=2), json_values))}
    doc |= draw(
        st.fixed_dictionaries(
            {},
            optional={
                "id": st.text(max_size=300) | json_values,
                "outputs": st.lists(st.fixed_dictionaries({"name": names}), max_size=2) | json_values,
                "parameters": st.fixed_dictionaries(
                    {}, optional={"timeout": bad_timeouts, "binary_data_output": json_values}
                )
                | json_values,
            },
        )
    )
    return Case(path, dumps(doc), headers, None)


@st.composite
def binary_case(draw: st.DrawFn) -> Case:
    x = draw(valid_x())
    raw = x.astype("<f4").tobytes()
    size = draw(st.just(len(raw)) | st.integers(-4, 2 * len(raw) + 8))
    header = dumps(
        {
            "inputs": [
                {
                    "name": draw(st.just("x") | names),
                    "shape": draw(st.just(list(x.shape)) | shapes),
                    "datatype": draw(st.just("FP32") | datatypes),
                    "parameters": {"binary_data_size": size},
                }
            ]
        }
    )
    tail = draw(st.just(raw) | st.binary(max_size=2 * len(raw) + 8))
    length = draw(st.just(str(len(header))) | st.integers(-3, len(header) + len(tail) + 3).map(str) | ascii_text)
    content_type = draw(st.sampled_from(["application/octet-stream", "application/json", None]))
    headers = {HEADER_LENGTH: length, **({"Content-Type": content_type} if content_type else {})}
    return Case("/v2/models/tiny/infer", header + tail, headers, None)


@st.composite
def odd_case(draw: st.DrawFn) -> Case:
    """Raw bytes, arbitrary JSON, odd content types, unknown models and versions, bodies over the limit."""
    body = draw(
        st.binary(max_size=300)
        | json_values.map(dumps)
        | st.integers(MAX_BODY - 8, MAX_BODY + 64).map(lambda n: b" " * n)
    )
    model = draw(st.sampled_from(["tiny", "nope"]) | st.text("abcxyz-_.0123456789", min_size=1, max_size=12))
    version = draw(st.sampled_from(["", "/versions/1", "/versions/2"]))
    headers = {}
    content_type = draw(
        st.none()
        | st.sampled_from(["application/json", "text/plain", "application/xml", "application/json; charset=latin-1"])
        | ascii_text
    )
    if content_type is not None:
        headers["Content-Type"] = content_type
    if draw(st.booleans()):
        headers[HEADER_LENGTH] = draw(st.integers(-5, 400).map(str) | ascii_text)
    return Case(f"/v2/models/{model}{version}/infer", body, headers, None)


@pytest.fixture(scope="module")
def baseline_rss(shared_server: Server) -> int:
    for _ in range(20):  # warm up: first runs at each batch size allocate ORT's buffers
        shared_server.infer(tiny_body(np.ones((MAX_BATCH, 4), np.float32)))
    return shared_server.worker().memory_info().rss


def test_no_request_gets_a_5xx_kills_the_server_or_grows_its_memory(shared_server: Server, baseline_rss: int) -> None:
    session = requests.Session()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    )
    @given(case=st.one_of(json_case(), binary_case(), odd_case(), absurd_case))
    def property_holds(case: Case) -> None:
        response = session.post(shared_server.url + case.path, data=case.body, headers=case.headers, timeout=15)
        COUNTS["property examples (hypothesis)"] += 1
        assert response.status_code < 500, (response.status_code, response.content[:300])
        if response.status_code >= 400:
            doc = response.json()
            assert set(doc) == {"error"} and doc["error"], doc
            COUNTS["property examples refused with a 4xx"] += 1
        if case.x is not None:
            assert response.status_code == 200, response.content[:300]
            if response.headers["Content-Type"] == "application/json":
                np.testing.assert_allclose(output_of(response, (len(case.x), 3)), tiny_y(case.x), rtol=1e-4, atol=1e-3)
        assert shared_server.process.poll() is None

    property_holds()
    assert shared_server.alive()
    grown = shared_server.worker().memory_info().rss - baseline_rss
    assert grown < RSS_GROWTH_LIMIT, f"server RSS grew by {grown / 2**20:.0f} MiB"
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    response = shared_server.infer(tiny_body(x))
    assert response.status_code == 200
    np.testing.assert_allclose(output_of(response, (3, 3)), tiny_y(x), rtol=1e-5)
