"""The closed loop's senders (the Python one driven by the event loop's callbacks, and the native one driven by its
own thread: each test runs on both) against the same real socket server on 127.0.0.1 as the lean client's tests:
every way an answer is framed, answers split over many reads, a connection the server closes, one cut short, and
the request in flight when the user stops."""

from __future__ import annotations

import itertools
import shutil

import gevent
import pytest

from latlab.common import procs
from latlab.common.native_build import CACHE_ENV
from latlab.loadtest import native_loop
from latlab.loadtest.lean_http import HttpError
from latlab.loadtest.loop_sender import LoopSender
from latlab.loadtest.raw_http import Finished, at_close, parse_answer
from tests.loadtest.conftest import StubServer


def request(path: str, body: bytes = b"x") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def test_answers_are_complete_only_when_their_framing_says_so() -> None:
    whole = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
    assert parse_answer(whole) == (200, False, 5, True)
    assert all(parse_answer(whole[:cut]) is None for cut in range(len(whole)))
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunked += b"4;e=1\r\nwiki\r\n6\r\npedia \r\n0\r\nX-T: t\r\n\r\n"
    assert parse_answer(chunked) == (200, False, 10, True)
    assert all(parse_answer(chunked[:cut]) is None for cut in range(len(chunked)))
    busy = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    assert parse_answer(busy) == (503, True, 0, False)
    assert parse_answer(b"HTTP/1.0 204 No Content\r\n\r\n") == (204, False, 0, False)
    assert parse_answer(b"HTTP/1.1 200 OK\r\n\r\nuntil the end") is None  # it ends with the connection
    assert at_close(b"HTTP/1.1 200 OK\r\n\r\nuntil the end") == (200, False, 13, False)
    assert at_close(b"HTTP/1.1 200 OK\r\nContent-Le") is None
    assert at_close(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort") is None  # cut short
    with pytest.raises(HttpError):
        parse_answer(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")


@pytest.fixture(params=["python", "native"])
def sender_of(request):
    """A closed-loop sender of the kind the test runs on, sending `requests` in turn (then again from the first)."""
    if request.param == "python":
        return lambda address, requests, **options: LoopSender(address, itertools.cycle(requests).__next__, **options)
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine: the closed loop runs on the Python sender (native_loop.py)")
    lib, why = native_loop.library()
    assert lib is not None, why  # a machine with a compiler builds it
    return lambda address, requests, **options: native_loop.NativeSender(lib, address, requests, **options)


def run_for(sender, count: int) -> list[Finished]:
    """Run the sender in a greenlet until `count` requests have finished, then kill it (as Locust stops a user);
    everything it recorded, the request in flight at the kill included."""
    recorded: list[Finished] = []
    in_flight: list[float | None] = []

    def record(finished: list[Finished], flying: float | None) -> None:
        recorded.extend(finished)
        in_flight.append(flying)

    runner = gevent.spawn(sender.run, record)
    with gevent.Timeout(30):
        while len(recorded) < count:
            gevent.sleep(0.001)
    runner.kill()
    sender.heard_in_flight = any(flying is not None for flying in in_flight)
    return recorded


def test_a_kept_alive_connection_sends_each_request_as_the_last_answer_comes(server: StubServer, sender_of) -> None:
    sender = sender_of(server.server_address, [request(path) for path in ["/length", "/chunked", "/busy"]])
    finished = run_for(sender, 60)
    assert sender.heard_in_flight  # the recorder hears of a request while it flies: a stall counts as it lasts
    answered, last = finished[:-1], finished[-1]
    assert len(answered) >= 60 and server.connections == 1
    assert [f.status for f in answered[:6]] == [200, 200, 503, 200, 200, 503]
    assert [f.received for f in answered[:3]] == [5, 10, 4] and answered[2].retry_after
    assert all(f.sent <= f.done for f in finished)
    assert all(a.done <= b.sent for a, b in zip(finished, finished[1:]))  # closed loop: one at a time
    assert last.status == 0 and last.error == ""  # in flight when the user stopped: no answer, as the lean client
    assert server.bodies[:3] == [b"x", b"x", b"x"]


def test_an_answer_with_the_last_ones_head_is_read_whole(server: StubServer, sender_of) -> None:
    """An answer whose head is the last one's but for its Content-Length is not parsed again (raw_http's
    RawConnection reads that one number): its length is its own, and one cut short across reads is waited for."""
    paths = ["/length", "/length", "/length-split", "/length", "/longer", "/length"]
    finished = run_for(sender_of(server.server_address, [request(path) for path in paths]), 60)
    assert [f.received for f in finished[:60]] == [5, 5, 5, 5, 7, 5] * 10
    assert all(f.status == 200 and f.sent <= f.done for f in finished[:60]) and server.connections == 1


def test_a_connection_the_server_closes_is_opened_again(server: StubServer, sender_of) -> None:
    paths = ["/close-header", "/to-close", "/length"]
    finished = run_for(sender_of(server.server_address, [request(path) for path in paths]), 30)
    statuses = [f.status for f in finished[:-1]]
    assert statuses.count(200) == len(statuses) >= 30
    assert [f.received for f in finished[:3]] == [3, 13, 5]
    assert server.connections >= 20  # two of every three answers closed their connection


def test_an_answer_cut_short_is_an_error_and_the_next_request_goes_out(server: StubServer, sender_of) -> None:
    finished = run_for(sender_of(server.server_address, [request("/cut"), request("/length")]), 10)
    cut, whole = finished[0:-1:2], finished[1:-1:2]
    assert all(f.status == 0 and f.error == "HttpError" for f in cut), cut
    assert all(f.status == 200 for f in whole), whole


def test_a_refused_connection_is_an_error_not_a_hang(sender_of) -> None:
    finished = run_for(sender_of(("127.0.0.1", procs.free_port()), [request("/length")]), 3)
    assert all(f.status == 0 and f.error == "ConnectionRefusedError" for f in finished[:3]), finished


def test_a_large_request_is_sent_whole(server: StubServer, sender_of) -> None:
    body = bytes(range(256)) * 40_000  # 10 MiB: more than one send of a non-blocking socket
    finished = run_for(sender_of(server.server_address, [request("/length", body)]), 2)
    assert [f.status for f in finished[:2]] == [200, 200]
    assert server.bodies[0] == body


def test_an_answer_that_never_comes_fails_after_the_network_timeout(server: StubServer, sender_of) -> None:
    sender = sender_of(server.server_address, [request("/silent"), request("/length")], timeout_s=0.2)
    finished = run_for(sender, 2)
    assert (finished[0].status, finished[0].error) == (0, "timeout")
    assert finished[0].done - finished[0].sent >= sender.timeout_s
    assert finished[1].status == 200  # on a new connection


def test_finished_requests_wait_for_their_batch_unless_collected(server: StubServer, sender_of) -> None:
    """Nothing wakes the user's greenlet per request: what finished waits for the next batch (here, one never
    due), or for `collect()` (the recorder's, before it counts), which hands all of it at once."""
    batches: list[list[Finished]] = []
    sender = sender_of(server.server_address, [request("/length")], record_every_s=3600.0)
    runner = gevent.spawn(sender.run, lambda finished, _flying: batches.append(finished))
    with gevent.Timeout(30):
        while len(server.bodies) < 50:
            gevent.sleep(0.001)
    assert len(batches) == 1  # only the first connection's hand-over (the native thread may have answers by then)
    first = len(batches[0])
    sender.collect()
    assert first + len(batches[-1]) >= 49 and all(f.status == 200 for f in batches[-1])
    runner.kill()
    *answered, stopped = batches[-1]  # handed on as the sender ended: those answered since, and the one in flight
    assert stopped.status == 0 and all(f.status == 200 for f in answered)
    handed = len(batches)
    sender.collect()
    assert len(batches) == handed  # after the end there is nothing to hand on


def test_without_a_place_to_build_it_the_native_sender_says_why(tmp_path, monkeypatch) -> None:
    """A cache folder that cannot be written (here, a file in its place) leaves the native closed loop unbuilt with
    the reason; the users then run the Python sender (native_loop.closed_sender)."""
    blocked = tmp_path / "cache"
    blocked.write_text("a file, not a folder")
    monkeypatch.setenv(CACHE_ENV, str(blocked / "inside"))
    monkeypatch.setattr(native_loop, "_built", None)
    lib, why = native_loop.library()
    assert lib is None and why, why
    assert native_loop.closed_sender(lean=True, sizes_vary=False) == "python"
    assert native_loop.closed_sender(lean=False, sizes_vary=False) == "greenlet"


def test_the_native_sender_is_built_once_per_source_version_into_the_cache(tmp_path, monkeypatch) -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine: the closed loop runs on the Python sender (native_loop.py)")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(native_loop, "_built", None)
    lib, why = native_loop.library()
    assert lib is not None, why
    (built,) = tmp_path.glob("closed_loop-*.so")  # named by the source's hash; nothing else left behind
    assert list(tmp_path.iterdir()) == [built]
    stamp = built.stat().st_mtime_ns
    monkeypatch.setattr(native_loop, "_built", None)
    assert native_loop.library()[0] is not None and built.stat().st_mtime_ns == stamp  # loaded, not built again
