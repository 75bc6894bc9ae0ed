"""The fleet's targets file, read by a real Prometheus running the shipped grafana/prometheus.yml: every replica
and the proxy's exporter are scraped, labelled by replica and job, and every query of the fleet dashboard
(grafana/fleet/fleet.json) has data. Fails, not skips, without Debian's prometheus."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import requests

from latlab.common import procs
from latlab.fleet.run import READY_TIMEOUT_S
from latlab.fleet.dashboard import dashboard_text
from latlab.fleet.targets import PROXY_JOB, TARGETS_FILE, watch_queries
from tests.fleet.conftest import CLIENT_TIMEOUT_S, Load, infer
from tests.grafana import shipped

DASHBOARD = shipped.GRAFANA / "fleet" / "fleet.json"


def query(port: int, expression: str) -> list[dict]:
    answer = requests.get(
        f"http://127.0.0.1:{port}/api/v1/query", params={"query": expression}, timeout=CLIENT_TIMEOUT_S
    ).json()
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def dashboard_queries() -> list[tuple[str, str]]:
    """Every query of the shipped fleet dashboard, as Grafana sends it with every fleet picked (a wider window
    than $__rate_interval, so that a short test has two scrapes in it)."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"].replace("$fleet", ".*").replace("$__rate_interval", "1m"))
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]


def test_the_shipped_fleet_dashboard_is_the_one_its_writer_makes():
    assert DASHBOARD.read_text() == dashboard_text(), "python -m latlab.fleet.dashboard > grafana/fleet/fleet.json"
    queries = watch_queries(fleet="$fleet", window="$__rate_interval")
    assert sorted(expr for _, expr in dashboard_queries()) == sorted(
        q.replace("$fleet", ".*").replace("$__rate_interval", "1m") for q in queries.values()
    )


def wait_for_data(port: int, name: str, expression: str, deadline: float) -> None:
    """Until the query returns a finite value (rates need two scrapes); the deadline is a safety bound."""
    while not [s for s in query(port, expression) if s["value"][1] not in ("NaN", "+Inf", "-Inf")]:
        assert time.monotonic() < deadline, f"{name}: no data from {expression}"
        time.sleep(0.5)


def test_prometheus_scrapes_every_replica_and_the_proxy_from_the_fleet_targets(start_fleet, tmp_path: Path):
    binary = shutil.which("prometheus")
    assert binary, "prometheus not found: install Debian's `prometheus` package (apt-get install prometheus)"
    fleet = start_fleet()
    with requests.Session() as session:
        assert all(infer(session, fleet).status_code == 200 for _ in range(10))
    folder = tmp_path / "prometheus"
    shutil.copytree(shipped.GRAFANA, folder, ignore=shutil.ignore_patterns("targets", "dashboards", "provisioning"))
    (folder / "targets").mkdir()
    shutil.copy(fleet.targets, folder / "targets" / TARGETS_FILE)  # the fleet's file, and no other server
    port = procs.free_port()
    command = [binary, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}"]
    server = procs.start([*command, f"--web.listen-address=127.0.0.1:{port}"], log_path=folder / "log")
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S  # a safety bound on the first scrapes, not a speed claim
        up: list[dict] = []
        while len([s for s in up if s["value"][1] == "1"]) < 3:
            assert time.monotonic() < deadline, f"never all up: {up}\n{(folder / 'log').read_text()[-2000:]}"
            time.sleep(0.5)
            try:
                up = query(port, "up")
            except requests.ConnectionError:  # Prometheus not listening yet
                up = []
        labels = sorted((s["metric"]["job"], s["metric"].get("replica", "")) for s in up)
        assert labels == sorted([("latlab-server", "r0"), ("latlab-server", "r1"), (PROXY_JOB, "")])
        served = query(port, "sum by (replica) (latlab_server_requests_total)")
        assert sum(float(s["value"][1]) for s in served) == 10
        assert query(port, f'haproxy_backend_http_requests_total{{job="{PROXY_JOB}",proxy="replicas"}}')
        assert query(port, "count by (fleet) (latlab_server_inflight_requests)")  # the dashboard's variable
        with Load(fleet, threads=1, count=20_000, pause_s=0.01):  # light traffic, so rates and p99 have data
            deadline = time.monotonic() + READY_TIMEOUT_S
            for title, expression in dashboard_queries():
                wait_for_data(port, title, expression, deadline)
    finally:
        procs.stop(server)
