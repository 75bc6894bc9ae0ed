"""The observability files latlab ships under grafana/, read the way Grafana and Prometheus read them."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import yaml

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "grafana"
DASHBOARD_DIR = GRAFANA / "dashboards"
RULE_FILES = sorted((GRAFANA / "rules").glob("*.yml"))
DATASOURCE = {"type": "prometheus", "uid": "latlab-prometheus"}
# Grafana's own variables that the dashboards use; everything else named $x must be a dashboard variable.
BUILTINS = {"__rate_interval", "__range", "__interval"}
VARIABLE_REF = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>\w+)\)$", re.S)
# An alert is `signal <op> number`: the comparison with its bound is the expression's last, top-level part.
ALERT_FORM = re.compile(r"^(?P<signal>.+?)\s*(?P<op>>=|<=|>|<|==|!=)\s*(?P<bound>[-+0-9.eE]+)\s*$", re.S)


@dataclass(frozen=True)
class Target:
    """One query of one panel, with what is needed to evaluate it as Grafana would."""

    dashboard: str
    panel_id: int
    panel_title: str
    ref_id: str
    expr: str
    instant: bool
    repeat: str | None  # the variable the panel repeats over (one panel per value), if any

    @property
    def name(self) -> str:
        return f"{self.dashboard}/{self.panel_id}/{self.ref_id}"


def dashboards() -> dict[str, dict]:
    """{file stem: dashboard model} for every JSON file the dashboard provider loads."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(DASHBOARD_DIR.glob("*.json"))}


def panels(dashboard: dict) -> Iterator[dict]:
    """Every panel, rows included, and the panels folded inside collapsed rows."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def variables(dashboard: dict) -> list[dict]:
    return dashboard.get("templating", {}).get("list", [])


def targets() -> list[Target]:
    found = []
    for stem, dashboard in dashboards().items():
        for panel in panels(dashboard):
            for target in panel.get("targets", []):
                found.append(
                    Target(
                        stem,
                        panel["id"],
                        panel.get("title", ""),
                        target.get("refId", ""),
                        target.get("expr", ""),
                        bool(target.get("instant")),
                        panel.get("repeat"),
                    )
                )
    return found


def referenced_variables(text: str) -> set[str]:
    return {braced or bare for braced, bare in VARIABLE_REF.findall(text)}


def substitute(expr: str, values: dict[str, str]) -> str:
    """Replace $name and ${name} by values[name]; a name without a value is an error, not left as is."""

    def one(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"no value for ${name} in {expr!r}")
        return values[name]

    return VARIABLE_REF.sub(one, expr)


def label_values(definition: str) -> tuple[str, str]:
    """(series selector, label) of a Grafana `label_values(selector, label)` variable query."""
    match = LABEL_VALUES.match(definition.strip())
    if not match:
        raise ValueError(f"not a label_values(selector, label) query: {definition!r}")
    return match["selector"].strip(), match["label"]


def rule_groups() -> list[dict]:
    return [group for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"]]


def recording_rules() -> list[dict]:
    return [rule for group in rule_groups() for rule in group["rules"] if "record" in rule]


def alert_rules() -> list[dict]:
    return [rule for group in rule_groups() for rule in group["rules"] if "alert" in rule]


def alert_signal(expr: str) -> str:
    """The signal an alert compares with its bound: `signal > 0.05` gives `signal`."""
    match = ALERT_FORM.match(expr.strip())
    if not match:
        raise ValueError(f"alert expression is not `signal <op> number`: {expr!r}")
    return match["signal"]
