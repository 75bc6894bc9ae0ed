"""`latlab loadtest --fleet` through a real fleet's proxy: every step records the requests each replica answered
(which add up to what the step served, give or take the requests in flight at its edges), their imbalance, the
proxy's counters, and the run the fleet's replicas and balance; a bad targets file is one line before any load."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from latlab.fleet.haproxy import BACKEND, FRONTEND
from latlab.fleet.run import READY_TIMEOUT_S
from latlab.fleet.targets import PROXY_JOB
from latlab.loadtest import fleet as loadtest_fleet
from latlab.loadtest.proxy_hop import PAIRS
from latlab.loadtest.results import read_results

CLI = [sys.executable, "-m", "latlab.cli", "loadtest"]
RATE = 40.0


def test_the_load_tester_reads_the_names_the_fleet_writes():
    assert (loadtest_fleet.PROXY_JOB, loadtest_fleet.FRONTEND, loadtest_fleet.BACKEND) == (PROXY_JOB, FRONTEND, BACKEND)


def test_a_sweep_through_the_proxy_records_every_replica_and_the_proxy(start_fleet, tmp_path: Path):
    fleet = start_fleet(balance="roundrobin")
    out = tmp_path / "run"
    command = [*CLI, "--host", f"http://127.0.0.1:{fleet.spec.port}", "--deployment", "tiny"]
    command += ["--fleet", str(fleet.targets), "--rates", f"{RATE:g}", "--warmup-seconds", "1"]
    command += ["--step-seconds", "3", "--max-windows", "3", "--calibrate-seconds", "0", "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=READY_TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "imbalance" in result.stdout
    (run,) = read_results(out / "results.json")
    assert run.fleet["balance"] == "roundrobin"
    assert run.fleet["replicas"] == {r.name: f"127.0.0.1:{r.metrics_port}" for r in fleet.spec.replicas}
    (step,) = run.deployments[0].steps
    counts = step.fleet["replicas"]
    assert set(counts) == {"r0", "r1"} and all(n > 0 for n in counts.values()), counts
    # read from the replicas as the step's windows begin and end: what the windows served, but for the requests
    # in flight at either edge (sent in the warm-up, or answered after the last window closed)
    served = sum(window["ok"] for window in step.timeline)
    spill = RATE * 1.0  # a warm-up's worth of requests
    assert abs(sum(counts.values()) - served) <= spill, (counts, served)
    assert step.fleet["imbalance"] == max(counts.values()) / (sum(counts.values()) / 2)
    assert step.fleet["imbalance"] < 1.5  # round robin alternates every request between the two
    proxy = step.fleet["proxy"]
    # the proxy passed each on: its count and theirs agree but for the requests sent while the pages were read
    assert abs(proxy["requests"] - sum(counts.values())) <= spill, (proxy, counts)
    assert proxy["5xx"] == 0 and proxy["retries"] == 0
    added = run.deployments[0].proxy_added
    assert added["replica"] == "r0" and added["pairs"] == PAIRS
    assert added["proxy"]["errors"] == 0 and added["direct"]["errors"] == 0
    for q in ("p50", "p99"):
        assert added[f"added_{q}_s"] == added["proxy"][f"{q}_s"] - added["direct"][f"{q}_s"]
    # one more hop through another process: a lone request's median is slower through it than straight to r0
    assert added["added_p50_s"] > 0, added
    assert "the proxy added p50 +" in result.stdout


def test_a_missing_targets_file_is_one_line_before_any_load(tmp_path: Path):
    missing = tmp_path / "servers-fleet.json"
    command = [*CLI, "--host", "http://127.0.0.1:9", "--deployment", "tiny", "--fleet", str(missing)]
    result = subprocess.run([*command, "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    said = (result.stdout + result.stderr).strip().splitlines()
    assert len(said) == 1 and str(missing) in said[0] and "no such file" in said[0], said
    assert not (tmp_path / "run").exists()
