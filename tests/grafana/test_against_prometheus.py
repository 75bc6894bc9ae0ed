"""Every dashboard target, recording rule and alert of grafana/, evaluated by a real Prometheus.

One module-scoped lab: the real server (three tiny deployments), Debian's `prometheus` running the
shipped prometheus.yml and rules unchanged (only the file_sd target files point at this test's ports),
and a real, short `latlab loadtest` exporting its metrics. Fails, not skips, without `prometheus`.

"Returns data" means what a Grafana user would see: a time-series target is a range query over the
test's window (/api/v1/query_range, as Grafana draws it), an instant target (tables, run summaries
over $__range) one query at the window's end; either must parse and give at least one finite value.
Variables take the value Grafana gives them on first load: All (`.*`) where several may be picked,
the first option otherwise; a repeated panel is evaluated once per value of its variable.

Alerts must not fire in a healthy run, so their expressions cannot be asked for data directly. Each
is written `signal <op> bound`: the whole expression must evaluate without error (empty is fine) and
the signal alone must return data, so a misspelt metric cannot hide behind a quiet alert. Prometheus'
own evaluation of every rule must be healthy, and every recorded series must exist.

GPU utilisation, memory and host-device transfer times exist only on a GPU box: where latlab_gpu_devices is 0 those
targets must parse and return nothing (the test says it needs a GPU box); above 0 they must have data.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest
import requests

from latlab.common import procs, prometheus
from tests.conftest import build_tiny_model
from tests.grafana import shipped
from tests.text_models import TOKENIZER, token_model

pytestmark = pytest.mark.e2e
CLI = [sys.executable, "-m", "latlab.cli"]
# Grafana's $__rate_interval is max($__interval + scrape interval, 4 x scrape interval): 8 s at the
# shipped 2 s (the datasource's timeInterval); $__interval never drops below that 2 s either.
GRAFANA_BUILTINS = {"__rate_interval": "8s", "__interval": "2s"}
GPU_ONLY = re.compile(
    r"latlab_gpu_(utilization_ratio|memory_used_bytes|memory_total_bytes)"
    r"|latlab_batcher_(input|output)_transfer_duration"
)
DEPLOYMENTS = ("tiny-cpu", "tiny-b1", "tiny-tight", "tiny-text")
SERVER_CONFIG = """
[server]
port = {port}
metrics_port = {metrics_port}

[[deployments]]
name = "tiny-cpu"
model = "tiny"
model_path = "{model}"
[deployments.batcher]
max_batch_size = 8
max_queue_delay_ms = 2

[[deployments]]
name = "tiny-b1"
model = "tiny"
model_path = "{model}"

# One queue slot and a timeout shorter than the batch delay: a burst is refused (queue_full) and
# expires (timeout), so the rejection panels and the saturation alert's signal have something to show.
[[deployments]]
name = "tiny-tight"
model = "tiny"
model_path = "{model}"
[deployments.batcher]
max_batch_size = 8
max_queue_delay_ms = 300
max_queue_size = 1
timeout_ms = 100

