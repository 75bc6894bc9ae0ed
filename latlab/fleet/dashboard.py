"""The fleet's Grafana dashboard (grafana/fleet/fleet.json), its panels written from targets.watch_queries:
`python -m latlab.fleet.dashboard > grafana/fleet/fleet.json` rewrites it."""

from __future__ import annotations

import json

from latlab.fleet.targets import watch_queries

DATASOURCE = {"type": "prometheus", "uid": "latlab-prometheus"}
PANELS = (
    # title, queries (watch_queries' names), unit, legend
    ("Requests/s per replica", ("rate per replica",), "reqps", "{{replica}}"),
    ("p99 latency per replica", ("p99 per replica",), "s", "{{replica}}"),
    ("Queue per replica", ("queue per replica",), "short", "{{replica}}"),
    ("Imbalance (busiest replica / mean, 1 = even)", ("imbalance",), "short", "imbalance"),
    ("Proxy queue", ("proxy queue",), "short", "queued at the proxy"),
    ("Proxy retries and redispatches /s", ("proxy retries", "proxy redispatches"), "ops", ""),
)


def fleet_dashboard() -> dict:
    """The dashboard: one time series panel per entry of PANELS, two per row, for the fleet(s) picked."""
    queries = watch_queries(fleet="$fleet", window="$__rate_interval")
    panels = [
        _panel(i, title, [(name, queries[name]) for name in names], unit, legend)
        for i, (title, names, unit, legend) in enumerate(PANELS)
    ]
    return {
        "uid": "latlab-fleet",
        "title": "latlab / Fleet",
        "description": "latlab fleet: per replica rate, p99 and queue, imbalance, the proxy's queue and retries.",
        "tags": ["latlab"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "5s",
        "schemaVersion": 41,
        "version": 1,
        "time": {"from": "now-15m", "to": "now"},
        "templating": {"list": [_fleet_variable()]},
        "panels": panels,
    }


def _panel(index: int, title: str, targets: list[tuple[str, str]], unit: str, legend: str) -> dict:
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": title,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
        "fieldConfig": {"defaults": {"unit": unit, "custom": {"axisSoftMin": 0}}, "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]}},
        "targets": [
            {"datasource": DATASOURCE, "refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend or name}
            for i, (name, expr) in enumerate(targets)
        ],
    }


def _fleet_variable() -> dict:
    query = "label_values(latlab_server_inflight_requests, fleet)"
    return {
        "name": "fleet",
        "label": "Fleet",
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"qryType": 1, "query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "refresh": 2,
        "sort": 1,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
    }


def dashboard_text() -> str:
    return json.dumps(fleet_dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    print(dashboard_text(), end="")
