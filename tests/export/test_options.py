"""ExportOptions: `latlab export`'s options as a value, what the command line gives and what library code builds."""

from __future__ import annotations

from pathlib import Path

from latlab.cli import _parser
from latlab.export.options import EXTERNAL_DATA_THRESHOLD, ExportOptions


def from_argv(*argv: str) -> ExportOptions:
    return ExportOptions.from_cli_args(_parser().parse_args(["export", *argv]))


def test_the_command_line_defaults_are_the_values_defaults() -> None:
    assert from_argv("mlp") == ExportOptions(model="mlp")
    assert ExportOptions().models_dir == Path("models")
    assert ExportOptions().external_data_threshold == EXTERNAL_DATA_THRESHOLD


def test_every_option_reaches_its_field() -> None:
    options = from_argv(
        "--module", "pkg.mod:make", "--name", "mine", "--models-dir", "/m", "--fp16", "--int8",
        "--min-accuracy", "0.9", "--external-data-threshold", "1024",
    )  # fmt: skip
    assert options == ExportOptions(
        module="pkg.mod:make",
        name="mine",
        models_dir=Path("/m"),
        fp16=True,
        int8=True,
        min_accuracy=0.9,
        external_data_threshold=1024,
    )


def test_zoo_settings_are_the_sizes_given_for_that_model() -> None:
    assert from_argv("mlp", "--hidden", "8").zoo_settings() == {"hidden": 8}
    assert from_argv("ffn").zoo_settings() == {"d_model": 128, "n_layers": 128}
    assert from_argv("rnn", "--cell", "gru", "--d-model", "64").zoo_settings() == {"cell": "gru"}
