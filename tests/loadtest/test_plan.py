"""The sweep plan: parts whose defaults are `latlab loadtest`'s, that check themselves with the command's messages,
and that travel to a child load test as JSON and come back the same."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from latlab.common.user_input import Slos, UserError
from latlab.loadtest.arrivals import Arrivals
from latlab.loadtest.child import PLAN_FILE, read_job, write_job
from latlab.loadtest.confidence import DEFAULT_CONFIDENCE
from latlab.loadtest.plan import OverloadPlan, PayloadOptions, Provenance, SweepPlan, Workers, Workload
from latlab.loadtest.schedule import Schedule, SloSearch

TARGET = ["--host", "http://127.0.0.1:9", "--deployment", "a,b"]


def test_a_plan_built_in_code_is_the_plan_of_the_commands_defaults() -> None:
    assert SweepPlan.from_options(TARGET) == SweepPlan(Workload("http://127.0.0.1:9", ("a", "b")))
    assert SloSearch().confidence == DEFAULT_CONFIDENCE


def test_the_plan_is_light_every_latlab_command_imports_it_to_build_its_options() -> None:
    import subprocess
    import sys

    code = "import sys, latlab.loadtest.plan; print(sorted({'numpy', 'locust', 'gevent'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr


def test_the_options_become_typed_parts() -> None:
    plan = SweepPlan.from_options(
        [
            *TARGET,
            "--rates",
            "10,20",
            "--step-seconds",
            "1.5",
            "--max-windows",
            "1",
            "--slos",
            "50ms,10ms",
            "--slo",
            "p99=25ms",
            "--inputs",
            "in.npz",
            "--workers",
            "2",
            "--provider",
            " CUDA ",
        ]
    )
    assert plan.schedule.loads == (10.0, 20.0) and plan.schedule.window_seconds == 0.5
    assert plan.schedule.max_windows == 3  # never fewer than the three a step's figures come from
    assert plan.slo.slos == Slos((0.01, 0.05)) and plan.slo.p99_s == 0.025 and plan.slo.search
    assert plan.slo.bounds == (0.01, 0.05, 0.025)
    assert plan.workload.payload.inputs == "in.npz" and plan.workers.local == 2
    assert plan.provenance.provider == "cuda"
    closed = SweepPlan.from_options([*TARGET, "--mode", "closed", "--users", "1,4", "--slo", "25ms"])
    assert closed.schedule.loads == (1.0, 4.0) and not closed.slo.search  # a closed loop sweeps its users
    assert SweepPlan.from_options([*TARGET, "--slo", "25ms", "--sweep"]).slo.search is False
    assert SweepPlan.from_options([*TARGET, "--overload", "3"]).overload == OverloadPlan(factor=3.0)
    bursty = SweepPlan.from_options([*TARGET, "--arrivals", "onoff:4,1,5", "--seed", "9"]).schedule
    assert bursty.arrivals == Arrivals("onoff", peak=4, on_s=1, off_s=5) and bursty.seed == 9
    assert SweepPlan.from_options([*TARGET, "--constant"]).schedule.arrivals == Arrivals("constant")


@pytest.mark.parametrize(
    "options, message",
    [
        (["--host", "http://x"], "loadtest needs --host and at least one --deployment"),
        ([*TARGET, "--seq-len", "0"], "--seq-len must be >= 1, got 0"),
        ([*TARGET, "--slo-growth", "1"], "--slo-growth must be above 1 and at most 16, got 1"),
        ([*TARGET, "--slos", "5ms", "--mode", "closed"], "--slos brackets offered rates: it needs --mode open"),
        ([*TARGET, "--overload", "2", "--slo", "5ms"], "--overload needs a positive factor, open-loop mode"),
        ([*TARGET, "--provider", "1 cpu"], "--provider names what the deployments compute on"),
        ([*TARGET, "--no-such-option"], "unrecognized arguments: --no-such-option"),
        ([*TARGET, "--arrivals", "gamma:3", "--mode", "closed"], "a closed loop's users send when answers return"),
        ([*TARGET, "--arrivals", "gamma:3", "--constant"], "--arrivals and --constant both say how requests arrive"),
        ([*TARGET, "--trace-rate", "50"], "--trace-rate replays a trace: name it with --trace FILE"),
        ([*TARGET, "--trace-start", "5"], "--trace-start is where a replayed trace starts"),
        ([*TARGET, "--arrivals", "onoff:9,1,1"], "PEAK can be at most"),
    ],
)
def test_a_plan_refuses_what_the_command_refuses(options: list[str], message: str) -> None:
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SweepPlan.from_options(options)


def test_each_part_checks_itself_when_built_in_code() -> None:
    with pytest.raises(UserError, match="--max-rate must be a finite rate >= 0"):
        Schedule(max_rate=-1.0)
    with pytest.raises(UserError, match="--inputs and --text do not combine"):
        Workload("http://x", ("a",), PayloadOptions(text=True, inputs="in.npz"))
    with pytest.raises(UserError, match="--confidence must be at least 0.5"):
        SloSearch(confidence=0.2)
    with pytest.raises(UserError, match="--server-metrics must be an http"):
        Provenance(server_metrics="ftp://x")
    assert SweepPlan(Workload("http://x"), Schedule(calibrate_only=True)).workload.deployments == ()


def test_a_plan_comes_back_from_json_as_it_was(tmp_path: Path) -> None:
    plan = SweepPlan(
        Workload("http://127.0.0.1:9", ("a", "b"), PayloadOptions(binary=True, seq_len=16, inputs="in.npz")),
        Schedule(loads=(5, 50), window_seconds=0.5, max_rate=400.0, arrivals=Arrivals("constant")),
        SloSearch(slos=Slos((0.05, 0.01)), decide_windows=2, max_seconds=30.0),
        Workers(local=2, metrics_port=9646),
        Provenance(machine_name="box", provider="cuda", server_metrics="http://127.0.0.1:8002/metrics"),
        OverloadPlan(factor=2.0, capacity_rps=100.0),
    )
    assert SweepPlan.from_json(plan.to_json()) == plan
    assert plan.schedule.loads == (5.0, 50.0) and plan.slo.slos.seconds == (0.01, 0.05)
    swept = replace(plan, overload=None, slo=replace(plan.slo, p99_s=0.05))
    assert read_job(write_job(tmp_path / PLAN_FILE, swept, tmp_path / "run", "r1")) == (swept, tmp_path / "run", "r1")
