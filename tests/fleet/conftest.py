"""Real fleets for the tests: replicas of the tiny model behind a real HAProxy on free loopback ports, always
stopped again; a small client and readers of the replicas' and the proxy's metrics."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable, Iterator

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from latlab.common import procs
from latlab.fleet.build import build_fleet
from latlab.fleet.run import Fleet
from latlab.lab.plan import available_cores
from latlab.server.config import save_config

BODY = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}]}
CLIENT_TIMEOUT_S = 30.0
"""A safety bound: a request that has no answer by then fails the test as hung."""


@pytest.fixture
def start_fleet(tmp_path: Path, tiny_model: Path) -> Iterator[Callable[..., Fleet]]:
    """start_fleet(**build_fleet options) -> a started Fleet of the tiny model (2 replicas by default); every
    fleet started is stopped at the end, whatever the test did. The fleet's lines are in fleet.lines."""
    config = save_config({"deployments": [{"name": "tiny", "model_path": tiny_model}]}, tmp_path / "server.toml")
    fleets: list[Fleet] = []

    def start(**options: object) -> Fleet:
        lines: list[str] = []
        folder = tmp_path / f"fleet-{len(fleets)}"
        fleet = build_fleet(
            config,
            folder,
            available_cores(),
            port=procs.free_port(),
            stats_port=procs.free_port(),
            say=lines.append,
            **options,
        )
        fleet.lines = lines  # type: ignore[attr-defined]
        fleets.append(fleet)
        fleet.start()
        return fleet

    try:
        yield start
    finally:
        for fleet in fleets:
            fleet.stop()


def infer(session: requests.Session, fleet: Fleet) -> requests.Response:
    return session.post(f"http://127.0.0.1:{fleet.spec.port}/v2/models/tiny/infer", json=BODY, timeout=CLIENT_TIMEOUT_S)


def scrape(port: int) -> dict[str, float]:
    """A /metrics page as {sample name{labels}: value}."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=CLIENT_TIMEOUT_S).text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples


def served(fleet: Fleet) -> dict[str, float]:
    """Infer requests each replica's own metrics say it answered (its current process's)."""
    return {
        r.name: sum(v for k, v in scrape(r.metrics_port).items() if k.startswith("latlab_server_requests_total{"))
        for r in fleet.spec.replicas
    }


def proxy_responses(fleet: Fleet, code: str) -> float:
    """Responses of class `code` ("2xx", "5xx", ...) the proxy's exporter counts at its client frontend."""
    samples = scrape(fleet.spec.stats_port)
    return sum(
        v
        for k, v in samples.items()
        if k.startswith("haproxy_frontend_http_responses_total{") and f"code={code}" in k and "proxy=fleet" in k
    )


class Load:
    """`threads` clients, each with its own keep-alive session, sending up to `count` requests each (`pause_s`
    apart) until stopped; every answer's status is kept, and any exception (a hang past the timeout, a reset)
    too."""

    def __init__(self, fleet: Fleet, threads: int = 3, count: int = 400, pause_s: float = 0.0) -> None:
        self.fleet, self.count, self.pause_s = fleet, count, pause_s
        self.statuses: list[int] = []
        self.failures: list[BaseException] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(threads)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(CLIENT_TIMEOUT_S * 2)

    def sent(self) -> int:
        with self._lock:
            return len(self.statuses) + len(self.failures)

    def _client(self) -> None:
        with requests.Session() as session:
            for _ in range(self.count):
                if self._stop.wait(self.pause_s) if self.pause_s else self._stop.is_set():
                    return
                try:
                    status = infer(session, self.fleet).status_code
                except requests.RequestException as exc:
                    with self._lock:
                        self.failures.append(exc)
                    continue
                with self._lock:
                    self.statuses.append(status)
