"""Arrival processes through real Locust (two worker processes) against a real HTTP server that notes when
each request reached it: the fleet's arrivals follow the one schedule asked for, a trace is replayed with its
shape, and a bad trace stops the run before any load."""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from latlab.loadtest.arrivals import Arrivals, load_trace
from latlab.loadtest.results import Step
from tests.e2e.test_loadtest import CLI, loadtest
from tests.loadtest.stub_server import StubModel, stub_server

pytestmark = pytest.mark.e2e
TRACE = Path(__file__).parents[2] / "traces" / "AzureLLMInferenceTrace_conv.csv"
STEP = ["--warmup-seconds", "0.5", "--step-seconds", "6", "--max-windows", "3", "--calibrate-seconds", "0"]


def follows(arrived: list[float], offsets: list[float], step: Step) -> float:
    """How far the server's arrivals stray from the schedule over the step's measured span: with intended times
    origin + offsets[k], a request reaches the server between its intended time and its answer, so
    `arrived[k] - offsets[k]` lies between the origin and the origin plus the request's latency. Returns the
    spread of those differences (99th minus 1st percentile) for the requests intended within the step's figures
    (the origin taken as the least difference), which is at most the step's largest latency when the server saw
    the schedule, and seconds of the schedule's own gaps when it saw another (independent streams per worker,
    another seed, another shape)."""
    delays = np.sort(np.asarray(arrived)) - np.asarray(offsets)
    intended = delays.min() + np.asarray(offsets)
    mine = (intended >= step.end_time - step.duration_s) & (intended < step.end_time)
    assert mine.sum() >= 0.5 * step.sent, "the step's requests are among the server's"
    low, high = np.percentile(delays[mine], [1, 99])
    return float(high - low)


def test_two_workers_send_one_bursty_schedule(tmp_path):
    """Gamma gaps of CV 3, seeded: what reached the server is that schedule, burst for burst, from both workers."""
    rate, seed, model = 200.0, 7, StubModel()
    with stub_server(model) as host:
        run = loadtest(
            host,
            tmp_path,
            "--rates",
            f"{rate:g}",
            "--arrivals",
            "gamma:3",
            "--seed",
            str(seed),
            "--workers",
            "2",
            *STEP,
        )
    (step,) = run.deployments[0].steps
    assert run.arrivals == "gamma:3"
    schedule = list(itertools.islice(Arrivals.parse("gamma:3").offsets(rate, seed), len(model.arrived)))
    assert follows(model.arrived, schedule, step) <= step.max_s
    other = list(itertools.islice(Arrivals.parse("gamma:3").offsets(rate, seed + 1), len(model.arrived)))
    assert follows(model.arrived, other, step) > step.max_s  # the check can tell schedules apart
    # the burstiness as sent is the schedule's over the same requests (the generator's own doing: their ratio)
    assert step.arrival_cv == pytest.approx(step.intended_cv, rel=0.15) and step.intended_cv > 2
    assert len(step.sent_by_worker) == 2 and min(step.sent_by_worker.values()) > 0.3 * step.sent


def test_a_trace_is_replayed_at_the_asked_rate_with_its_shape(tmp_path):
    start_s, rate, model = 600.0, 100.0, StubModel()
    with stub_server(model) as host:
        run = loadtest(
            host, tmp_path, "--trace", str(TRACE), "--trace-rate", f"{rate:g}", "--trace-start", f"{start_s:g}", *STEP
        )
    (step,) = run.deployments[0].steps
    assert run.arrivals == f"trace:{TRACE.name}@{start_s:g}s"
    replay = list(itertools.islice(load_trace(TRACE).replay(rate, start_s), len(model.arrived)))
    assert follows(model.arrived, replay, step) <= step.max_s
    elsewhere = list(itertools.islice(load_trace(TRACE).replay(rate, 0.0), len(replay)))
    assert follows(model.arrived, elsewhere, step) > step.max_s
    assert step.offered_rps == pytest.approx(rate, rel=0.35)  # the trace's own lulls and bursts, at its mean


def test_a_bad_trace_stops_the_run_in_one_line_before_any_load(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,3\n2023-11-16 18:15:45,4\n")
    model = StubModel()
    with stub_server(model) as host:
        done = subprocess.run(
            [
                *CLI,
                "loadtest",
                "--host",
                host,
                "--deployment",
                "m",
                "--trace",
                str(bad),
                "--trace-rate",
                "50",
                "--out",
                str(tmp_path / "out"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith("row 3: its timestamp is earlier than the row before's: the trace must be sorted")
    )
    assert not model.arrived and not (tmp_path / "out").exists()


def test_a_replayed_trace_sends_each_request_at_its_rows_size(tmp_path):
    """Sizes from the trace's ContextTokens, row for row with the times replayed: what reached the server follows
    the column over the replayed span (two-sample KS), and not a column drawn from elsewhere."""
    start_s, rate, model = 1200.0, 100.0, StubModel(dynamic=True)
    with stub_server(model) as host:
        run = loadtest(
            host,
            tmp_path,
            *("--trace", str(TRACE), "--trace-rate", f"{rate:g}", "--trace-start", f"{start_s:g}"),
            *("--dim", "seq=trace:ContextTokens", "--workers", "2"),
            *STEP,
        )
    assert run.payload["sizes"] == "trace:ContextTokens"
    trace = load_trace(TRACE)
    rows = list(itertools.islice(trace.rows(start_s), len(model.sizes)))
    replayed = np.array([trace.columns["ContextTokens"][row] for row in rows])
    assert stats.ks_2samp(model.sizes, replayed).pvalue > 0.001
    shifted = np.array(
        [trace.columns["ContextTokens"][row] for row in itertools.islice(trace.rows(0.0), 4 * len(rows))]
    )
    assert stats.ks_2samp(model.sizes, np.sort(shifted)[len(shifted) // 2 :]).pvalue < 1e-6  # the test tells them apart
