"""Overload at the door of the real server process: an offered rate several times the capacity and more connections than
request threads, first against the server as it was (the failure), then as it is (the fix).

The model takes ~20 ms a run on one ORT thread, batching off, max_queue_size 72. The load: `latlab loadtest
--overload 4` (open loop, from the intended send time) and, during its burst, a crowd of 200 more connections
that each send an infer request a second (waiting out Retry-After when refused, as a polite client does).
Probes read /metrics and /v2/health/ready every 0.1 s on the main port and on the observer port.

- before: `admission = false`, `threads = 64` (the old default). Requests past the 64 threads wait in Granian's
  own queue, the batcher's bound (72) never engages, nothing is refused, and the main port's /metrics and
  readiness wait behind them.
- after: the defaults. The door refuses the excess with 503 + Retry-After; the observer port answers.

Times are compared with the model's own run time (a 100 ms bound is five runs of this model here), never
with absolute bounds: this 2-core VM's speed drifts. The figures are printed and written to door.json.
"""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import requests

from latlab.common import procs
from latlab.server.config import FRONTENDS_ENV, INTERFACE_ENV

from tests.reliability.conftest import write_config
from tests.reliability.crowd import BODY, INFER, Probe, crowd_process
from tests.reliability.test_overload import CLI, build_slow_model

pytestmark = pytest.mark.e2e
QUEUE_BOUND = 72  # above the old 64 threads; at ~20 ms a run, 1.4 s of backlog when full
OLD_THREADS = 64
FACTOR = 4
BURST_S = 6
RUNS_PER_BOUND = 5  # a 100 ms bound, in runs of this model (~17-20 ms each)
PROBED = ("/metrics", "/v2/health/ready")
RECOVERY_DRAINS = 2  # the backlog's drain at the capacity measured before the burst, twice: this VM drifts
RECOVERY_WINDOWS = 2  # the recovery's own resolution: the window it ends in, and one more
BUSY_DURING_BURST = 0.75  # share of the burst the model ran: refusing must not starve it of work


def measure_capacity(url: str, n: int = 30) -> float:
    """Requests per second one at a time: the server's capacity with batching off (a run each)."""
    session = requests.Session()
    session.post(url + INFER, data=BODY, headers={"Content-Type": "application/json"}, timeout=10)
    started = time.monotonic()
    for _ in range(n):
        assert (
            session.post(url + INFER, data=BODY, headers={"Content-Type": "application/json"}, timeout=10).status_code
            == 200
        )
    return n / (time.monotonic() - started)


def queue_depths(probe: Probe, start: float, end: float) -> list[float]:
    return [
        float(line.rsplit(" ", 1)[1])
        for _, _, status, text in probe.during(start, end)
        if status == 200
        for line in text.splitlines()
        if line.startswith("latlab_batcher_queue_depth{")
    ]


def p99(values: list[float]) -> float | None:
    return float(np.percentile(values, 99)) if values else None


@dataclass
class Half:
    """One half's raw record: the load generator's run, the crowd's answers and the probes."""

    folder: Path
    capacity: float
    result: subprocess.CompletedProcess
    crowd: dict
    probes: dict[tuple[str, str], Probe]
    metrics_text: str
    alive: bool


def write_half_config(path: Path, model: Path, port: int, metrics_port: int, fixed: bool) -> Path:
    """The slow model behind a batcher that does not batch; as the server was (fixed=False) or as it is."""
    server = {} if fixed else {"admission": False, "threads": OLD_THREADS}
    write_config(
        path,
        [{"name": "slow", "model_path": str(model), "batcher": {"max_batch_size": 1, "max_queue_size": QUEUE_BOUND}}],
        port=port,
        metrics_port=metrics_port,
        **server,
    )
    path.write_text(path.read_text() + "[deployments.cpu]\nintra_op_threads = 1\nallow_spinning = false\n")
    return path


