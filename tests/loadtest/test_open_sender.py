"""The open loop's sender against the stub server on 127.0.0.1 (tests/loadtest/conftest.py): requests sent at
once on idle keep-alive connections, answers reported from the event loop, a kept-alive connection the server
closed meanwhile replaced once, and what is in flight when the user stops or the network timeout passes."""

from __future__ import annotations

import time

import gevent

from latlab.common import procs
from latlab.loadtest.open_sender import OpenSender
from latlab.loadtest.raw_http import Finished
from tests.loadtest.conftest import StubServer
from tests.loadtest.test_loop_sender import request


def collect(sender_of) -> tuple[OpenSender, dict[object, Finished]]:
    reported: dict[object, Finished] = {}

    def done(token: object, finished: Finished) -> None:
        assert token not in reported  # once per request
        reported[token] = finished

    return sender_of(done), reported


def wait_for(reported: dict, count: int) -> None:
    with gevent.Timeout(30):
        while len(reported) < count:
            gevent.sleep(0.001)


def test_requests_go_out_at_once_and_reuse_the_idle_connections(server: StubServer) -> None:
    sender, reported = collect(lambda done: OpenSender(server.server_address, done))
    for burst in range(5):
        for k in range(4):  # four at once: four connections, kept and reused by the next bursts
            sender.send(request("/length"), (burst, k), time.time())
        wait_for(reported, 4 * (burst + 1))
    assert {f.status for f in reported.values()} == {200} and {f.received for f in reported.values()} == {5}
    assert all(f.sent <= f.done for f in reported.values())
    assert server.connections == 4 and sender.in_flight == 0 and len(sender.idle) == 4
    sender.close()


def test_a_kept_alive_connection_the_server_closed_is_replaced_once(server: StubServer) -> None:
    sender, reported = collect(lambda done: OpenSender(server.server_address, done))
    sender.send(request("/once"), "first", time.time())  # answered, then closed without a word
    wait_for(reported, 1)
    gevent.sleep(0.05)
    sender.send(request("/length"), "second", time.time())
    wait_for(reported, 2)
    assert reported["second"].status == 200 and server.connections == 2
    sender.close()


def test_answers_that_fail_are_status_0_with_why(server: StubServer) -> None:
    sender, reported = collect(lambda done: OpenSender(server.server_address, done))
    for k, path in enumerate(["/cut", "/garbage", "/busy", "/close-header"]):
        sender.send(request(path), k, time.time())
    wait_for(reported, 4)
    assert [(reported[k].status, reported[k].error) for k in range(4)] == [
        (0, "HttpError"),
        (0, "HttpError"),
        (503, ""),
        (200, ""),
    ]
    assert reported[2].retry_after
    sender.close()


def test_a_refused_connection_is_reported_not_hung() -> None:
    sender, reported = collect(lambda done: OpenSender(("127.0.0.1", procs.free_port()), done))
    sender.send(request("/length"), "x", time.time())
    wait_for(reported, 1)
    assert (reported["x"].status, reported["x"].error) == (0, "ConnectionRefusedError")
    assert sender.in_flight == 0


def test_a_silent_server_times_out_and_a_stopped_user_reports_what_flies(server: StubServer) -> None:
    sender, reported = collect(lambda done: OpenSender(server.server_address, done, timeout_s=0.2))
    sender.send(request("/silent"), "silent", time.time())
    wait_for(reported, 1)
    assert (reported["silent"].status, reported["silent"].error) == (0, "timeout")
    stopping, stopped = collect(lambda done: OpenSender(server.server_address, done))
    stopping.send(request("/silent"), "flying", time.time())
    with gevent.Timeout(30):
        while not stopping.flying:
            gevent.sleep(0.001)
    stopping.close()
    assert (stopped["flying"].status, stopped["flying"].error) == (0, "")