# Sentences in (a toy encoder over all-MiniLM-L6-v2's vocabulary): the tokenization panel has data.
[[deployments]]
name = "tiny-text"
model = "tiny"
model_path = "{text_model}"
[deployments.tokenizer]
file = "{tokenizer}"
max_length = 32
"""
ONE_SAMPLE = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.1, 0.2, 0.3, 0.4]}]}
ONE_SENTENCE = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a short sentence"]}]}


@dataclass
class Lab:
    url: str
    start: float
    end: float
    run_id: str
    server: str
    loadgen: str
    gpu_devices: float
    # {(dashboard, pick_all): (values, options)}, as resolve_variables gives them
    variables: dict[tuple[str, bool], tuple[dict[str, str], dict[str, list[str]]]] = field(default_factory=dict)

    def range(self, expr: str) -> list[dict]:
        return query_range(self.url, expr, self.start, self.end)

    def instant(self, expr: str) -> list[dict]:
        return prometheus.query(self.url, expr, at=self.end)

    def builtins(self) -> dict[str, str]:
        return {**GRAFANA_BUILTINS, "__range": f"{math.ceil(self.end - self.start)}s"}


def query_range(url: str, expr: str, start: float, end: float, step_s: float = 1.0) -> list[dict]:
    """A range query as Grafana sends it; raises PrometheusQueryError when Prometheus refuses it."""
    response = requests.get(
        f"{url}/api/v1/query_range",
        timeout=30,
        params={"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"},
    )
    body = response.json()
    if body.get("status") != "success":
        raise prometheus.PrometheusQueryError(f"{body.get('errorType')}: {body.get('error')} in {expr!r}")
    return body["data"]["result"]


def label_values(lab: Lab, selector: str, label: str) -> list[str]:
    """What Grafana's label_values(selector, label) lists over the dashboard's time range."""
    response = requests.get(
        f"{lab.url}/api/v1/label/{label}/values",
        timeout=30,
        params={"match[]": selector, "start": f"{lab.start:.3f}", "end": f"{lab.end:.3f}"},
    )
    body = response.json()
    assert body["status"] == "success", f"label_values({selector}, {label}): {body}"
    return body["data"]


def finite_values(result: list[dict]) -> list[float]:
    samples = [s for series in result for s in series.get("values", [series.get("value")]) if s]
    return [v for v in (float(s[1]) for s in samples) if math.isfinite(v)]


def resolve_variables(lab: Lab, dashboard: dict, pick_all: bool) -> tuple[dict[str, str], dict[str, list[str]]]:
    """({name: value substituted into queries}, {name: the options Grafana would list}).

    A multi-value variable is either left at All (pick_all: its allValue, `.*`) or set to every option
    picked one by one, which Grafana writes `(a|b|c)`: unlike `.*`, that matches nothing when a query
    misspells the label, since `.*` also matches a label that is not there."""
    values, options = lab.builtins(), {}
    for variable in shipped.variables(dashboard):
        selector, label = shipped.label_values(shipped.substitute(variable["definition"], values))
        found = sorted(label_values(lab, selector, label), reverse=variable["sort"] in (2, 4, 6))
        assert all(re.fullmatch(r"[\w-]+", value) for value in found), found  # no regex escaping needed
        options[variable["name"]] = found
        if not variable["multi"]:
            values[variable["name"]] = (found or [""])[0]
        else:
            values[variable["name"]] = variable["allValue"] if pick_all else f"({'|'.join(found)})"
    return values, options


def shipped_prometheus_config(folder: Path, server: str, loadgen: str) -> Path:
    """The shipped prometheus.yml and rules, copied verbatim; only the target files name this test's ports."""
    folder.mkdir()
    shutil.copy(shipped.GRAFANA / "prometheus.yml", folder)
    shutil.copytree(shipped.GRAFANA / "rules", folder / "rules")
    (folder / "targets").mkdir()
    for name, target in (("servers.json", server), ("loadgen.json", loadgen)):
        (folder / "targets" / name).write_text(f'[{{"targets": ["{target}"], "labels": {{}}}}]\n')
    return folder / "prometheus.yml"


class SideTraffic(threading.Thread):
    """While the load test runs: a few requests to tiny-b1 and, every half second, a concurrent burst
    that tiny-tight's one-slot queue refuses (503) and expires (504). Spread over the run, so the
    rejection counters rise between scrapes and their rates are not just zero."""

    def __init__(self, host: str) -> None:
        super().__init__(daemon=True)
        self.host = host
        self.codes: list[int] = []
        self.stopping = threading.Event()

    def post(self, deployment: str) -> int:
        body = ONE_SENTENCE if deployment == "tiny-text" else ONE_SAMPLE
        return requests.post(f"{self.host}/v2/models/{deployment}/infer", json=body, timeout=10).status_code

    def run(self) -> None:
        with ThreadPoolExecutor(8) as pool:
            while not self.stopping.is_set():
                self.codes += [self.post("tiny-b1") for _ in range(5)]
                self.codes += [self.post("tiny-text") for _ in range(2)]
                self.codes += pool.map(lambda _: self.post("tiny-tight"), range(8))
                self.stopping.wait(0.5)

    def stop(self) -> list[int]:
        self.stopping.set()
        self.join(timeout=30)
        return self.codes