def run_half(folder: Path, model: Path, fixed: bool, capacity: float | None) -> Half:
    """Serve the slow model, overload it (the generator's burst plus the crowd) while probing, stop it."""
    folder.mkdir()
    port, metrics_port, loadgen_port = procs.free_port(), procs.free_port(), procs.free_port()
    config = write_half_config(folder / "server.toml", model, port, metrics_port, fixed)
    main, observer = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}"
    # the server as it was is one process of request threads, whatever layout the suite's run asks of the fix
    as_it_was = {} if fixed else {FRONTENDS_ENV: "", INTERFACE_ENV: ""}
    server = procs.start([*CLI, "serve", "--config", str(config)], log_path=folder / "server.log", env=as_it_was)
    probes = {
        (where, path): Probe(base + path) for where, base in (("main", main), ("observer", observer)) for path in PROBED
    }
    context = multiprocessing.get_context("spawn")
    stop, results, crowd = context.Event(), context.Queue(), None
    try:
        procs.wait_ready(f"{main}/v2/health/ready", server, timeout_s=60, log_path=folder / "server.log")
        capacity = capacity or measure_capacity(main)
        crowd = context.Process(
            target=crowd_process,
            daemon=True,
            args=(
                port,
                f"http://127.0.0.1:{loadgen_port}/metrics",
                FACTOR * capacity,
                server.pid,
                stop,
                results,
            ),
        )
        crowd.start()
        for probe in probes.values():
            probe.start()
        result = loadtest(main, folder / "run", capacity, loadgen_port)
        stop.set()
        crowded = results.get(timeout=120)
        return Half(
            folder,
            capacity,
            result,
            crowded,
            probes,
            requests.get(f"{observer}/metrics", timeout=10).text,
            server.poll() is None,
        )
    finally:
        stop.set()
        for probe in probes.values():
            probe.stopping.set()
        if crowd is not None:
            crowd.join(10)
            if crowd.is_alive():
                crowd.kill()
        procs.stop(server)


def loadtest(host: str, out: Path, capacity: float, loadgen_port: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            *CLI,
            "loadtest",
            "--host",
            host,
            "--deployment",
            "slow",
            "--overload",
            str(FACTOR),
            "--capacity",
            f"{capacity:.1f}",
            "--burst-seconds",
            str(BURST_S),
            "--rates",
            "10",
            "--step-seconds",
            "3",
            "--recovery-load",
            "0.4",
            "--metrics-port",
            str(loadgen_port),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )


def burst_figures(half: Half) -> dict:
    """The generator's overload figures plus, during its burst, the crowd's answers and the probes' times."""
    assert half.result.returncode == 0, half.result.stdout[-3000:] + half.result.stderr[-3000:]
    (deployment,) = json.loads((half.folder / "run" / "results.json").read_text())["deployments"]
    burst = next(s for s in deployment["steps"] if s["phase"] == "burst")
    start, end = burst["start_time"], burst["end_time"]
    answers = half.crowd["answers"]
    figures = {
        **deployment["overload"],
        "capacity_given_rps": half.capacity,
        "process_alive": half.alive,
        "compute_mean_s": mean_compute(half.metrics_text),
        "threads": server_threads(half.folder / "server.log"),
        "connections_peak": max(half.crowd["peaks"], default=0),
        "crowd_answers": len(answers),
        "crowd_refused": sum(s == 503 for s, _ in answers),
        "crowd_refused_without_retry_after": sum(s == 503 and not r for s, r in answers),
        "crowd_other_statuses": sorted({s for s, _ in answers} - {200, 503}),
        "crowd_failures": len(half.crowd["failures"]),
        "queue_depth_max_probed": max(queue_depths(half.probes["observer", "/metrics"], start, end), default=None),
    }
    for (where, path), probe in half.probes.items():
        samples = probe.during(start, end)
        figures[f"{where}{path}"] = {
            "p99_s": p99([s[1] for s in samples]),
            "max_s": max((s[1] for s in samples), default=None),
            "answered": sum(s[2] == 200 for s in samples),
            "probes": len(samples),
            "slowest": [
                (round(t - start, 2), round(seconds, 4))
                for t, seconds, _, _ in sorted(samples, key=lambda s: -s[1])[:3]
            ],
        }  # (s into the burst, s taken)
    return figures


def mean_compute(metrics_text: str) -> float:
    found = {}
    for line in metrics_text.splitlines():
        if line.startswith(
            ("latlab_batcher_compute_duration_seconds_sum{", "latlab_batcher_compute_duration_seconds_count{")
        ):
            found[line.split("{", 1)[0]] = float(line.rsplit(" ", 1)[1])
    return found["latlab_batcher_compute_duration_seconds_sum"] / found["latlab_batcher_compute_duration_seconds_count"]


