"""The serving fleet a load test measures through its proxy (`--fleet FILE`: the file_sd targets `latlab fleet`
writes): its replicas and balance from the file's labels, and per step the requests each replica answered and the
proxy's counters, each read from its own /metrics at the step's start and end. (Not the generator's own worker
processes: fleet_cpu.py.)

Light at import: plan.py reads the targets file for every `latlab` command that builds a plan, so the HTTP client
and the Prometheus text parser are imported only where a step reads metrics."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

from latlab.common.user_input import UserError

T = TypeVar("T")
PROXY_JOB = "latlab-proxy"
"""The `job` label of the proxy's target group; latlab/fleet/targets.py writes it (tests/fleet checks they agree)."""
FRONTEND, BACKEND = "fleet", "replicas"
"""The proxy's client frontend and its replicas' backend, as latlab/fleet/haproxy.py names them."""
SERVING_LABEL = "__latlab_serving"
"""A replica group's label naming where it serves infer requests; latlab/fleet/targets.py writes it."""
REPLICA_REQUESTS = "latlab_server_requests_total"

PROXY_COUNTERS = {
    "requests": ("haproxy_frontend_http_requests_total", FRONTEND, None),
    "4xx": ("haproxy_frontend_http_responses_total", FRONTEND, "4xx"),
    "5xx": ("haproxy_frontend_http_responses_total", FRONTEND, "5xx"),
    "retries": ("haproxy_backend_retry_warnings_total", BACKEND, None),
    "redispatches": ("haproxy_backend_redispatch_warnings_total", BACKEND, None),
}
"""Step figure -> (HAProxy exporter's counter, its `proxy` label, its `code` label or None for any): the requests
clients sent the proxy, its answers of class 4xx (a rate limit's 429s among them) and 5xx, its retries and
redispatches to another replica."""
PROXY_QUEUE = "haproxy_backend_current_queue"
"""Requests waiting in the proxy for a free replica connection, read at the step's end (a gauge)."""


@dataclass(frozen=True)
class FleetTargets:
    """A fleet as its targets file names it: each replica's observer and the proxy's exporter (host:port)."""

    path: str
    replicas: tuple[tuple[str, str], ...]
    """(replica name, its observer's host:port), in the file's order."""
    proxy: str
    name: str = ""
    """The file's `fleet` label."""
    balance: str = ""
    """The proxy's balance algorithm, from its group's `balance` label ("" where the file does not say)."""
    serving: tuple[tuple[str, str], ...] = ()
    """(replica name, host:port where it serves infer requests), for the replicas whose group says it."""

    def as_dict(self) -> dict:
        """What the run records of the fleet."""
        return {
            "targets": self.path,
            "name": self.name,
            "balance": self.balance or None,
            "replicas": dict(self.replicas),
            "proxy": self.proxy,
        }


def read_targets(path: str | Path) -> FleetTargets:
    """The fleet of a file_sd targets file; one UserError line when the file is missing, not JSON, or names no
    replica or no proxy."""
    where = f"--fleet {path}"
    try:
        groups = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"{where}: no such file (the targets `latlab fleet --targets FILE` writes)") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"{where}: not a file_sd JSON targets file ({exc})") from None
    if not isinstance(groups, list) or not all(_is_group(g) for g in groups):
        raise UserError(f"{where}: not a file_sd JSON targets file (a list of {{targets, labels}} groups)")
    groups = [{"targets": g["targets"], "labels": g.get("labels", {})} for g in groups]
    replicas = tuple(
        (g["labels"]["replica"], g["targets"][0]) for g in groups if "replica" in g["labels"] and g["targets"]
    )
    proxies = [g for g in groups if g["labels"].get("job") == PROXY_JOB and g["targets"]]
    if not replicas or not proxies:
        raise UserError(f"{where}: names {len(replicas)} replicas and {len(proxies)} proxies; a fleet needs both")
    labels = proxies[0]["labels"]
    serving = tuple(
        (g["labels"]["replica"], str(g["labels"][SERVING_LABEL]))
        for g in groups
        if "replica" in g["labels"] and SERVING_LABEL in g["labels"]
    )
    return FleetTargets(
        path=str(path),
        replicas=replicas,
        proxy=proxies[0]["targets"][0],
        name=str(labels.get("fleet", "")),
        balance=str(labels.get("balance", "")),
        serving=serving,
    )


def _is_group(group: object) -> bool:
    return (
        isinstance(group, dict)
        and isinstance(group.get("targets"), list)
        and all(isinstance(t, str) for t in group["targets"])
        and isinstance(group.get("labels", {}), dict)
    )


def replica_requests(metrics_text: str, deployment: str) -> float:
    """Infer requests of `deployment` a replica has answered so far, every outcome."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        sample.value
        for family in text_string_to_metric_families(metrics_text)
        for sample in family.samples
        if sample.name == REPLICA_REQUESTS and sample.labels.get("deployment") == deployment
    )


def proxy_counters(metrics_text: str) -> dict[str, float]:
    """The proxy's counters so far (PROXY_COUNTERS) and its queue now (`queue`)."""
    from prometheus_client.parser import text_string_to_metric_families

    found = {key: 0.0 for key in PROXY_COUNTERS}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == PROXY_QUEUE and labels.get("proxy") == BACKEND:
                found["queue"] = sample.value
            for key, (name, proxy, code) in PROXY_COUNTERS.items():
                if sample.name == name and labels.get("proxy") == proxy and code in (None, labels.get("code")):
                    found[key] += sample.value
    return found


@dataclass(frozen=True)
class Reading:
    """Every replica's answered requests and the proxy's counters at one moment; None where a page was not read."""

    replicas: dict[str, float | None]
    proxy: dict[str, float] | None


def read_fleet(targets: FleetTargets, deployment: str, timeout_s: float = 2.0) -> Reading:
    """One reading of every replica's /metrics and the proxy's; a page that cannot be read is None (a replica
    restarting), never an exception: the step goes on without it."""
    import requests

    def page(target: str) -> str | None:
        try:
            response = requests.get(f"http://{target}/metrics", timeout=timeout_s)
            response.raise_for_status()
        except requests.RequestException:
            return None
        return response.text

    def parsed(text: str | None, parse: Callable[[str], T]) -> T | None:
        try:
            return parse(text) if text is not None else None
        except ValueError:  # not Prometheus text: a page of something else at that address
            return None

    replicas = {
        name: parsed(page(target), lambda t: replica_requests(t, deployment)) for name, target in targets.replicas
    }
    return Reading(replicas, parsed(page(targets.proxy), proxy_counters))


def fleet_step(before: Reading, after: Reading) -> dict:
    """A step's fleet figures between two readings: requests per replica (None where either reading missed it, or
    its counter went back: a restarted replica), the imbalance (the busiest replica's requests over the mean of
    those counted; 1 is even, None without requests) and the proxy's counters over the step (its queue at the
    end)."""
    replicas: dict[str, float | None] = {}
    for name, end in after.replicas.items():
        start = before.replicas.get(name)
        replicas[name] = end - start if start is not None and end is not None and end >= start else None
    counted = [n for n in replicas.values() if n is not None]
    mean = sum(counted) / len(counted) if counted else 0.0
    proxy = None
    if before.proxy is not None and after.proxy is not None:
        proxy = {key: after.proxy[key] - before.proxy[key] for key in PROXY_COUNTERS}
        proxy["queue_at_end"] = after.proxy.get("queue")
    return {"replicas": replicas, "imbalance": max(counted) / mean if mean > 0 else None, "proxy": proxy}
