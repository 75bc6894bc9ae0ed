"""The OpenAPI description at /v2/openapi.json covers every route, and a schema-driven fuzzer (schemathesis)
run from it against the live server finds no server error and no response that breaks the description."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from prometheus_client import CollectorRegistry
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from latlab.server.http.app import create_app
from latlab.server.http.openapi import OPENAPI_PATH, openapi_spec

from tests.conftest import build_tiny_model, server_config
from tests.reliability.conftest import COUNTS, Server, running_server

TOKEN = "fuzzing-token-0123456789abcdef"
EXAMPLES = 25
"""Per operation and generation mode; there are 13 operations."""
INFER_EXAMPLES = 150


def test_every_route_is_described(tmp_path: Path) -> None:
    app = create_app(server_config(build_tiny_model(tmp_path / "tiny" / "model.onnx")), registry=CollectorRegistry())
    try:
        routes = {
            (re.sub(r"<(\w+)>", r"{\1}", rule.rule), method.lower())
            for rule in app.url_map.iter_rules()
            if rule.endpoint != "static"
            for method in rule.methods - {"HEAD", "OPTIONS"}
        }
    finally:
        app.extensions["latlab"].close()
    spec = openapi_spec(auth=True)
    described = {(path, method) for path, item in spec["paths"].items() for method in item}
    assert routes == described


@pytest.mark.parametrize("auth", [False, True])
def test_the_description_is_valid_openapi(auth: bool) -> None:
    schema = schemathesis.openapi.from_dict(openapi_spec(auth))
    assert len(list(schema.get_all_operations())) == 13
    for operation in schema.get_all_operations():
        assert operation.ok().definition.raw["responses"], operation


@pytest.fixture(scope="module")
def fuzzed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("fuzzed-server")
    model = build_tiny_model(folder / "tiny" / "model.onnx")
    deployments = [{"name": "tiny", "model_path": str(model), "batcher": {"max_batch_size": 8}}]
    with running_server(folder, deployments, auth_token=TOKEN, max_body_bytes=256 * 1024) as server:
        yield server
        assert server.alive()


@pytest.mark.e2e
def test_the_live_server_serves_its_description(fuzzed_server: Server) -> None:
    response = fuzzed_server.session.get(fuzzed_server.url + OPENAPI_PATH, timeout=10)
    assert response.status_code == 200 and response.headers["Content-Type"] == "application/json"
    assert response.json() == openapi_spec(auth=True)


@pytest.fixture(scope="module")
def live_schema(fuzzed_server: Server) -> schemathesis.BaseSchema:
    """Loaded from the live server, as a client would."""
    return schemathesis.openapi.from_url(fuzzed_server.url + OPENAPI_PATH)


SPEC = openapi_spec(auth=True)
# Negative cases need something to break: a body, or the Authorization header of the protected routes
# (an operation with only a patterned path parameter has no invalid value schemathesis can send).
CASES = [
    (path, method, mode)
    for path, item in SPEC["paths"].items()
    for method, operation in item.items()
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode == GenerationMode.POSITIVE or "requestBody" in operation or "security" in operation
]
FRAMING_HEADERS = {"transfer-encoding", "content-length", "connection", "te", "upgrade"}
CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance, content_type_conformance]


@pytest.mark.e2e
@pytest.mark.parametrize("path, method, mode", CASES, ids=[f"{m.upper()} {p} {g}" for p, m, g in CASES])
def test_fuzzing_from_the_description_finds_nothing(
    fuzzed_server: Server, live_schema: schemathesis.BaseSchema, path: str, method: str, mode: GenerationMode
) -> None:
    """Positive cases fit the description, negative ones break it (wrong types, missing fields, bad values)."""
    operation = live_schema[path][method.upper()]
    session = requests.Session()

    @settings(
        max_examples=INFER_EXAMPLES if method == "post" else EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def fuzz(case: schemathesis.Case) -> None:
        # Framing headers belong to the HTTP layer (Granian), which refuses a bad one before the app sees the
        # request; the description is the app's, so the fuzzer's values for them test nothing of it.
        case.headers = {k: v for k, v in (case.headers or {}).items() if k.lower() not in FRAMING_HEADERS}
        case.call_and_validate(
            base_url=fuzzed_server.url,
            session=session,
            checks=CHECKS,
            timeout=15,
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        COUNTS["fuzzed requests (schemathesis)"] += 1

    fuzz()