def server_threads(log: Path) -> int:
    """The request threads the server started with, from its own log lines (wsgi.admission_summary, per process,
    times the front-end processes where there are several): none under the native interface."""
    text = log.read_text()
    processes = 1
    for line in text.splitlines():
        if " front-end processes feed " in line:
            processes = int(line.split(" front-end processes feed ")[0].split()[-1])
    for line in text.splitlines():
        if "no thread waits on a request" in line:
            return 0
        if " request threads" in line:
            return processes * int(line.split(" request threads")[0].split()[-1])
    raise AssertionError(f"no request-thread count in {log}")


@pytest.fixture(scope="module")
def door(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("door")
    model = build_slow_model(tmp / "slow" / "model.onnx", layers=64, rows=256)
    before = burst_figures(run_half(tmp / "before", model, fixed=False, capacity=None))
    after = burst_figures(run_half(tmp / "after", model, fixed=True, capacity=before["capacity_given_rps"]))
    figures = {"before": before, "after": after}
    (tmp / "door.json").write_text(json.dumps(figures, indent=2, default=str))
    print(f"{tmp / 'door.json'}:\n{(tmp / 'door.json').read_text()}")
    return figures


def recovery_bound_s(half: dict) -> float:
    return RECOVERY_DRAINS * half["drain_s"] + RECOVERY_WINDOWS * half["recovery_window_s"]


def bound_s(half: dict) -> float:
    return RUNS_PER_BOUND * half["compute_mean_s"]


def test_the_load_had_more_connections_than_request_threads_and_several_times_the_capacity(door):
    for half in door.values():
        assert half["connections_peak"] > half["threads"], (half["connections_peak"], half["threads"])
        # several times the capacity: the generator shares the two cores with an overloaded server and its Poisson
        # arrivals wobble, so it offers a few % less than asked (one run in ten of a loop: 3.58x of the 4x)
        assert half["offered_rps"] >= 0.8 * FACTOR * half["capacity_rps"], (half["offered_rps"], half["capacity_rps"])
        assert not half["generator_bound"]


def test_before_the_fix_observers_waited_behind_infer_and_nothing_was_refused(door):
    before = door["before"]
    slowest = max(before[f"main{path}"]["max_s"] for path in PROBED)
    assert slowest > bound_s(before), f"the failure did not reproduce: main-port probes took at most {slowest:.3f} s"
    assert before["rejected"] == 0 and before["crowd_refused"] == 0, "the batcher's bound never engages"
    assert before["queue_depth_max_probed"] < QUEUE_BOUND


def test_observers_answer_promptly_during_the_burst(door):
    after = door["after"]
    for path in PROBED:
        probed = after[f"observer{path}"]
        assert probed["probes"] >= 10 and probed["answered"] == probed["probes"], probed
        assert probed["p99_s"] < bound_s(after), (path, probed, bound_s(after))


def test_excess_requests_get_503_with_retry_after(door):
    after = door["after"]
    assert after["rejected"] > 0 and after["crowd_refused"] > 0
    assert after["rejected_without_retry_after"] == 0 and after["crowd_refused_without_retry_after"] == 0


def test_the_queue_never_exceeds_max_queue_size(door):
    after = door["after"]
    assert after["queue_depth_max_probed"] is not None and after["queue_depth_max_probed"] <= QUEUE_BOUND
    assert after["queue_depth_max"] <= after["queue_capacity"] == QUEUE_BOUND


def test_nothing_accepted_is_lost(door):
    after = door["after"]
    assert after["process_alive"]
    assert after["unanswered"] == 0 and after["hanging"] == 0 and after["timeouts"] == 0
    assert not after["other_statuses"] and not after["crowd_other_statuses"] and after["crowd_failures"] == 0


def test_service_is_normal_again_soon_after_the_backlog_drains(door):
    """Recovery (pooled requests served normally: docs/overload.md) within the drain time of the admitted backlog
    at the measured capacity, with slack for this VM, plus the judgement's resolution; a server that never gets
    back to normal has no recovery time and fails."""
    after = door["after"]
    assert after["recovery_s"] is not None, after["summary"]
    assert after["recovery_s"] <= recovery_bound_s(after), (after["recovery_s"], recovery_bound_s(after))


def test_the_model_kept_running_through_the_burst(door):
    """Goodput: the server kept its model busy while refusing the excess, and says how much it served."""
    after = door["after"]
    assert after["goodput_source"] == "server" and after["goodput_fraction"] is not None
    assert after["busy_share"] >= BUSY_DURING_BURST, (after["busy_share"], after["summary"])
