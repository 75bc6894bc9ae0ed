"""latlab.common.prometheus and latlab.loadtest.from_prometheus: a real exporter, a real Prometheus, curves read back.

Needs Debian's `prometheus` package (the Makefile installs it); these tests fail, not skip, without it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from latlab.common import procs, prometheus
from latlab.loadtest.from_prometheus import curves_from_prometheus
from latlab.loadtest.results import SCHEMA, read_results, write_results

RUN = "t1"
DEPLOYMENTS = ("mlp-b1", "mlp-batch")  # swept in this order
MEDIANS_S = (0.0008, 0.003, 0.02)  # one per step: latency grows with load
SAMPLES = 2000

EXPORTER = textwrap.dedent("""
    # Records known steps as the sweep would, then serves them until stopped.
    import json
    import sys
    import time

    from prometheus_client import CollectorRegistry

    from latlab.loadtest.loadgen_metrics import LoadGenMetrics, start_exporter
    from latlab.loadtest.results import Step

    port, known = int(sys.argv[1]), json.loads(open(sys.argv[2]).read())
    registry = CollectorRegistry()
    metrics = LoadGenMetrics(registry, known["run"])
    start_exporter(metrics, port)
    time.sleep(5)  # Prometheus starts after this exporter: let it begin scraping, as it would in a lab
    # As in a sweep, older steps leave the exposition while new ones arrive: record one step a
    # second-and-a-half so Prometheus (scraping each second) sees every step before it goes.
    for deployment, steps in known["deployments"].items():
        for index, step in enumerate(steps):
            metrics.set_load(deployment, index, step["stats"]["target_rps"], users=1)
            metrics.observe(deployment, step["latencies"], [True] * len(step["latencies"]))
            stats = Step(**step["stats"])
            metrics.record_step(deployment, index, step["latencies"], stats, ended_at=step["ended_at"])
            time.sleep(1.5)
    while True:
        time.sleep(1)
""")


def known_run() -> dict:
    """Three steps per deployment: 2000 lognormal latencies each and the statistics sweep.py would write (a Step's
    fields, as JSON for the exporter's process)."""
    rng = np.random.default_rng(2024)
    now = time.time()
    deployments = {}
    for d, name in enumerate(DEPLOYMENTS):
        steps = []
        for i, median in enumerate(MEDIANS_S):
            latencies = rng.lognormal(np.log(median), 0.7, SAMPLES)
            p50, p90, p99 = np.percentile(latencies, [50, 90, 99], method="inverted_cdf")
            target = 250.0 * (i + 1)
            stats = {
                "target": target,
                "target_rps": target,
                "offered_rps": target * 0.99731 + d,
                "achieved_rps": target * 0.98113,
                "errors": i + d,
                "p50_s": float(p50),
                "p90_s": float(p90),
                "p99_s": float(p99),
                "max_s": float(latencies.max()),
                "generator_bound": i == 2,
                "stable": i < 2,
            }
            steps.append({"latencies": latencies.tolist(), "stats": stats, "ended_at": now - 60 + 20 * d + 5 * i})
        deployments[name] = steps
    return {"run": RUN, "deployments": deployments}


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict]]:
    """(Prometheus URL, known run): an exporter process with the known steps, scraped each second."""
    assert prometheus.find_binary(), prometheus.NOT_FOUND
    tmp = tmp_path_factory.mktemp("prometheus")
    known = known_run()
    (tmp / "known.json").write_text(json.dumps(known))
    (tmp / "exporter.py").write_text(EXPORTER)
    exporter_port, prom_port = procs.free_port(), procs.free_port()
    exporter = procs.start(
        [sys.executable, str(tmp / "exporter.py"), str(exporter_port), str(tmp / "known.json")],
        log_path=tmp / "exporter.log",
    )
    server = None
    try:
        procs.wait_ready(f"http://127.0.0.1:{exporter_port}/metrics", exporter, 60, tmp / "exporter.log")
        config = prometheus.write_config(tmp / "prometheus.yml", {"loadgen": [f"127.0.0.1:{exporter_port}"]})
        server = prometheus.start(config, tmp / "data", prom_port, tmp / "prometheus.log")
        url = prometheus.base_url(prom_port)
        prometheus.wait_ready(url, server, 60, tmp / "prometheus.log")
        prometheus.wait_for_series(
            url, f'count(last_over_time(latlab_loadtest_step_end_timestamp_seconds{{run="{RUN}"}}[5m])) == 6', 40
        )
        time.sleep(1.5)  # the last step's histogram scraped too
        yield url, known
    finally:
        if server is not None:
            procs.stop(server)
        procs.stop(exporter)