def wait_for_recorded_series(url: str, start: float, timeout_s: float = 30.0) -> None:
    """Rules run every evaluation interval: wait until each recorded series has a finite value."""
    deadline = time.monotonic() + timeout_s
    missing = [rule["record"] for rule in shipped.recording_rules()]
    while missing and time.monotonic() < deadline:
        missing = [name for name in missing if not finite_values(query_range(url, name, start, time.time()))]
        if missing:
            time.sleep(0.5)
    assert not missing, f"recording rules produced nothing for: {missing}"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    assert prometheus.find_binary(), prometheus.NOT_FOUND
    tmp = tmp_path_factory.mktemp("grafana-lab")
    model = build_tiny_model(tmp / "tiny" / "model.onnx")
    server_port, metrics_port, loadgen_port, prom_port = (procs.free_port() for _ in range(4))
    config = tmp / "server.toml"
    config.write_text(
        SERVER_CONFIG.format(
            port=server_port,
            metrics_port=metrics_port,
            model=model,
            tokenizer=TOKENIZER,
            text_model=token_model(tmp / "tiny-text" / "model.onnx"),
        )
    )
    # Prometheus scrapes the observer port, as the shipped targets/servers.json does (port + 1 there)
    server, loadgen = f"127.0.0.1:{metrics_port}", f"127.0.0.1:{loadgen_port}"
    prom_config = shipped_prometheus_config(tmp / "prometheus", server, loadgen)
    started: list[subprocess.Popen] = []
    side: SideTraffic | None = None
    try:
        started.append(procs.start([*CLI, "serve", "--config", str(config)], tmp / "server.log"))
        started.append(prometheus.start(prom_config, tmp / "tsdb", prom_port, tmp / "prometheus.log"))
        host, url = f"http://127.0.0.1:{server_port}", prometheus.base_url(prom_port)
        procs.wait_ready(f"{host}/v2/health/ready", started[0], timeout_s=60, log_path=tmp / "server.log")
        prometheus.wait_ready(url, started[1], log_path=tmp / "prometheus.log")
        prometheus.wait_for_series(url, 'up{job="latlab-server"} == 1')
        start = time.time()
        side = SideTraffic(host)
        side.start()
        run = tmp / "run-grafana"
        result = subprocess.run(
            [
                *CLI,
                "loadtest",
                "--host",
                host,
                "--deployment",
                "tiny-cpu",
                "--rates",
                "50,100",
                "--step-seconds",
                "1.5",
                "--warmup-seconds",
                "0.5",
                "--max-windows",
                "3",
                "--metrics-port",
                str(loadgen_port),
                "--out",
                str(run),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        codes = side.stop()
        assert result.returncode == 0, result.stderr[-3000:]
        assert {200, 503, 504} <= set(codes), f"tiny-tight should refuse (503) and expire (504): {set(codes)}"
        wait_for_recorded_series(url, start)
        devices = prometheus.query(url, "max(latlab_gpu_devices)")
        ready = Lab(
            url, start, time.time(), run.name, server, loadgen, prometheus.sample_value(devices[0]) if devices else 0.0
        )
        ready.variables = {
            (stem, pick_all): resolve_variables(ready, dashboard, pick_all)
            for stem, dashboard in shipped.dashboards().items()
            for pick_all in (True, False)
        }
        yield ready
    finally:
        if side is not None:
            side.stop()
        for process in reversed(started):
            procs.stop(process)


def test_file_sd_found_the_server_and_the_load_generator(lab: Lab):
    active = requests.get(f"{lab.url}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
    assert {(t["labels"]["job"], t["labels"]["instance"]) for t in active} == {
        ("latlab-server", lab.server),
        ("latlab-loadgen", lab.loadgen),
    }
    for job in ("latlab-server", "latlab-loadgen"):  # both really scraped (the generator has exited since)
        assert 1.0 in finite_values(lab.range(f'up{{job="{job}"}}')), job


def test_variables_list_what_the_run_produced(lab: Lab):
    _, serving = lab.variables["serving", True]
    assert serving == {"model": ["tiny"], "provider": ["cpu"], "deployment": sorted(DEPLOYMENTS)}
    values, loadtest = lab.variables["loadtest", True]
    assert loadtest == {"run": [lab.run_id], "deployment": ["tiny-cpu"]} and values["run"] == lab.run_id
    values, cpu_vs_gpu = lab.variables["cpu-vs-gpu", True]
    assert values["model"] == "tiny" and cpu_vs_gpu["provider"] == ["cpu"]


@pytest.mark.parametrize("pick_all", [True, False], ids=["All", "each-picked"])
@pytest.mark.parametrize("target", shipped.targets(), ids=lambda t: t.name)
def test_every_panel_target_returns_data(lab: Lab, target: shipped.Target, pick_all: bool):
    values, options = lab.variables[target.dashboard, pick_all]
    for value in options[target.repeat] if target.repeat else [None]:
        expr = shipped.substitute(target.expr, values if value is None else {**values, target.repeat: value})
        result = lab.instant(expr) if target.instant else lab.range(expr)  # raises if it does not parse
        if GPU_ONLY.search(expr) and lab.gpu_devices == 0:
            assert result == [], f"{target.name}: GPU series without a GPU: {result[:2]}"
            print(
                f"{target.name} ({target.panel_title}): parses; no GPU here (latlab_gpu_devices = 0), "
                "so no data: needs a GPU box to check its data"
            )
            continue
        assert finite_values(result), f"{target.name} ({target.panel_title!r}) returned no data for {expr}"


@pytest.mark.parametrize("rule", shipped.recording_rules(), ids=lambda r: r["record"])
def test_every_recording_rule_returns_and_records_data(lab: Lab, rule: dict):
    assert finite_values(lab.range(rule["expr"])), rule["expr"]
    assert finite_values(lab.range(rule["record"])), f"nothing recorded as {rule['record']}"


@pytest.mark.parametrize("rule", shipped.alert_rules(), ids=lambda r: r["alert"])
def test_every_alert_evaluates_and_its_signal_returns_data(lab: Lab, rule: dict):
    lab.range(rule["expr"])  # the whole expression parses and evaluates; empty while below the bound
    signal = shipped.alert_signal(rule["expr"])
    assert finite_values(lab.range(signal)), f"{rule['alert']}: its signal {signal} returned no data"


def test_prometheus_runs_every_shipped_rule_healthily(lab: Lab):
    groups = requests.get(f"{lab.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
    loaded = {rule["name"]: rule for group in groups for rule in group["rules"]}
    shipped_names = {r["record"] for r in shipped.recording_rules()} | {r["alert"] for r in shipped.alert_rules()}
    assert set(loaded) == shipped_names
    unhealthy = {name: rule.get("lastError") for name, rule in loaded.items() if rule["health"] != "ok"}
    assert not unhealthy


def panel_target(dashboard: str, title: str, ref_id: str = "A") -> shipped.Target:
    (target,) = [
        t for t in shipped.targets() if t.dashboard == dashboard and t.panel_title == title and t.ref_id == ref_id
    ]
    return target


def test_rejection_panel_shows_the_refusals_as_they_happen(lab: Lab):
    """Not only some data: the rate of each reason rises above zero while tiny-tight refuses requests."""
    values, _ = lab.variables["serving", False]
    result = lab.range(shipped.substitute(panel_target("serving", "Rejections by reason").expr, values))
    peaks = {series["metric"]["reason"]: max(finite_values([series])) for series in result}
    assert set(peaks) == {"queue_full", "timeout"} and min(peaks.values()) > 0, peaks


def test_step_table_lists_the_rates_the_sweep_asked_for(lab: Lab):
    values, _ = lab.variables["loadtest", False]
    target = panel_target("loadtest", "Steps: client p50 / p99 vs offered and achieved rate")
    rows = lab.instant(shipped.substitute(target.expr, values))
    assert {row["metric"]["step"]: prometheus.sample_value(row) for row in rows} == {"0": 50.0, "1": 100.0}
