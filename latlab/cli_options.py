"""The `latlab` command's option values: reading rates and SLO bounds, and filling options from the
environment (LATLAB_<OPTION>) and a config file's table. Light: imported before any subcommand runs."""

from __future__ import annotations

import argparse
import os
import time
import tomllib
from pathlib import Path


class UserError(Exception):
    """A mistake the user can fix; printed as one line, exit status 2."""


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


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def parse_rates(text: str) -> list[float]:
    try:
        rates = [float(r) for r in text.split(",") if r.strip()]
    except ValueError:
        raise UserError(f"--rates must be numbers separated by commas, got {text!r}") from None
    if not rates or not all(0 < r < float("inf") for r in rates):
        raise UserError(f"--rates must be positive finite numbers, got {text!r}")
    return rates


def parse_slos(text: str) -> list[float]:
    """'25ms,0.1s,50' -> seconds (a bare number is milliseconds)."""
    slos = []
    for part in (p.strip().lower() for p in text.split(",") if p.strip()):
        scale, number = (
            (1.0, part[:-1]) if part.endswith("s") and not part.endswith("ms") else (1e-3, part.removesuffix("ms"))
        )
        try:
            value = float(number) * scale
        except ValueError:
            value = float("nan")
        if not 0 < value < float("inf"):
            raise UserError(f"--slo: cannot read {part!r}; write positive bounds, e.g. 25ms or 0.1s")
        slos.append(value)
    if not slos:
        raise UserError("--slo needs at least one bound, e.g. 25ms,50ms")
    return slos


def parse_slo_bound(text: str) -> float:
    """'p99=50ms' (or just '50ms') -> seconds."""
    metric, _, bound = text.rpartition("=")
    if metric and metric.strip().lower() != "p99":
        raise UserError(f"--slo: only p99 bounds are supported, got {text!r}")
    return parse_slos(bound)[0]
