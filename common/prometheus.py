"""A real Prometheus server for a run: its config, its process, and queries against its HTTP API."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import requests

from latlab.common import procs

NOT_FOUND = (
    "Prometheus not found: install Debian's `prometheus` package (apt-get install prometheus); continuing without it"
)
RETENTION = "30d"  # long enough to compare this month's runs; a lab run writes a few MB


class PrometheusNotFound(FileNotFoundError):
    """No `prometheus` binary on PATH; the lab runs without it."""

    def __init__(self) -> None:
        super().__init__(NOT_FOUND)


class PrometheusQueryError(RuntimeError):
    """Prometheus answered a query with an error (bad PromQL, too many samples, ...)."""


def find_binary() -> str | None:
    """The `prometheus` on PATH (Debian installs /usr/bin/prometheus), or None."""
    return shutil.which("prometheus")


def base_url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def write_config(
    path: Path, jobs: dict[str, list[str]], interval_s: float = 1.0, rule_files: list[Path] | None = None
) -> Path:
    """Write a prometheus.yml with one static scrape job per key of `jobs` (targets "host:port").

    The timeout equals the interval: Prometheus refuses a timeout longer than the interval, and its
    10 s default is longer than the 1 s we scrape at. rule_files (e.g. grafana/rules/*.yml, globs
    allowed) are loaded as given; relative paths resolve against the config file's folder."""
    interval = _duration(interval_s)
    rules = json.dumps([str(rule_file) for rule_file in rule_files or []])
    lines = [
        "# Written by latlab for one run.",
        "global:",
        f"  scrape_interval: {interval}",
        f"  scrape_timeout: {interval}",
        f"  evaluation_interval: {interval}",
        f"rule_files: {rules}",
        "scrape_configs:" + ("" if jobs else " []"),
    ]
    for job, targets in jobs.items():
        lines += [
            f"  - job_name: {json.dumps(job)}",  # a JSON string is a valid YAML double-quoted scalar
            "    static_configs:",
            f"      - targets: {json.dumps([_check_target(t) for t in targets])}",
        ]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _duration(seconds: float) -> str:
    """Prometheus durations take whole units: 1s, 500ms."""
    ms = round(seconds * 1000)
    if ms <= 0:
        raise ValueError(f"scrape interval must be at least 1 ms, got {seconds!r} s")
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _check_target(target: str) -> str:
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"scrape target must be host:port, got {target!r}")
    return target


def start(config: Path, data_dir: Path, port: int, log_path: Path, binary: str | None = None) -> subprocess.Popen:
    """Start Prometheus on 127.0.0.1:port storing into data_dir; raise PrometheusNotFound without a binary.

    --web.enable-lifecycle lets a caller reload the config (POST /-/reload) when it adds targets."""
    binary = binary or find_binary()
    if binary is None:
        raise PrometheusNotFound()
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    return procs.start(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={data_dir}",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--storage.tsdb.retention.time={RETENTION}",
            "--web.enable-lifecycle",
        ],
        log_path,
    )


def wait_ready(url: str, process: subprocess.Popen, timeout_s: float = 60.0, log_path: Path | None = None) -> None:
    """Wait for /-/ready (the TSDB is open and scraping has begun); fail with its log if it exits."""
    procs.wait_ready(f"{url.rstrip('/')}/-/ready", process, timeout_s, log_path)


def query(url: str, promql: str, at: float | None = None, timeout_s: float = 30.0) -> list[dict]:
    """Evaluate an instant query (at unix time `at`, or now): the result's list of {"metric", "value"}.

    A scalar or string result comes back as one element with empty labels."""
    params = {"query": promql}
    if at is not None:
        params["time"] = f"{at:.3f}"
    response = requests.get(f"{url.rstrip('/')}/api/v1/query", params=params, timeout=timeout_s)
    try:
        body = response.json()
    except ValueError:
        raise PrometheusQueryError(
            f"Prometheus at {url} answered {promql!r} with HTTP {response.status_code} "
            f"and no JSON: {response.text[:200]!r}"
        ) from None
    if body.get("status") != "success":
        raise PrometheusQueryError(
            f"Prometheus at {url} refused {promql!r}: "
            f"{body.get('errorType', '?')}: {body.get('error', response.text[:200])}"
        )
    data = body["data"]
    if data["resultType"] in ("scalar", "string"):
        return [{"metric": {}, "value": data["result"]}]
    return data["result"]


def sample_value(sample: dict) -> float:
    """The float of one instant-vector element (Prometheus sends values as strings, NaN as "NaN")."""
    return float(sample["value"][1])


def wait_for_series(url: str, promql: str, timeout_s: float = 30.0, poll_s: float = 0.25) -> list[dict]:
    """Poll until the query returns something (e.g. the first scrape landed); return that result."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = query(url, promql)
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"Prometheus at {url} still has nothing for {promql!r} after {timeout_s:g} s")
        time.sleep(poll_s)
