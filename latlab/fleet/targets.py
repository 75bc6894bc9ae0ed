"""The fleet's Prometheus targets (file_sd), written from its FleetSpec: every replica's observer port and the
proxy's exporter, in one file that grafana/prometheus.yml's latlab-server job reads (targets/servers*.json)."""

from __future__ import annotations

import json
from pathlib import Path

from latlab.fleet.spec import FleetSpec

PROXY_JOB = "latlab-proxy"
"""The proxy's job label: its target sits in a server target file but is not a latlab server (a target's own
`job` label wins over the scrape config's job name)."""
TARGETS_FILE = "servers-fleet.json"
SERVING_LABEL = "__latlab_serving"
"""A replica group's label naming its main port's host:port, where infer requests go: a load test through the
proxy measures the proxy's added latency against it (loadtest/fleet.py). Prometheus drops labels that start with
`__` once its relabelling is done, so no series carries it."""


def file_sd(spec: FleetSpec, fleet: str = "fleet") -> list[dict]:
    """Prometheus file_sd target groups: one per replica (labels fleet, replica and its serving address) and one
    for the proxy (labels fleet, job and balance: a load test through the proxy records the fleet from them,
    loadtest/fleet.py)."""
    groups = [
        {
            "targets": [f"127.0.0.1:{r.metrics_port}"],
            "labels": {"fleet": fleet, "replica": r.name, SERVING_LABEL: f"127.0.0.1:{r.port}"},
        }
        for r in spec.replicas
    ]
    proxy = {"fleet": fleet, "job": PROXY_JOB, "balance": spec.balance}
    groups.append({"targets": [f"127.0.0.1:{spec.stats_port}"], "labels": proxy})
    return groups


def write_targets(spec: FleetSpec, path: Path, fleet: str = "fleet") -> Path:
    """file_sd(spec) as JSON at `path`, written whole then renamed (Prometheus watches the file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(file_sd(spec, fleet), indent=2) + "\n")
    partial.replace(path)
    return path


def watch_queries(fleet: str = "fleet", window: str = "30s") -> dict[str, str]:
    """PromQL for watching a fleet through these targets (docs/fleet.md, and the panels of its Grafana dashboard,
    dashboard.py): per replica rate, p99 and queue, the imbalance between replicas (the busiest replica's rate
    over the mean: 1 is even), the proxy's queue, retries and redispatches. `fleet` is a regular expression."""
    replicas = f'{{fleet=~"{fleet}"}}'
    proxy = f'{{fleet=~"{fleet}",job="{PROXY_JOB}",proxy="replicas"}}'
    rate = f"sum by (replica) (rate(latlab_server_requests_total{replicas}[{window}]))"
    return {
        "rate per replica": rate,
        "p99 per replica": "histogram_quantile(0.99, sum by (replica, le) "
        f"(rate(latlab_server_request_duration_seconds_bucket{replicas}[{window}])))",
        "queue per replica": f"sum by (replica) (latlab_batcher_queue_depth{replicas})",
        "imbalance": f"max({rate}) / avg({rate})",
        "proxy queue": f"haproxy_backend_current_queue{proxy}",
        "proxy retries": f"rate(haproxy_backend_retry_warnings_total{proxy}[{window}])",
        "proxy redispatches": f"rate(haproxy_backend_redispatch_warnings_total{proxy}[{window}])",
    }
