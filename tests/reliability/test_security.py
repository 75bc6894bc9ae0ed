"""Security: loopback by default, an optional bearer token on infer and config, model files only from
model_dir, no pickle or eval, and every limit with a safe default."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Iterator

import numpy as np
import psutil
import pytest

import latlab.server
from latlab.server.http import guards
from latlab.server.config import BatcherSettings, ServerConfig, load_config, parse_config
from latlab.server.errors import ConfigError, Unauthorized
from latlab.server.processes.wsgi import bind_warning

from tests.conftest import build_tiny_model
from tests.reliability.conftest import COUNTS, Server, assert_error, output_of, running_server, tiny_body, tiny_y

TOKEN = "s3cret-token-for-tests-0123456789"
X = np.arange(4, dtype=np.float32).reshape(1, 4)


@pytest.fixture(scope="module")
def guarded_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The token comes from LATLAB_AUTH_TOKEN only: the config file has none."""
    folder = tmp_path_factory.mktemp("guarded-server")
    model = build_tiny_model(folder / "tiny" / "model.onnx")
    with running_server(
        folder, [{"name": "tiny", "model_path": str(model)}], env={"LATLAB_AUTH_TOKEN": TOKEN}
    ) as server:
        yield server


@pytest.mark.e2e
@pytest.mark.parametrize(
    "authorization, fragment",
    [
        (None, "needs an 'Authorization: Bearer <token>' header"),
        (f"Basic {TOKEN}", "needs an 'Authorization: Bearer <token>' header"),
        ("Bearer", "needs an 'Authorization: Bearer <token>' header"),
        ("Bearer wrong", "the bearer token is not valid"),
        (f"Bearer {TOKEN[:-1]}X", "the bearer token is not valid"),
        (f"Bearer {TOKEN}extra", "the bearer token is not valid"),
    ],
    ids=["none", "basic", "empty", "wrong", "last-char", "longer"],
)
def test_infer_and_config_need_the_token(guarded_server: Server, authorization: str | None, fragment: str) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    for response in (
        guarded_server.infer(tiny_body(X), headers=headers),
        guarded_server.infer(tiny_body(X), model="unknown", headers=headers),  # names nothing
        guarded_server.session.get(f"{guarded_server.url}/v2/models/tiny/config", headers=headers, timeout=10),
    ):
        assert_error(response, 401, fragment)
        assert response.headers["WWW-Authenticate"] == 'Bearer realm="latlab"'
        assert TOKEN not in response.text
        COUNTS["bad requests (auth)"] += 1


@pytest.mark.e2e
def test_the_right_token_is_served(guarded_server: Server) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    response = guarded_server.infer(tiny_body(X), headers=headers)
    assert response.status_code == 200
    np.testing.assert_allclose(output_of(response, (1, 3)), tiny_y(X), rtol=1e-5)
    config = guarded_server.session.get(f"{guarded_server.url}/v2/models/tiny/config", headers=headers, timeout=10)
    assert config.status_code == 200 and TOKEN not in config.text


@pytest.mark.e2e
@pytest.mark.parametrize(
    "path",
    [
        "/v2/health/live",
        "/v2/health/ready",
        "/v2",
        "/v2/models/tiny",
        "/v2/models/tiny/ready",
        "/v2/models/tiny/versions/1",
        "/metrics",
        "/v2/openapi.json",
    ],
)
def test_health_metadata_metrics_and_the_api_description_stay_open(guarded_server: Server, path: str) -> None:
    assert guarded_server.session.get(guarded_server.url + path, timeout=10).status_code == 200


@pytest.mark.e2e
def test_the_server_listens_on_loopback_only_by_default(guarded_server: Server) -> None:
    parent = psutil.Process(guarded_server.process.pid)
    listening = [
        c for p in (parent, *parent.children()) for c in p.net_connections("inet") if c.status == psutil.CONN_LISTEN
    ]
    assert listening and {c.laddr.ip for c in listening} == {"127.0.0.1"}


def test_the_token_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = guards.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(guards.hmac, "compare_digest", spy)
    guards.check_bearer(TOKEN, f"Bearer {TOKEN}")
    with pytest.raises(Unauthorized):
        guards.check_bearer(TOKEN, "Bearer nope")
    assert compared == [(TOKEN.encode(), TOKEN.encode()), (b"nope", TOKEN.encode())]


def test_no_token_configured_means_no_check() -> None:
    guards.check_bearer("", None)


@pytest.mark.parametrize("token", ["short", "has space in it 0123456789", "ünïcödé-0123456789abcdef", "x" * 15])
def test_weak_or_malformed_tokens_are_refused_without_being_echoed(tmp_path: Path, token: str) -> None:
    with pytest.raises(ConfigError, match="at least 16 characters") as caught:
        parse_config({"server": {"auth_token": token}, "deployments": [{"name": "m", "model_path": "m.onnx"}]})
    assert token not in str(caught.value)


