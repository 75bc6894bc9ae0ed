"""Closed-loop users under real Locust against the real stub server: what Locust's own statistics say after a run
(requests, failures and their kinds, the response-time histogram, bytes) is what its `request` event would have
logged of the very requests latlab's recorder counted, whether the users write it in batches (only Locust's runner
listens) or fire the event per request (a locustfile listens too).

Locust monkey-patches the process that imports it, so the runs happen in one child process (one import for all)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from typing import Iterator

import pytest

from latlab.common import procs
from tests.loadtest.conftest import StubServer

RUNS = textwrap.dedent("""
    import locust  # first, as in a sweep: Locust monkey-patches sockets and threads for gevent
    import json
    import sys

    import gevent
    from locust.env import Environment
    from locust.event import Events
    from locust.stats import RequestStats

    from latlab.loadtest.locust_stats import LOCUST_LISTENER, RequestFailed
    from latlab.loadtest.users import ClosedLoopUser, LoadState

    RECEIVED = {200: 5, 503: 4, 0: 0}  # the stub's bodies: /length, /busy; no answer


    def figures(stats):
        out = {}
        for label, entry in (("total", stats.total), ("row", stats.get("d", "GET"))):
            out[label] = {
                "requests": entry.num_requests,
                "failures": entry.num_failures,
                "response_time_ms": entry.total_response_time,
                "min_ms": entry.min_response_time,
                "max_ms": entry.max_response_time,
                "histogram": {str(k): v for k, v in sorted(entry.response_times.items())},
                "bytes": entry.total_content_length,
                "per_second": sum(entry.num_reqs_per_sec.values()),
                "failures_per_second": sum(entry.num_fail_per_sec.values()),
            }
        out["errors"] = {e["error"]: e["occurrences"] for e in stats.serialize_errors().values()}
        return out


    def closed_run(url, route, listen, count):
        environment = Environment(user_classes=[ClosedLoopUser], host=url, events=Events())
        environment.latlab = LoadState("d", 1.0, route=route)
        heard = []
        if listen:  # a locustfile's own listener: every request must reach it, one event each
            environment.events.request.add_listener(lambda **kwargs: heard.append(kwargs["exception"] is not None))
        runner = environment.create_local_runner()
        listeners = [getattr(h, "__qualname__", "") for h in environment.events.request._handlers]
        recorder = environment.latlab.recorder
        runner.start(4, spawn_rate=100)
        with gevent.Timeout(60):
            while len(recorder.status) < count:
                gevent.sleep(0.01)
                recorder.flush_completed()
        runner.stop()
        runner.quit()
        recorder.flush_completed()
        expected = RequestStats(use_response_times_cache=False)  # Locust's own way, one request at a time
        for sent, done, status, error in zip(recorder.sent, recorder.done, recorder.status, recorder.error):
            expected.log_request("GET", "d", (done - sent) * 1000.0, RECEIVED[status])
            if status != 200:
                expected.log_error("GET", "d", RequestFailed(f"HTTP {status}" if status else f"no answer: {error}"))
        return {
            "recorded": len(recorder.status),
            "not_ok": sum(1 for ok in recorder.ok if not ok),
            "outstanding": recorder.outstanding,
            "runner_listens": listeners.count(LOCUST_LISTENER),
            "heard": len(heard),
            "heard_failed": sum(heard),
            "locust": figures(environment.stats),
            "expected": figures(expected),
        }


    url = sys.argv[1]
    for route, listen, count in json.loads(sys.argv[2]):
        print(json.dumps({"route": route, "listen": listen, **closed_run(url, route, listen, count)}), flush=True)
""")
SCENARIOS = [("/length", False, 300), ("/length", True, 300), ("/busy", False, 300), ("/busy", True, 300)]
SCENARIOS += [("/cut", False, 100)]


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[tuple[str, bool], dict]]:
    """Each scenario's run: four closed-loop users GET its route of the stub until the recorder holds its count of
    requests, then stop."""
    served = StubServer(procs.free_port())
    thread = threading.Thread(target=served.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{served.server_address[1]}"
        done = subprocess.run([sys.executable, "-c", RUNS, url, json.dumps(SCENARIOS)], capture_output=True, text=True)
    finally:
        served.shutdown()
        served.server_close()
    assert done.returncode == 0, done.stderr[-3000:]
    found = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    yield {(run["route"], run["listen"]): run for run in found}


def run_of(runs: dict, route: str, listen: bool) -> dict:
    run = runs[(route, listen)]
    count = next(count for r, lis, count in SCENARIOS if (r, lis) == (route, listen))
    assert run["recorded"] >= count
    locust, expected = run["locust"], run["expected"]
    assert locust["total"]["requests"] == run["recorded"]
    assert locust["total"]["failures"] == run["not_ok"]
    assert run["outstanding"] == 0  # the requests in flight when the users stopped ended too (status 0)
    assert run["runner_listens"] == 1  # Locust's own listener is recognised: alone, it is written to directly
    for label in ("total", "row"):
        figures, want = dict(locust[label]), dict(expected[label])
        assert figures.pop("response_time_ms") == pytest.approx(want.pop("response_time_ms"))
        assert figures == want, label
    assert locust["errors"] == expected["errors"]
    return run


@pytest.mark.parametrize("listen", [False, True], ids=["batched", "with-a-listener"])
def test_locust_statistics_of_answered_requests_are_the_recorded_ones(runs: dict, listen: bool) -> None:
    run = run_of(runs, "/length", listen)
    assert run["locust"]["total"]["bytes"] == 5 * (run["recorded"] - run["not_ok"])
    assert run["heard"] == (run["recorded"] if listen else 0)


@pytest.mark.parametrize("listen", [False, True], ids=["batched", "with-a-listener"])
def test_locust_counts_every_refusal_as_a_failure_of_its_kind(runs: dict, listen: bool) -> None:
    run = run_of(runs, "/busy", listen)
    assert run["not_ok"] == run["recorded"]
    assert run["locust"]["errors"]["RequestFailed('HTTP 503')"] >= run["recorded"] - 4  # 4 users' last: status 0
    assert run["heard_failed"] == (run["recorded"] if listen else 0)


def test_answers_cut_short_are_failures_without_an_answer(runs: dict) -> None:
    run = run_of(runs, "/cut", listen=False)
    assert run["locust"]["errors"]["RequestFailed('no answer: HttpError')"] >= run["recorded"] - 4
