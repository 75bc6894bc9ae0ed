"""The `latlab` command's options filled from the environment (LATLAB_<OPTION>) and a config file's table.
Light: imported before any subcommand runs. Rates and SLO bounds are read in common/user_input.py."""

from __future__ import annotations

import argparse
import os
import tomllib
from pathlib import Path

from latlab.common.user_input import UserError

ENV_PREFIX = "LATLAB_"


def apply_env_and_file(
    parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str]
) -> argparse.Namespace:
    """Fill the options not given on the command line from LATLAB_<OPTION>, then from the
    [<command>] table of --config-file (or LATLAB_CONFIG_FILE)."""
    sub = _subparser(parser, args.command)
    config_file = args.config_file or os.environ.get(f"{ENV_PREFIX}CONFIG_FILE")
    table: dict = {}
    if config_file:
        try:
            table = tomllib.loads(Path(config_file).read_text()).get(args.command, {})
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise UserError(f"--config-file {config_file}: {exc}") from None
    given = {option for option in argv if option.startswith("--")}
    known = {action.dest: action for action in sub._actions if action.option_strings}
    unknown = set(table) - {dest.replace("_", "-") for dest in known} - set(known)
    if unknown:
        raise UserError(f"--config-file {config_file}: unknown option(s) {sorted(unknown)}")
    for dest, action in known.items():
        if dest in ("help", "config_file") or any(o.split("=")[0] in action.option_strings for o in given):
            continue
        raw = os.environ.get(ENV_PREFIX + dest.upper())
        if raw is None:
            raw = table.get(dest.replace("_", "-"), table.get(dest))
        if raw is not None:
            setattr(args, dest, _convert(action, raw, dest))
    return args


def _convert(action: argparse.Action, raw: object, dest: str) -> object:
    if isinstance(action, argparse._StoreTrueAction):
        return raw if isinstance(raw, bool) else str(raw).lower() in ("1", "true", "yes", "on")
    if isinstance(action, argparse._AppendAction):
        return raw if isinstance(raw, list) else [str(raw)]
    try:
        return action.type(raw) if action.type else str(raw)
    except (TypeError, ValueError):
        raise UserError(f"{dest}: cannot read {raw!r}") from None


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command]
    raise LookupError(command)
