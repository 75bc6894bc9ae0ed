"""The load generator against servers whose truth is known: a stalling one, one of fixed capacity."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from latlab.loadtest.results import Run, read_results
from tests.loadtest.stub_server import StubModel, stub_server

pytestmark = pytest.mark.e2e
CLI = [sys.executable, "-m", "latlab.cli"]


def loadtest_said(host: str, out: Path, *args: str, env: dict | None = None, timeout: float = 180) -> tuple[Run, str]:
    """`latlab loadtest` of deployment "m": the run it wrote and what it printed."""
    result = subprocess.run(
        [*CLI, "loadtest", "--host", host, "--deployment", "m", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    (run,) = read_results(out / "results.json")
    return run, result.stdout


def loadtest(host: str, out: Path, *args: str, env: dict | None = None, timeout: float = 180) -> Run:
    return loadtest_said(host, out, *args, env=env, timeout=timeout)[0]


def test_open_loop_shows_a_stall_that_closed_loop_hides(tmp_path):
    """Coordinated omission: a 1 s stall every 3 s is in the open-loop p99, not in the closed-loop one."""
    stall_s = 1.0
    with stub_server(StubModel(stall_every=3.0, stall_for=stall_s)) as host:
        window = ["--warmup-seconds", "0.5", "--step-seconds", "4.5", "--max-windows", "3"]
        opened = loadtest(host, tmp_path / "open", "--mode", "open", "--rates", "40", *window)
        closed = loadtest(host, tmp_path / "closed", "--mode", "closed", "--users", "1", *window)
    (open_step,) = opened.deployments[0].steps
    (closed_step,) = closed.deployments[0].steps
    assert open_step.p99_s >= stall_s / 2, open_step  # requests queued behind the stall count their wait
    assert closed_step.max_s >= 0.3 * stall_s, "the closed-loop user did hit a stall"
    assert closed_step.p99_s < open_step.p99_s / 5, (closed_step.p99_s, open_step.p99_s)
    assert closed_step.users == 1 and closed.mode == "closed"
    # the native closed loop (loadtest/native_loop.py) drives the user's connection wherever cc can build it
    assert closed.payload["closed_sender"] == ("native" if shutil.which("cc") else "python")


def test_slo_search_finds_a_known_capacity(tmp_path):
    capacity = 300.0
    with stub_server(StubModel(capacity=capacity)) as host:
        doc, said = loadtest_said(
            host,
            tmp_path / "search",
            "--slo",
            "p99=500ms",
            "--rates",
            "40",
            "--resolution",
            "0.05",
            "--warmup-seconds",
            "0.5",
            "--step-seconds",
            "3",
            "--max-windows",
            "3",
            timeout=300,
        )
    search = doc.deployments[0].search
    assert search["rate"] is not None
    assert abs(search["rate"] - capacity) <= 0.1 * capacity, search
    assert "SLO p99 ≤ 500 ms" in said
    assert search["probes"] and doc.deployments[0].steps


def test_raising_past_the_listed_rates_finds_a_known_capacity(tmp_path):
    """Past --rates the sweep raises x1.5 until saturation, then narrows the bracket: the highest rate it
    sustained is within 10% of the stub's capacity, and the curve says it saw saturation."""
    capacity = 200.0
    with stub_server(StubModel(capacity=capacity)) as host:
        doc = loadtest(
            host,
            tmp_path / "raise",
            "--rates",
            "60",
            "--max-rate",
            "3000",
            "--warmup-seconds",
            "0.5",
            "--step-seconds",
            "3",
            "--max-windows",
            "3",
            timeout=300,
        )
    curve = doc.deployments[0]
    assert curve.saturated is True and curve.rate_cap_rps == 3000, curve.stop_reason
    # the highest throughput of a step that kept up (the report's max rate is achieved, not offered)
    sustained = [s.achieved_rps for s in curve.steps if s.achieved_rps >= 0.9 * s.offered_rps]
    assert abs(max(sustained) - capacity) <= 0.1 * capacity, [(s.target, s.achieved_rps) for s in curve.steps]
    assert [s.target for s in curve.steps] == sorted(s.target for s in curve.steps)


