"""A deployment's settings tables read from TOML and checked: an unknown key, a value of the wrong type or one out of
its range is refused with one ConfigError that says where (server/config.py reads the rest of the file)."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, Mapping

from latlab.common.settings import BatcherSettings, CpuOptions, CudaOptions, PaddingSettings, Settings, SettingsError
from latlab.common.settings import TensorrtOptions, default_buckets
from latlab.server.errors import ConfigError


def batcher_table(value: object, name: str, provider: str) -> BatcherSettings:
    """[deployments.batcher], checked; without batch_buckets, the provider's default ones."""
    batcher = as_table(value, f"deployment '{name}' batcher")
    _tuple_setting(batcher, "preferred_batch_sizes", name)
    _tuple_setting(batcher, "batch_buckets", name)
    settings = _valid(build(BatcherSettings, batcher, f"deployment '{name}' [batcher]"), f"deployment '{name}'")
    if "batch_buckets" in batcher:
        return settings
    return replace(settings, batch_buckets=default_buckets(provider, settings.max_batch_size))


def padding_table(value: object, name: str) -> PaddingSettings:
    """[deployments.padding], checked."""
    where = f"deployment '{name}' [padding]"
    return _valid(build(PaddingSettings, as_table(value, f"deployment '{name}' padding"), where), where)


def provider_tables(raw: dict, name: str, batcher: BatcherSettings) -> tuple[CpuOptions, CudaOptions, TensorrtOptions]:
    """The [cpu], [cuda] and [tensorrt] tables of a deployment (popped from `raw`), each value checked against its
    choices."""
    tables = {key: as_table(raw.pop(key, {}), f"deployment '{name}' {key}") for key in ("cpu", "cuda", "tensorrt")}
    cpu, cuda, tensorrt = (
        build(cls, tables[key], f"deployment '{name}' [{key}]")
        for key, cls in (("cpu", CpuOptions), ("cuda", CudaOptions), ("tensorrt", TensorrtOptions))
    )
    for options in (cpu, cuda, tensorrt):  # every table's types first, then their values
        _valid(options, f"deployment '{name}'")
    if cuda.enable_cuda_graph and raw.get("provider") == "tensorrt":
        raise ConfigError(
            f"deployment '{name}': [cuda] enable_cuda_graph is for provider \"cuda\" only (TensorRT "
            "builds its own engines)"
        )
    if cuda.enable_cuda_graph and batcher.max_batch_size != 1 and not batcher.batch_buckets:
        # A CUDA graph replays fixed shapes: one graph per bucket, so batches need buckets.
        raise ConfigError(
            f"deployment '{name}': [cuda] enable_cuda_graph with max_batch_size "
            f"{batcher.max_batch_size} needs batch_buckets (a captured graph has fixed shapes)"
        )
    return cpu, cuda, tensorrt


def _tuple_setting(table: dict, key: str, name: str) -> None:
    """A list setting of the [batcher] table, as a tuple (frozen settings stay hashable)."""
    if key in table:
        if not isinstance(table[key], list):
            raise ConfigError(f"deployment '{name}': {key} must be a list, got {table[key]!r}")
        table[key] = tuple(table[key])


def _valid(settings: Settings, where: str) -> Any:
    """The settings, their values checked (Settings.validate), or a ConfigError saying where."""
    try:
        settings.validate()
    except SettingsError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return settings


def as_table(value: object, where: str) -> dict:
    """A copy of a TOML table; a ConfigError when `value` is not one."""
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a table, got {value!r}")
    return dict(value)


def build(cls, raw: dict, where: str, **given):
    """Instantiate a settings dataclass, naming unknown keys and wrong types instead of a TypeError."""
    check_settings(cls, raw, where)
    return cls(**raw, **given)


def check_settings(cls, raw: Mapping, where: str) -> None:
    """A ConfigError naming the first unknown key or value of the wrong type for settings dataclass `cls`."""
    known = {f.name: f for f in fields(cls)}
    unknown = set(raw) - set(known)
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) {sorted(unknown)}; known: {sorted(known)}")
    for key, value in raw.items():
        default = getattr(cls, key, None)
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"{where}: {key} must be true or false, got {value!r}")
        elif isinstance(default, int) and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{where}: {key} must be an integer, got {value!r}")
        elif isinstance(default, float) and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConfigError(f"{where}: {key} must be a number, got {value!r}")
        elif isinstance(default, str) and not isinstance(value, str):
            raise ConfigError(f"{where}: {key} must be a string, got {type(value).__name__}")