def test_curves_rebuilt_from_prometheus_match_the_recorded_steps(lab) -> None:
    url, known = lab
    run = curves_from_prometheus(url, RUN)
    assert [d.name for d in run.deployments] == list(DEPLOYMENTS)
    for curve in run.deployments:
        assert curve.stop_reason == "rebuilt from Prometheus"
        recorded = known["deployments"][curve.name]
        assert len(curve.steps) == len(recorded)
        for rebuilt, step in zip(curve.steps, recorded):
            stats, latencies = step["stats"], np.asarray(step["latencies"])
            for key in ("target", "target_rps", "offered_rps", "achieved_rps", "errors", "generator_bound", "stable"):
                assert getattr(rebuilt, key) == stats[key], key
            assert rebuilt.sent == SAMPLES
            assert rebuilt.mean_s == pytest.approx(latencies.mean(), rel=1e-12)
            for key, q in (("p50_s", 50), ("p90_s", 90), ("p99_s", 99)):
                exact = np.percentile(latencies, q, method="inverted_cdf")
                value = getattr(rebuilt, key)
                assert abs(value - exact) / exact < 0.05, (curve.name, key, value, exact)


def test_rebuilt_document_is_a_valid_results_file(lab, tmp_path: Path) -> None:
    url, _ = lab
    run = curves_from_prometheus(url, RUN)
    sweep_keys = {
        "target_rps",
        "offered_rps",
        "achieved_rps",
        "sent",
        "ok",
        "errors",
        "dropped",
        "late",
        "incomplete",
        "p50_s",
        "p90_s",
        "p99_s",
        "max_s",
        "mean_s",
        "duration_s",
        "avg_batch_size",
        "generator_cpu_percent",
        "generator_bound",
    }
    write_results(tmp_path / "results.json", run)
    raw = json.loads((tmp_path / "results.json").read_text())  # the file itself: every figure a sweep writes
    assert raw["schema"] == SCHEMA
    assert all(sweep_keys <= set(step) for curve in raw["deployments"] for step in curve["steps"])
    (back,) = read_results(tmp_path)
    assert back == run and back.run_id == RUN
    assert set(back.machine) >= {"hostname", "cpu", "cores", "memory_gib"}


def test_live_series_reach_prometheus(lab) -> None:
    url, _ = lab
    ok = prometheus.query(url, f'sum(latlab_loadtest_requests_total{{run="{RUN}",outcome="ok"}})')
    assert prometheus.sample_value(ok[0]) == len(DEPLOYMENTS) * len(MEDIANS_S) * SAMPLES
    step = prometheus.query(url, f'latlab_loadtest_step{{run="{RUN}",deployment="mlp-batch"}}')
    assert prometheus.sample_value(step[0]) == 2


def test_an_unknown_run_is_a_clear_error(lab) -> None:
    url, _ = lab
    with pytest.raises(LookupError, match="no steps of run 'nope'"):
        curves_from_prometheus(url, "nope")


def test_a_bad_query_raises_with_prometheus_reason(lab) -> None:
    url, _ = lab
    with pytest.raises(prometheus.PrometheusQueryError, match="bad_data"):
        prometheus.query(url, "sum(")


def test_wait_for_series_times_out_naming_the_query(lab) -> None:
    url, _ = lab
    with pytest.raises(TimeoutError, match="latlab_no_such_metric"):
        prometheus.wait_for_series(url, "latlab_no_such_metric", timeout_s=0.3, poll_s=0.1)


# --- config and binary, no server needed ----------------------------------------------------------------


def test_written_config_passes_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: it comes with Debian's `prometheus` package"
    config = prometheus.write_config(
        tmp_path / "prometheus.yml",
        {"loadgen": ["127.0.0.1:9101"], "server": ["127.0.0.1:8000", "127.0.0.1:8001"]},
        interval_s=0.5,
    )
    result = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "scrape_interval: 500ms" in config.read_text()


def test_write_config_refuses_targets_without_a_port(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="host:port"):
        prometheus.write_config(tmp_path / "p.yml", {"loadgen": ["127.0.0.1"]})


def test_missing_binary_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert prometheus.find_binary() is None
    with pytest.raises(prometheus.PrometheusNotFound, match=r"apt-get install prometheus\); continuing without it"):
        prometheus.start(tmp_path / "p.yml", tmp_path / "data", procs.free_port(), tmp_path / "p.log")