def test_a_cap_below_capacity_is_marked_not_saturated_and_short_steps_do_not_lie(tmp_path):
    """A sweep that never saturates says so (the report then shows '≥ N'); short steps count requests by
    their intended send time (achieved never above offered, offered within Poisson noise of the target) and
    a low rate's windows grow until the step holds enough requests for a p99."""
    with stub_server(StubModel()) as host:
        doc = loadtest(
            host,
            tmp_path / "capped",
            "--rates",
            "20,200",
            "--max-rate",
            "300",
            "--warmup-seconds",
            "0.3",
            "--step-seconds",
            "1.5",
            "--max-windows",
            "3",
            "--machine-name",
            "stub-box",
            timeout=300,
        )
    assert doc.machine["name"] == "stub-box"  # what reports call this machine
    curve = doc.deployments[0]
    assert curve.saturated is False and "not saturated" in curve.stop_reason and curve.rate_cap_rps == 300
    assert [s.target for s in curve.steps] == [20, 200, 300]
    for step in curve.steps:
        noise = 4 * (step.target * step.duration_s) ** 0.5 / step.duration_s
        assert abs(step.offered_rps - step.target) <= noise, step
        assert 0.9 * step.offered_rps <= step.achieved_rps <= step.offered_rps, step
        assert step.samples >= 100 and not step.too_few_samples, step
        # the generator measured its own punctuality; every latency includes its lateness, so never less
        assert 0 <= step.send_lateness_p50_s <= step.p50_s and step.send_lateness_p99_s <= step.max_s, step
    assert curve.steps[0].window_seconds > 0.5  # 20 req/s: windows lengthened from 0.5 s


def test_distributed_fleet_totals_equal_the_sum_of_the_workers(tmp_path):
    with stub_server(StubModel()) as host:
        doc = loadtest(
            host,
            tmp_path / "dist",
            "--workers",
            "2",
            "--rates",
            "60,120",
            "--warmup-seconds",
            "1",
            "--step-seconds",
            "3",
            "--max-windows",
            "3",
        )
    assert doc.workers == 2
    for step in doc.deployments[0].steps:
        per_worker = step.sent_by_worker
        assert len(per_worker) == 2, per_worker
        assert sum(per_worker.values()) + step.incomplete == step.sent
        assert all(count > 0.25 * step.sent for count in per_worker.values()), "rate split across workers"
        assert 0.7 * step.target_rps < step.achieved_rps < 1.3 * step.target_rps
        assert step.send_lateness_p99_s is not None  # the workers' sends carry their send times to the master
        # The generator's CPU, from the workers' own readings: Locust's heartbeat figure is 0.0 for a
        # worker's first 10 s, which every step of this run falls within (it read 0.0% at every step).
        assert step.generator_cpu_percent > 0, step.generator_cpu_percent
        # The machine was busy at least with the busiest generator process (machine_load.MachineLoad).
        assert step.machine_busy_cores >= 0.8 * step.generator_cpu_percent / 100, step.machine_busy_cores


def test_options_come_from_the_environment_and_a_config_file(tmp_path):
    config = tmp_path / "lt.toml"
    config.write_text('[loadtest]\nrates = "30"\nwarmup-seconds = 0.3\nstep-seconds = 1.5\nmax-windows = 3\n')
    with stub_server(StubModel()) as host:
        doc = loadtest(
            host,
            tmp_path / "env",
            "--config-file",
            str(config),
            env={"LATLAB_RATES": "100,150", "LATLAB_CONSTANT": "1"},
        )
    steps = doc.deployments[0].steps
    assert [s.target_rps for s in steps] == [100, 150]  # the environment beats the file
    assert doc.arrivals == "constant"
    # the file's step-seconds (rates high enough that no window is lengthened to hold 100 requests)
    assert all(s.duration_s == pytest.approx(1.5) for s in steps)  # the setting, not a measured time


