"""A real fleet (replicas of the tiny model, a real HAProxy): requests spread over the replicas, every replica and
the proxy are scraped, a killed replica is replaced and its errors counted, a rolling restart loses nothing, and
the proxy rate-limits a client with 429 + Retry-After."""

from __future__ import annotations

import os
import signal
import time

import requests

from latlab.fleet.run import READY_TIMEOUT_S
from latlab.fleet.spec import READY_PATH, Replica
from tests.fleet.conftest import Load, infer, proxy_responses, served


def wait_until(condition, what: str) -> None:
    """Poll `condition` until true; the bound is a safety limit, not a claim about speed."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.1)


def ready(replica: Replica) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{replica.metrics_port}{READY_PATH}", timeout=5).status_code == 200
    except requests.ConnectionError:
        return False


def test_requests_spread_over_every_replica_and_each_is_scraped(start_fleet):
    fleet = start_fleet(balance="roundrobin")
    with requests.Session() as session:
        statuses = [infer(session, fleet).status_code for _ in range(20)]
    assert statuses == [200] * 20
    counts = served(fleet)
    assert set(counts) == {"r0", "r1"}
    assert all(n > 0 for n in counts.values()), counts  # one keep-alive client, yet both replicas serve it
    assert sum(counts.values()) == 20
    assert proxy_responses(fleet, "2xx") == 20
    assert fleet.states() == {"r0": "UP", "r1": "UP"}


def test_a_killed_replica_errors_are_counted_and_it_is_restarted(start_fleet):
    fleet = start_fleet(balance="leastconn")
    victim = fleet.replicas[0]
    with Load(fleet, threads=3, count=300) as load:
        wait_until(lambda: load.sent() >= 60, "the load got going")
        os.killpg(victim.process.pid, signal.SIGKILL)  # the replica and its Granian worker, mid-load
        wait_until(lambda: load.sent() >= 300, "requests were answered after the kill")
    # Nothing hung. A request in flight on the dead replica is answered 502 when it was its connection's first;
    # on a kept-alive connection HAProxy closes it without an answer instead (RFC 9112 9.3.1: the client may
    # retry), which the client counts (latlab loadtest as a failed request); HAProxy's own counters miss some.
    assert not [f for f in load.failures if isinstance(f, requests.Timeout)], load.failures[:3]
    assert all(isinstance(f, requests.ConnectionError) for f in load.failures), load.failures[:3]
    errors = [s for s in load.statuses if s != 200]
    assert all(s >= 500 for s in errors), errors
    assert proxy_responses(fleet, "5xx") == len(errors)  # the proxy counts each error status a client saw
    wait_until(lambda: victim.restarts == 1, "the supervisor restarted the replica")
    assert any("r0 exited with status" in line for line in fleet.lines)
    # ready on its own port, which only the new process can be, and seen up by the proxy's checks
    wait_until(lambda: ready(victim.replica) and fleet.states()["r0"] == "UP", "the new replica is back")
    with requests.Session() as session:
        assert all(infer(session, fleet).status_code == 200 for _ in range(20))
    assert served(fleet)["r0"] > 0  # the new process serves


def test_a_rolling_restart_under_load_loses_no_request(start_fleet):
    fleet = start_fleet(balance="leastconn")
    before = [r.process.pid for r in fleet.replicas]
    with Load(fleet, threads=2, count=2000) as load:
        wait_until(lambda: load.sent() >= 20, "the load got going")
        fleet.roll()
        during = load.sent()
        wait_until(lambda: load.sent() >= during + 20, "requests flowed after the roll")
    assert [r.process.pid for r in fleet.replicas] != before
    assert all(a != b for a, b in zip(before, [r.process.pid for r in fleet.replicas]))
    assert not load.failures, load.failures[:3]
    assert load.statuses and set(load.statuses) == {200}
    assert fleet.states() == {"r0": "UP", "r1": "UP"}
    assert [line for line in fleet.lines if "back in rotation" in line] == [
        "rolling r0: back in rotation",
        "rolling r1: back in rotation",
    ]


def test_the_proxy_limits_each_client_with_429_and_retry_after(start_fleet):
    fleet = start_fleet(rate_limit=5)
    answers = []
    with requests.Session() as session:
        while len(answers) < 200 and not any(a.status_code == 429 for a in answers):
            answers.append(infer(session, fleet))
    refused = answers[-1]
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "1"
    assert "requests per second" in refused.json()["error"]
    assert [a.status_code for a in answers[:5]] == [200] * 5  # the limit's own requests pass
    assert sum(served(fleet).values()) == len(answers) - 1  # refused at the proxy: no replica saw it
    assert proxy_responses(fleet, "4xx") == 1
