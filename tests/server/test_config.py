"""latlab.server.config: TOML -> typed settings, and a readable ConfigError for every mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from latlab.server.config import BatcherSettings, CpuOptions, DeploymentConfig, ServerConfig, load_config, parse_config
from latlab.server.errors import ConfigError

FULL_TOML = """
[server]
host = "0.0.0.0"
port = 9000
threads = 400
max_body_bytes = 1048576

[[deployments]]
name = "tiny-cpu"
model_path = "tiny/model.onnx"

[deployments.batcher]
max_batch_size = 16
max_queue_delay_ms = 2.5
max_queue_size = 100
instances = 2
timeout_ms = 500

[deployments.cpu]
intra_op_threads = 4
allow_spinning = false

[[deployments]]
name = "tiny-abs"
model_path = "{absolute}"
model = "mlp"
"""


def write(tmp_path: Path, text: str, name: str = "server.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_load_config_reads_every_setting(tmp_path: Path) -> None:
    absolute = tmp_path / "elsewhere" / "m.onnx"
    config = load_config(write(tmp_path, FULL_TOML.replace("{absolute}", str(absolute))))
    assert isinstance(config, ServerConfig)
    assert (config.host, config.port, config.threads, config.max_body_bytes) == ("0.0.0.0", 9000, 400, 1048576)
    first, second = config.deployments
    assert first == DeploymentConfig(
        name="tiny-cpu",
        model_path=(tmp_path / "tiny" / "model.onnx").resolve(),
        provider="cpu",
        batcher=BatcherSettings(
            max_batch_size=16, max_queue_delay_ms=2.5, max_queue_size=100, instances=2, timeout_ms=500
        ),
        cpu=CpuOptions(intra_op_threads=4, allow_spinning=False),
        model="tiny",
    )
    assert second.model_path == absolute
    assert second.model == "mlp"
    assert second.batcher == BatcherSettings()
    assert second.cpu == CpuOptions()


def test_relative_model_path_is_resolved_against_the_toml_folder(tmp_path: Path, monkeypatch) -> None:
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    monkeypatch.chdir(tmp_path)  # the working directory must not matter
    config = load_config(write(conf_dir, '[[deployments]]\nname = "a"\nmodel_path = "../models/ffn/model.onnx"\n'))
    [deployment] = config.deployments
    assert deployment.model_path == (tmp_path / "models" / "ffn" / "model.onnx").resolve()
    assert deployment.model_path.is_absolute()
    assert deployment.model == "ffn"  # defaults to the model file's folder name


def test_load_config_accepts_a_string_path(tmp_path: Path) -> None:
    path = write(tmp_path, '[[deployments]]\nname = "a"\nmodel_path = "m/model.onnx"\n')
    assert load_config(str(path)).deployments[0].model_path == (tmp_path / "m" / "model.onnx").resolve()


def test_defaults() -> None:
    config = parse_config({"deployments": [{"name": "a", "model_path": "/models/x/model.onnx"}]})
    # threads: one per admitted request (256 queued + 1 running) plus 4 spare (server/batching/admission.py)
    assert (config.host, config.port, config.threads, config.max_body_bytes) == ("127.0.0.1", 8000, 261, 64 << 20)
    assert (config.metrics_port, config.admission) == (0, True)
    [deployment] = config.deployments
    assert deployment.provider == "cpu"
    assert deployment.batcher == BatcherSettings(
        max_batch_size=1, max_queue_delay_ms=0.0, max_queue_size=256, instances=1, timeout_ms=10_000.0
    )
    assert deployment.cpu == CpuOptions(intra_op_threads=0, allow_spinning=True)


def test_parse_config_resolves_against_base_dir(tmp_path: Path) -> None:
    config = parse_config({"deployments": [{"name": "a", "model_path": "x.onnx"}]}, base_dir=tmp_path)
    assert config.deployments[0].model_path == (tmp_path / "x.onnx").resolve()


def test_cuda_provider_is_accepted() -> None:
    config = parse_config({"deployments": [{"name": "g", "model_path": "/m.onnx", "provider": "cuda"}]})
    assert config.deployments[0].provider == "cuda"


def test_settings_are_immutable() -> None:
    config = parse_config({"deployments": [{"name": "a", "model_path": "/m.onnx"}]})
    with pytest.raises(AttributeError):
        config.port = 1  # type: ignore[misc]


# --- errors ----------------------------------------------------------------------------------------


def test_bad_toml_is_a_config_error(tmp_path: Path) -> None:
    path = write(tmp_path, "[[deployments]\nname = ")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert f"config file {path} is not valid TOML" in str(caught.value)


def test_non_utf8_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "server.toml"
    path.write_bytes(b'name = "\xff"\n')
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_config(path)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == f"config file {path} does not exist"


@pytest.mark.parametrize("doc", [{}, {"deployments": []}, {"server": {"port": 1}}, {"deployments": {"name": "a"}}])
def test_no_deployments_is_a_config_error(doc: dict) -> None:
    with pytest.raises(ConfigError, match=r"at least one \[\[deployments\]\] table"):
        parse_config(doc)


def test_empty_toml_file_has_no_deployments(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="at least one"):
        load_config(write(tmp_path, ""))


def deployment(**extra: object) -> dict:
    return {"deployments": [{"name": "a", "model_path": "/m.onnx", **extra}]}


@pytest.mark.parametrize(
    "doc, message",
    [
        ({**deployment(), "server": {"prot": 8000}}, "[server]: unknown setting(s) ['prot']"),
        (deployment(batch_size=8), "deployment 'a': unknown setting(s) ['batch_size']"),
        (deployment(batcher={"max_batch": 8}), "deployment 'a' [batcher]: unknown setting(s) ['max_batch']"),
        (deployment(cpu={"threads": 2}), "deployment 'a' [cpu]: unknown setting(s) ['threads']"),
    ],
)
def test_unknown_key_is_named(doc: dict, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(doc)
    assert message in str(caught.value)
    assert "known:" in str(caught.value)


@pytest.mark.parametrize(
    "doc, message",
    [
        ({**deployment(), "server": {"port": "8000"}}, "[server]: port must be an integer, got '8000'"),
        ({**deployment(), "server": {"threads": 8.0}}, "[server]: threads must be an integer, got 8.0"),
        ({**deployment(), "server": {"port": True}}, "[server]: port must be an integer, got True"),
        (deployment(batcher={"max_batch_size": "8"}), "deployment 'a' [batcher]: max_batch_size must be an integer"),
        (deployment(batcher={"max_queue_delay_ms": "1"}), "max_queue_delay_ms must be a number, got '1'"),
        (deployment(batcher={"timeout_ms": False}), "timeout_ms must be a number, got False"),
        (deployment(cpu={"allow_spinning": 1}), "deployment 'a' [cpu]: allow_spinning must be true or false, got 1"),
        (deployment(cpu={"intra_op_threads": 1.5}), "intra_op_threads must be an integer, got 1.5"),
    ],
)
def test_wrong_type_is_named(doc: dict, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(doc)
    assert message in str(caught.value)


def test_wrong_type_in_a_toml_file(tmp_path: Path) -> None:
    path = write(
        tmp_path, '[[deployments]]\nname = "a"\nmodel_path = "m.onnx"\n[deployments.batcher]\nmax_batch_size = "8"\n'
    )
    with pytest.raises(ConfigError, match="max_batch_size must be an integer, got '8'"):
        load_config(path)


def test_float_setting_accepts_an_integer() -> None:
    config = parse_config(deployment(batcher={"max_queue_delay_ms": 5}))
    assert config.deployments[0].batcher.max_queue_delay_ms == 5


@pytest.mark.parametrize(
    "doc",
    [
        {"server": "fast", **deployment()},
        {"deployments": ["a"]},
        deployment(batcher=8),
        deployment(cpu=True),
    ],
)
def test_a_table_of_the_wrong_type_is_a_config_error(doc: dict) -> None:
    """Valid TOML whose tables are scalars must give a readable ConfigError, not a TypeError traceback."""
    with pytest.raises(ConfigError):
        parse_config(doc)


def test_duplicate_names_are_refused() -> None:
    doc = {
        "deployments": [
            {"name": "a", "model_path": "/m.onnx"},
            {"name": "b", "model_path": "/m.onnx"},
            {"name": "a", "model_path": "/n.onnx"},
        ]
    }
    with pytest.raises(ConfigError) as caught:
        parse_config(doc)
    assert "deployment names must be unique, got ['a', 'b', 'a']" in str(caught.value)


@pytest.mark.parametrize("provider", ["gpu", "CUDA", "TensorRT", 1])
def test_bad_provider_is_refused(provider: object) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(deployment(provider=provider))
    assert f"deployment 'a': provider must be one of ('cpu', 'cuda', 'tensorrt'), got {provider!r}" in str(caught.value)


@pytest.mark.parametrize("name", [None, "", "a/b", 3])
def test_bad_name_is_refused(name: object) -> None:
    raw = {"model_path": "/m.onnx"} if name is None else {"name": name, "model_path": "/m.onnx"}
    with pytest.raises(ConfigError, match="every deployment needs a 'name' without '/'"):
        parse_config({"deployments": [raw]})


def test_missing_model_path_is_refused() -> None:
    with pytest.raises(ConfigError, match="deployment 'a' needs a 'model_path'"):
        parse_config({"deployments": [{"name": "a"}]})


@pytest.mark.parametrize(
    "batcher, message",
    [
        ({"max_batch_size": 0}, "max_batch_size, max_queue_size and instances must be >= 1"),
        ({"max_queue_size": 0}, "max_batch_size, max_queue_size and instances must be >= 1"),
        ({"instances": 0}, "max_batch_size, max_queue_size and instances must be >= 1"),
        ({"max_queue_delay_ms": -1}, "max_queue_delay_ms must be >= 0 and timeout_ms > 0"),
        ({"timeout_ms": 0}, "max_queue_delay_ms must be >= 0 and timeout_ms > 0"),
    ],
)
def test_out_of_range_batcher_settings_are_refused(batcher: dict, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(deployment(batcher=batcher))
    assert f"deployment 'a': {message}" in str(caught.value)


def test_parse_config_does_not_mutate_its_input() -> None:
    doc = deployment(batcher={"max_batch_size": 4}, cpu={"intra_op_threads": 1})
    snapshot = repr(doc)
    parse_config(doc)
    parse_config(doc)  # a second parse of the same dict still works
    assert repr(doc) == snapshot


def test_preferred_batch_sizes_are_read_and_checked():
    doc = {
        "deployments": [
            {"name": "a", "model_path": "/m.onnx", "batcher": {"max_batch_size": 8, "preferred_batch_sizes": [4, 8]}}
        ]
    }
    assert parse_config(doc).deployments[0].batcher.preferred_batch_sizes == (4, 8)
    for bad in ([16], [0], "4", [2.5]):
        doc["deployments"][0]["batcher"]["preferred_batch_sizes"] = bad
        with pytest.raises(ConfigError, match="preferred_batch_sizes"):
            parse_config(doc)
