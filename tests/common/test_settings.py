"""latlab.common.settings: a partial record read with its defaults and written back as it was; each type's own
checks; the admitted bound and default buckets every stage computes alike."""

from __future__ import annotations

import dataclasses

import pytest

from latlab.common.settings import (
    TABLES,
    BatcherSettings,
    CpuOptions,
    CudaOptions,
    PaddingSettings,
    SettingsError,
    TensorrtOptions,
    admitted_bound,
    default_buckets,
)


def test_a_partial_record_takes_the_defaults_and_says_only_its_keys() -> None:
    record = {"max_batch_size": 8, "instances": 2, "preferred_batch_sizes": [4]}
    batcher = BatcherSettings.from_mapping(record)
    assert batcher == BatcherSettings(max_batch_size=8, instances=2, preferred_batch_sizes=(4,))
    assert batcher.says("instances") and not batcher.says("max_queue_size") and batcher.max_queue_size == 256
    assert batcher.as_dict() == record and list(batcher.as_dict()) == list(record)


def test_settings_built_in_code_say_every_setting_in_field_order() -> None:
    batcher = BatcherSettings(max_batch_size=4)
    assert all(batcher.says(f.name) for f in dataclasses.fields(batcher))
    assert list(batcher.as_dict()) == [f.name for f in dataclasses.fields(batcher)]
    assert batcher.as_dict()["batch_buckets"] == []  # as JSON and TOML write a tuple


def test_a_key_no_setting_has_is_kept_and_written_back() -> None:
    record = {"intra_op_threads": 2, "a_newer_option": "x"}
    cpu = CpuOptions.from_mapping(record)
    assert cpu.intra_op_threads == 2 and not hasattr(cpu, "a_newer_option")
    assert cpu.as_dict() == record


def test_updated_and_without_keep_the_record_s_order() -> None:
    base = BatcherSettings.partial(timeout_ms=500.0, max_batch_size=4, batch_buckets=[1, 4])
    changed = base.without("batch_buckets").updated(max_batch_size=8, adaptive=True)
    assert changed.as_dict() == {"timeout_ms": 500.0, "max_batch_size": 8, "adaptive": True}
    assert base.as_dict() == {"timeout_ms": 500.0, "max_batch_size": 4, "batch_buckets": [1, 4]}  # unchanged
    assert BatcherSettings.partial().as_dict() == {}


@pytest.mark.parametrize(
    "settings, message",
    [
        (BatcherSettings(max_batch_size=0), "max_batch_size, max_queue_size and instances must be >= 1"),
        (BatcherSettings(max_batch_size=4, batch_buckets=(1, 2)), "the last of batch_buckets must be max_batch_size"),
        (BatcherSettings(bucket_sessions="some"), "[batcher] bucket_sessions must be one of"),
        (BatcherSettings(priority_levels=2, default_priority_level=3), "default_priority_level in 1..priority_levels"),
        (PaddingSettings(axis=0), "axis must be >= 1 (0 is the batch axis)"),
        (PaddingSettings(values={"ids": "zero"}), "values must be a table of input name = number"),
        (CpuOptions(execution_mode="fast"), "[cpu] execution_mode must be one of"),
        (CudaOptions(gpu_mem_limit=-1), "[cuda] gpu_mem_limit must be >= 0, got -1"),
        (TensorrtOptions(max_workspace_bytes=-1), "[tensorrt] max_workspace_bytes must be >= 0"),
    ],
)
def test_each_type_checks_its_own_values(settings, message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        settings.validate()
    assert message in str(caught.value)


def test_the_defaults_are_valid() -> None:
    for cls in TABLES.values():
        cls().validate()


def test_the_admitted_bound_and_the_default_buckets() -> None:
    assert admitted_bound(BatcherSettings(max_batch_size=32, instances=2, max_queue_size=100)) == 100 + 64
    assert default_buckets("cuda", 12) == (1, 2, 4, 8, 12) and default_buckets("cpu", 12) == ()