@pytest.mark.parametrize("client", ["lean", "locust"])
def test_both_http_clients_send_the_planned_load(tmp_path, client):
    """The lean client (the default) and Locust's own measure the same server alike, and say which ran."""
    with stub_server(StubModel()) as host:
        doc = loadtest(
            host,
            tmp_path / client,
            "--client",
            client,
            "--rates",
            "80",
            "--constant",
            "--warmup-seconds",
            "0.5",
            "--step-seconds",
            "3",
            "--max-windows",
            "3",
        )
    (step,) = doc.deployments[0].steps
    assert doc.payload["client"] == client
    assert step.errors == 0 and step.dropped == 0 and step.sent >= 0.9 * 80 * 3
    assert 0.9 * 80 < step.achieved_rps < 1.1 * 80
    # nothing queued behind the client: the typical request waits well under two arrival gaps (its p99 is the
    # 2-core machine's: one 0.36 s stall of the VM, a fresh-clone CI run showed, puts 12% of a step behind it)
    assert step.p50_s < 2 / 80, step


def test_overload_refuses_a_recovery_load_outside_0_to_1(tmp_path):
    result = subprocess.run(
        [
            *CLI,
            "loadtest",
            "--host",
            "http://127.0.0.1:9",
            "--deployment",
            "m",
            "--overload",
            "3",
            "--recovery-load",
            "1.5",
            "--out",
            str(tmp_path / "x"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--recovery-load between 0 and 1" in result.stderr + result.stdout
    assert not (tmp_path / "x" / "results.json").exists()


def test_slo_brackets_below_the_first_rate_and_never_only_with_evidence(tmp_path):
    """A stub serving one request at a time in 1/capacity s. Bound A, half its service time, cannot be met at any
    rate: the sweep says "never" with the one-at-a-time evidence. Bound B, eight service times, is broken by the
    first listed rate (110% of capacity: the queue grows all step long): the sweep searches below it and brackets
    the highest rate that meets it. Half that rate loads the server 55%, where the p99 of Poisson arrivals is
    about four service times; a bound of four (the first version of this test) was met there by a margin the
    2-core CI machine's noise could cross (a fresh-clone run broke it at 45%)."""
    from latlab.report.write import write_report
    from latlab.loadtest.search import NEVER, slo_met

    capacity = 40.0
    service_s = 1 / capacity
    slo_a, slo_b = service_s / 2, 8 * service_s
    first = 1.1 * capacity
    with stub_server(StubModel(capacity=capacity)) as host:
        doc = loadtest(
            host,
            tmp_path / "brackets",
            "--rates",
            f"{first:g}",
            "--slos",
            f"{slo_a * 1e3:g}ms,{slo_b * 1e3:g}ms",
            "--resolution",
            "0.3",
            "--warmup-seconds",
            "0.5",
            "--step-seconds",
            "1.5",
            "--max-windows",
            "3",
            timeout=400,
        )
    curve = doc.deployments[0]
    never, below = curve.slo_brackets
    single = curve.single_request
    assert never["meaning"] == NEVER and single["p50_s"] > slo_a and single["requests"] >= 100, (never, single)
    assert below["met_rps"] is not None and below["met_rps"] < first, below
    assert below["width"] <= 0.3 and below["meaning"] == "within the resolution", below
    steps = {s.target: s for s in curve.steps}
    assert slo_met(steps[below["met_rps"]], slo_b) and not slo_met(steps[below["broke_rps"]], slo_b)
    assert not any(slo_met(s, slo_a) for s in curve.steps)
    page = write_report(tmp_path / "brackets", [slo_a, slo_b]).read_text()
    assert "never (p99" in page and "one request at a time" in page


def test_a_step_below_is_lengthened_only_for_the_slos_it_brackets(tmp_path):
    """A stub serving one request at a time in 20 ms. The loose bound (5 s) is met at the first rate (95% of
    capacity), the tight one (two and a half service times) broken there, so the sweep steps below it for the tight one
    (one at a time meets it, with room for a busy machine's noise). A step below holds
    ~100 requests: enough to decide "broken" for the tight bound, not the 299 a "met" needs for the loose one; the
    first step already settles the loose bound at every lower rate, so those steps are not lengthened for it (they
    were, to 299 requests each, before: the lab's 5-15 req/s steps took 20-47 s for bounds met at 100 req/s)."""
    from latlab.loadtest.search import slo_verdict

    capacity = 50.0
    tight, loose = 2.5 / capacity, 5.0
    with stub_server(StubModel(capacity=capacity)) as host:
        doc = loadtest(
            host,
            tmp_path / "below",
            "--rates",
            f"{0.95 * capacity:g}",
            "--slos",
            f"{tight * 1e3:g}ms,{loose * 1e3:g}ms",
            "--decide-windows",
            "10",
            "--slo-steps",
            "3",
            "--warmup-seconds",
            "0.5",
            "--step-seconds",
            "1.5",
            "--max-windows",
            "3",
            timeout=300,
        )
    first, *below = sorted(doc.deployments[0].steps, key=lambda s: -s.target)
    assert slo_verdict(first, loose) == "met" and slo_verdict(first, tight) == "broken", first.confidence
    assert first.extended_windows > 0  # nothing settled the loose bound yet: lengthened until it was met
    broken = [s for s in below if slo_verdict(s, tight) == "broken"]  # those above ~60% of capacity at least
    assert broken, ("the tight bound's bracket searched below the first rate", doc.deployments[0].single_request)
    for step in broken:  # lengthened, if at all, until the tight bound was decided; never on for the loose one
        assert step.samples < 299 and slo_verdict(step, loose) == "undecided", (step.target, step.confidence)


@pytest.mark.parametrize(
    "slow_every, extra, verdict",
    [
        (200, 0, "undecided"),  # 0.5% slow, ~300 requests: one or two over the bound cannot tell 0.5% from 1%
        # 0.25% slow, the step extended until its count decides: within the SLO. At 0.5% (the first version) a count
        # can need thousands of requests, and the extension rightly stops when the windows left cannot bring them
        # (a fresh-clone CI run: 5 over in 917, 1441 needed after 6 windows)
        (400, 40, "met"),
        (50, 40, "broken"),  # 2% slow: over the SLO once enough requests arrive
    ],
)
def test_a_known_tail_is_decided_once_enough_requests_arrive(tmp_path, slow_every, extra, verdict):
    """A stub whose every n-th answer is slow and the rest immediate: the p99 SLO (half the slow time) is met when
    fewer than 1% are slow. The step's decision says so only when its request count supports it."""
    slow_s = 0.2
    with stub_server(StubModel(slow_every=slow_every, slow_for=slow_s)) as host:
        doc = loadtest(
            host,
            tmp_path / "tail",
            "--rates",
            "200",
            "--slos",
            f"{slow_s / 2 * 1e3:g}ms",
            "--decide-windows",
            str(extra),
            "--slo-steps",
            "0",
            "--warmup-seconds",
            "0.5",
            "--step-seconds",
            "1.5",
            "--max-windows",
            "3",
            timeout=300,
        )
    (step,) = doc.deployments[0].steps
    (decision,) = step.confidence["slos"]
    assert decision["verdict"] == verdict, (decision, step.samples, step.extended_windows)
    assert step.samples == step.confidence["samples"]
    # a "met" step may have seen no slow answer at all (fewer than slow_every requests measured, the slow one in
    # the warm-up: a fresh-clone CI run decided "met" with 0 over); the others count at least one
    assert decision["over"] <= step.samples / 100 if verdict == "met" else decision["over"] >= 1, decision
    if verdict == "undecided":
        assert step.extended_windows == 0 and decision["needed"] > step.samples
    else:
        assert decision["needed"] == 0
    # the p99 interval brackets the sample p99, and the slow answers lie above the bound
    ci = step.confidence
    assert ci["p99_low_s"] <= step.p99_s and (ci["p99_high_s"] is None or step.p99_s <= ci["p99_high_s"])
