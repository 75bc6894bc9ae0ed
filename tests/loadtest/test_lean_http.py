"""The generator's HTTP client against a real socket server on 127.0.0.1: every way an answer can be
framed, kept-alive connections (and one the server closed meanwhile), and answers cut short."""

from __future__ import annotations

import socket

import pytest

from latlab.common import procs
from latlab.loadtest.lean_http import HttpError, LeanClient
from tests.loadtest.conftest import StubServer


def client_of(server: StubServer) -> LeanClient:
    return LeanClient(f"http://127.0.0.1:{server.server_address[1]}", timeout_s=5.0)


def test_prepare_encodes_the_request_once_with_its_length() -> None:
    client = LeanClient("http://127.0.0.1:8000/prefix/")
    request = client.prepare(
        "POST", "/v2/models/m/infer", b'{"inputs": []}', {"Content-Type": "application/json", "Content-Length": "999"}
    )
    head, _, body = request.raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /prefix/v2/models/m/infer HTTP/1.1"
    assert set(lines[1:]) == {"Host: 127.0.0.1:8000", "Content-Length: 14", "Content-Type: application/json"}
    assert body == b'{"inputs": []}'


def test_only_plain_http_urls() -> None:
    with pytest.raises(ValueError, match="plain http"):
        LeanClient("https://example.org")


def test_content_length_answers_reuse_one_connection(server: StubServer) -> None:
    client = client_of(server)
    request = client.prepare("POST", "/length", b"abc")
    answers = [client.send(request) for _ in range(5)]
    assert [(a.status, a.body) for a in answers] == [(200, b"hello")] * 5
    assert answers[0].headers["content-type"] == "text/plain"
    assert server.connections == 1 and server.bodies == [b"abc"] * 5
    client.close()


def test_chunked_answer_is_joined_and_trailers_skipped(server: StubServer) -> None:
    client = client_of(server)
    for _ in range(2):  # the trailers were consumed: the connection stays usable
        assert client.send(client.prepare("GET", "/chunked")).body == b"wikipedia "
    assert server.connections == 1


def test_answer_without_length_runs_to_close(server: StubServer) -> None:
    client = client_of(server)
    assert client.send(client.prepare("GET", "/to-close")).body == b"until the end"
    assert client.send(client.prepare("GET", "/length")).body == b"hello"
    assert server.connections == 2  # the first connection was not kept


def test_connection_close_header_is_obeyed(server: StubServer) -> None:
    client = client_of(server)
    assert client.send(client.prepare("GET", "/close-header")).body == b"bye"
    assert client.send(client.prepare("GET", "/length")).status == 200
    assert server.connections == 2


def test_refusal_headers_reach_the_caller(server: StubServer) -> None:
    answer = client_of(server).send(client_of(server).prepare("POST", "/busy", b"x"))
    assert (answer.status, answer.headers["retry-after"], answer.body) == (503, "1", b"full")


def test_a_kept_connection_the_server_closed_is_replaced_once(server: StubServer) -> None:
    client = client_of(server)
    once = client.prepare("GET", "/once")
    assert client.send(once).body == b"ok"
    # The server closed its end silently; the client still holds the socket as idle.
    assert client.send(client.prepare("POST", "/length", b"again")).body == b"hello"
    assert server.connections == 2 and server.bodies[-1] == b"again"


def test_an_answer_cut_short_raises(server: StubServer) -> None:
    with pytest.raises(HttpError, match="middle of an answer"):
        client_of(server).send(client_of(server).prepare("GET", "/cut"))


def test_not_http_raises(server: StubServer) -> None:
    with pytest.raises(HttpError, match="not an HTTP answer"):
        client_of(server).send(client_of(server).prepare("GET", "/garbage"))


def test_nobody_listening_raises_connection_refused() -> None:
    client = LeanClient(f"http://127.0.0.1:{procs.free_port()}", connect_timeout_s=2.0)
    with pytest.raises(ConnectionRefusedError):
        client.send(client.prepare("GET", "/"))


def test_a_silent_server_times_out() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    try:
        client = LeanClient(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout_s=0.2)
        with pytest.raises(TimeoutError):
            client.send(client.prepare("GET", "/"))
    finally:
        listener.close()
