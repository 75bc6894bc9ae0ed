"""What the load generator records about faults: statuses and Retry-After, a lost worker's requests,
a server that is down or restarting, and how the report shows them."""

from __future__ import annotations

from dataclasses import replace

import pytest
import requests
from prometheus_client import CollectorRegistry, generate_latest

from latlab.common import procs
from latlab.loadtest.recorder import Recorder
from latlab.report.write import event_line, write_report
from latlab.loadtest.results import Curve, Run, Step, read_results, write_results
from latlab.loadtest.describe import describe
from latlab.loadtest.scrape import fetch, queue_gauges, scrape_batches, scrape_queue
from latlab.server.metrics import ServerMetrics


def answer(
    recorder: Recorder,
    intended: float,
    send_delay: float,
    response: float,
    status: int,
    retry_after: bool = False,
    error: str = "",
) -> None:
    key = recorder.begin(intended, intended + send_delay)
    recorder.end(key, intended + send_delay + response, status == 200, status, retry_after, error)


# --- Recorder: by status ----------------------------------------------------------------------------


def test_by_status_splits_latency_and_counts_retry_after() -> None:
    recorder = Recorder()
    for i in range(100):
        answer(recorder, i * 0.01, send_delay=0.002, response=0.001, status=503, retry_after=i != 7)
    for i in range(50):
        answer(recorder, i * 0.02, send_delay=0.0, response=0.2, status=200)
    answer(recorder, 0.5, 0.0, 0.003, status=0, error="ConnectionRefusedError")
    answer(recorder, 1.5, 0.0, 0.001, status=503)  # outside the window
    by_status = recorder.by_status(0.0, 1.0)
    assert set(by_status) == {"0", "200", "503"}
    rejected = by_status["503"]
    assert rejected["count"] == 100 and rejected["with_retry_after"] == 99
    assert rejected["p99_s"] == pytest.approx(0.003)  # from the intended send: includes the 2 ms lateness
    assert rejected["response_p99_s"] == pytest.approx(0.001)  # from the actual send: the server's part
    assert by_status["200"]["count"] == 50 and by_status["200"]["p50_s"] == pytest.approx(0.2)
    assert by_status["0"]["errors"] == {"ConnectionRefusedError": 1}
    assert "errors" not in by_status["200"]


def test_end_without_a_status_keeps_the_old_meaning() -> None:
    recorder = Recorder()
    recorder.end(recorder.begin(0.1, 0.1), 0.2, ok=True)
    recorder.end(recorder.begin(0.2, 0.2), 0.3, ok=False)
    assert {code: s["count"] for code, s in recorder.by_status(0.0, 1.0).items()} == {"200": 1, "0": 1}


def test_statuses_travel_from_worker_to_master() -> None:
    worker, master = Recorder(), Recorder()
    answer(worker, 0.1, 0.0, 0.001, status=503, retry_after=True)
    answer(worker, 0.2, 0.0, 0.001, status=0, error="ConnectionResetError")
    master.absorb("w1", worker.drain())
    by_status = master.by_status(0.0, 1.0)
    assert by_status["503"]["with_retry_after"] == 1 and by_status["0"]["errors"] == {"ConnectionResetError": 1}
    master.forget_before(0.15)
    assert set(master.by_status(0.0, 1.0)) == {"0"}


def test_a_lost_workers_requests_in_flight_are_forgotten() -> None:
    worker, master = Recorder(), Recorder()
    worker.begin(0.1, 0.1)
    worker.begin(0.2, 0.2)
    master.absorb("w1", worker.drain())
    assert master.outstanding == 2
    assert master.forget_source("w1") == 2
    assert master.outstanding == 0  # drain() no longer waits for answers that will never come
    assert master.window(0.0, 1.0, now=5.0).incomplete == 0
    assert master.forget_source("unknown") == 0


# --- scrape: a server down or restarting -------------------------------------------------------------


def test_queue_gauges_are_read_per_deployment() -> None:
    metrics = ServerMetrics(CollectorRegistry())
    for name, capacity, depth in (("a", 32, 5), ("ab", 8, 8)):
        labels = {"deployment": name, "model": "m", "provider": "cpu"}
        metrics.queue_capacity.labels(**labels).set(capacity)
        metrics.for_deployment(labels).queue_depth(depth)
    text = generate_latest(metrics.registry).decode()
    assert queue_gauges(text, "a") == (5.0, 32.0)
    assert queue_gauges(text, "ab") == (8.0, 8.0)
    assert queue_gauges(text, "absent") == (None, None)
    assert queue_gauges("", "a") == (None, None)


def test_a_server_that_is_down_gives_one_readable_line_or_none() -> None:
    host = f"http://127.0.0.1:{procs.free_port()}"
    with pytest.raises(requests.ConnectionError) as caught:
        fetch(host, "/v2/models/m/config", attempts=2, pause_s=0.01)
    assert str(caught.value) == f"cannot reach the server at {host}/v2/models/m/config (2 tries): connection refused"
    with pytest.raises(requests.ConnectionError):
        describe(host, "m")
    assert scrape_batches(host, "m") is None
    assert scrape_queue(host, "m") is None


# --- report -------------------------------------------------------------------------------------------


LOST = {
    "event": "worker_lost",
    "time": 1_700_000_000.0,
    "worker": "box_abc",
    "pid": 4242,
    "reason": "its process exited (killed by SIGKILL)",
    "deployment": "m",
    "step": 1,
    "requests_in_flight_lost": 3,
    "workers_left": 1,
    "load": "its share of 60 req/s now goes to 1 worker(s): 60 each",
}


def test_event_line_names_the_worker_the_reason_and_the_load() -> None:
    line = event_line(LOST)
    assert "Locust worker box_abc (pid 4242) lost during step 1 of 'm': its process exited (killed by SIGKILL)" in line
    assert "3 requests in flight unaccounted" in line and "60 each" in line


def test_report_shows_lost_workers_interrupted_steps_and_overload(tmp_path) -> None:
    step = Step(
        target=50,
        offered_rps=50,
        achieved_rps=30,
        p50_s=0.002,
        p90_s=0.003,
        p99_s=0.004,
        max_s=0.005,
        errors=20,
        dropped=0,
        avg_batch_size=None,
        generator_cpu_percent=10.0,
        generator_bound=False,
        stable=True,
    )
    interrupted = replace(
        step,
        server_interrupted=True,
        interruption="20 requests got no HTTP answer",
        workers_lost=["box_abc"],
    )
    run = Run(
        run_id="r1",
        machine={"hostname": "h"},
        events=[LOST],
        deployments=[
            Curve(
                name="m",
                steps=[replace(step, errors=0), interrupted],
                stop_reason="all loads done",
                overload={"summary": "overload 3x (450 req/s offered vs capacity 150, 60 s): ..."},
            )
        ],
    )
    write_results(tmp_path / "results.json", run)
    page = write_report(tmp_path, [0.025]).read_text()
    assert "Load generator events" in page and "Locust worker box_abc (pid 4242) lost during step 1" in page
    assert "(server interrupted: 20 requests got no HTTP answer)" in page and "(workers lost: box_abc)" in page
    assert "overload 3x (450 req/s offered vs capacity 150, 60 s)" in page
    (back,) = read_results(tmp_path / "results.json")
    assert back.events[0]["worker"] == "box_abc"