def test_the_environment_token_wins_and_never_shows_in_repr(tmp_path: Path) -> None:
    config_file = tmp_path / "s.toml"
    config_file.write_text(
        '[server]\nauth_token = "from-the-file-0123456789"\n[[deployments]]\nname = "m"\nmodel_path = "m.onnx"\n'
    )
    assert load_config(config_file, environ={}).auth_token == "from-the-file-0123456789"
    config = load_config(config_file, environ={"LATLAB_AUTH_TOKEN": TOKEN})
    assert config.auth_token == TOKEN and TOKEN not in repr(config)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    build_tiny_model(tmp_path / "models" / "tiny" / "model.onnx")
    build_tiny_model(tmp_path / "elsewhere" / "model.onnx")
    return tmp_path / "models"


def with_model_dir(folder: Path, model_path: str) -> ServerConfig:
    return parse_config(
        {"server": {"model_dir": "models"}, "deployments": [{"name": "m", "model_path": model_path}]}, base_dir=folder
    )


def test_model_paths_inside_model_dir_are_served(model_dir: Path) -> None:
    config = with_model_dir(model_dir.parent, "models/tiny/model.onnx")
    assert config.model_dir == model_dir.resolve()
    assert config.deployments[0].model_path == (model_dir / "tiny" / "model.onnx").resolve()


@pytest.mark.parametrize("how", ["dot-dot", "absolute", "symlink"])
def test_model_paths_escaping_model_dir_are_refused(model_dir: Path, how: str) -> None:
    outside = model_dir.parent / "elsewhere" / "model.onnx"
    if how == "symlink":
        (model_dir / "link.onnx").symlink_to(outside)
    model_path = {
        "dot-dot": "models/tiny/../../elsewhere/model.onnx",
        "absolute": str(outside),
        "symlink": "models/link.onnx",
    }[how]
    with pytest.raises(ConfigError) as caught:
        with_model_dir(model_dir.parent, model_path)
    message = str(caught.value)
    assert "deployment 'm'" in message and f"outside model_dir {model_dir.resolve()}" in message
    assert str(outside.resolve()) in message


def test_model_dir_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="model_dir .* is not a folder"):
        with_model_dir(tmp_path, "models/x.onnx")


@pytest.mark.parametrize(
    "host, warned",
    [
        ("127.0.0.1", False),
        ("127.0.0.2", False),
        ("::1", False),
        ("[::1]", False),
        ("localhost", False),
        ("0.0.0.0", True),
        ("::", True),
        ("10.1.2.3", True),
        ("example.org", True),
    ],
)
def test_binding_beyond_loopback_is_warned_about(host: str, warned: bool) -> None:
    warning = bind_warning(host, auth=False)
    assert (warning is not None) == warned
    if warned:
        assert host in warning and "auth_token" in warning
        assert "auth_token" not in bind_warning(host, auth=True)


FORBIDDEN_MODULES = {"pickle", "cPickle", "dill", "marshal", "shelve", "cloudpickle", "joblib"}
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__"}


def test_the_server_never_unpickles_or_evaluates_anything() -> None:
    """No deserialiser that runs code and no eval of request content anywhere in the server package."""
    for source in Path(latlab.server.__file__).parent.glob("*.py"):
        tree = ast.parse(source.read_text(), str(source))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert not {a.name.split(".")[0] for a in node.names} & FORBIDDEN_MODULES, source
            elif isinstance(node, ast.ImportFrom):
                assert (node.module or "").split(".")[0] not in FORBIDDEN_MODULES, source
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in FORBIDDEN_CALLS, f"{source}:{node.lineno}"
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                assert node.func.attr not in {"loads", "load"} or ast.unparse(node.func.value) in {
                    "orjson",
                    "tomllib",
                    "onnx",
                }, f"{source}:{node.lineno}: {ast.unparse(node)}"


def test_every_limit_has_a_safe_default() -> None:
    config = parse_config({"deployments": [{"name": "m", "model_path": "m.onnx"}]})
    batcher = BatcherSettings()
    assert config.host == "127.0.0.1" and config.auth_token == "" and config.on_load_failure == "fail"
    assert 0 < config.max_body_bytes <= 64 * 1024 * 1024
    assert batcher.max_batch_size == 1 and 0 < batcher.max_queue_size <= 1024
    # bounded by what the deployment admits at the door (server/batching/admission.py), plus a few spare threads
    assert config.admission and 0 < config.threads <= batcher.max_queue_size + batcher.max_batch_size + 16
    assert 0 < batcher.timeout_ms <= 60_000 and batcher.max_queue_delay_ms >= 0
    assert not config.deployments[0].allow_non_finite
    assert {f.name for f in dataclasses.fields(ServerConfig)} >= {
        "max_body_bytes",
        "threads",
        "auth_token",
        "model_dir",
        "on_load_failure",
        "admission",
    }
