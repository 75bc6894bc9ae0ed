"""latlab.server.http.observer: /metrics, health, metadata and config on a port and threads of their own."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from prometheus_client import CollectorRegistry

from latlab.common import procs
from latlab.server.config import parse_config
from latlab.server.errors import ConfigError
from latlab.server.http.app import create_app
from latlab.server.http.observer import CLIENT_TIMEOUT_S, THREADS, Observer, observer_port

from tests.reliability.conftest import running_server, tiny_body, write_config

CLI = [sys.executable, "-m", "latlab.cli"]


@pytest.fixture
def observed(tiny_model: Path, make_config):
    app = create_app(make_config(tiny_model), registry=CollectorRegistry())
    observer = Observer(app, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{observer.port}"
    observer.close()
    app.extensions["latlab"].close()


def test_it_answers_the_read_only_routes_of_the_app(observed: str) -> None:
    assert requests.get(f"{observed}/v2/health/live", timeout=5).status_code == 200
    assert requests.get(f"{observed}/v2/health/ready", timeout=5).status_code == 200
    assert requests.get(f"{observed}/v2/models/tiny/config", timeout=5).json()["name"] == "tiny"
    assert "latlab_batcher_queue_depth{" in requests.get(f"{observed}/metrics", timeout=5).text
    assert requests.head(f"{observed}/metrics", timeout=5).status_code == 200


def test_infer_stays_on_the_main_port(observed: str) -> None:
    """The admission bound guards the main port; the observer must not be a way around it."""
    import numpy as np

    response = requests.post(
        f"{observed}/v2/models/tiny/infer",
        data=tiny_body(np.ones((1, 4), np.float32)),
        headers={"Content-Type": "application/json"},
        timeout=5,
    )
    assert response.status_code == 405 and response.headers["Allow"] == "GET, HEAD"
    assert "infer on the main port" in response.json()["error"]


def test_the_bearer_token_still_guards_config(tiny_model: Path) -> None:
    config = parse_config(
        {
            "server": {"auth_token": "observer-token-0123456789"},
            "deployments": [{"name": "tiny", "model_path": str(tiny_model)}],
        }
    )
    app = create_app(config, registry=CollectorRegistry())
    observer = Observer(app, "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{observer.port}/v2/models/tiny/config"
        assert requests.get(url, timeout=5).status_code == 401
        assert (
            requests.get(url, headers={"Authorization": "Bearer observer-token-0123456789"}, timeout=5).json()["name"]
            == "tiny"
        )
        assert requests.get(f"http://127.0.0.1:{observer.port}/metrics", timeout=5).status_code == 200
    finally:
        observer.close()
        app.extensions["latlab"].close()


def test_percent_encoded_paths_and_queries_reach_the_app(observed: str) -> None:
    assert requests.get(f"{observed}/v2/models/ti%6Ey/ready?x=1", timeout=5).status_code == 200
    unknown = requests.get(f"{observed}/v2/models/no%20such/ready", timeout=5)
    assert unknown.status_code == 404 and "unknown model 'no such'" in unknown.json()["error"]


@pytest.mark.parametrize(
    "head, status", [(b"NONSENSE\r\n\r\n", b"400"), (b"GET / HTTP/1.1\r\nno colon\r\n\r\n", b"400")]
)
def test_a_malformed_request_gets_400_and_the_next_is_answered(observed: str, head: bytes, status: bytes) -> None:
    port = int(observed.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(head)
        assert sock.recv(65536).split(b" ")[1] == status
    assert requests.get(f"{observed}/v2/health/live", timeout=5).status_code == 200


def test_silent_clients_cannot_hold_its_threads(observed: str) -> None:
    """More silent connections than it has threads: each is dropped after CLIENT_TIMEOUT_S, then probes pass."""
    port = int(observed.rsplit(":", 1)[1])
    silent = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(THREADS + 2)]
    try:
        assert requests.get(f"{observed}/v2/health/live", timeout=4 * CLIENT_TIMEOUT_S + 5).status_code == 200
    finally:
        for sock in silent:
            sock.close()


def listening(port: int = 0) -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    sock.listen(1)
    return sock


def test_its_port_is_the_main_port_plus_one_or_a_free_one(caplog) -> None:
    with listening() as main:
        port = main.getsockname()[1]
        assert observer_port("127.0.0.1", port - 1, 0) != port, "taken: another port"
        assert "is in use" in caplog.text
    free = procs.free_port()
    assert observer_port("127.0.0.1", free - 1, 0) == free
    assert observer_port("127.0.0.1", 8000, free) == free


def test_a_chosen_port_that_is_taken_is_a_config_error() -> None:
    with listening() as taken:
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"metrics port {port} on 127.0.0.1 is in use"):
            observer_port("127.0.0.1", 8000, port)
    with pytest.raises(ConfigError, match="is the main port"):
        observer_port("127.0.0.1", 8000, 8000)


def test_the_served_process_says_where_its_observer_listens(tmp_path: Path, tiny_model: Path) -> None:
    with running_server(tmp_path, [{"name": "tiny", "model_path": str(tiny_model)}]) as server:
        port = requests.get(f"{server.url}/v2", timeout=5).json()["metrics_port"]
        observer = f"http://127.0.0.1:{port}"
        assert requests.get(f"{observer}/v2/health/ready", timeout=5).status_code == 200
        assert "latlab_server_admission_limit{" in requests.get(f"{observer}/metrics", timeout=5).text


def test_serve_takes_the_metrics_port_from_the_command_line(tmp_path: Path, tiny_model: Path) -> None:
    port, metrics_port = procs.free_port(), procs.free_port()
    config = write_config(tmp_path / "s.toml", [{"name": "tiny", "model_path": str(tiny_model)}], port=port)
    process = procs.start(
        [*CLI, "serve", "--config", str(config), "--metrics-port", str(metrics_port)], log_path=tmp_path / "server.log"
    )
    try:
        procs.wait_ready(
            f"http://127.0.0.1:{metrics_port}/v2/health/ready", process, timeout_s=60, log_path=tmp_path / "server.log"
        )
        assert requests.get(f"http://127.0.0.1:{port}/v2", timeout=5).json()["metrics_port"] == metrics_port
    finally:
        procs.stop(process)


def test_serve_refuses_a_taken_metrics_port_in_one_line(tmp_path: Path, tiny_model: Path) -> None:
    with listening() as taken:
        port = taken.getsockname()[1]
        config = write_config(
            tmp_path / "s.toml",
            [{"name": "tiny", "model_path": str(tiny_model)}],
            port=procs.free_port(),
            metrics_port=port,
        )
        result = subprocess.run([*CLI, "serve", "--config", str(config)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == f"latlab: error: metrics port {port} on 127.0.0.1 is in use"


def test_it_says_ready_only_once_the_main_port_accepts_connections() -> None:
    """The observer opens before Granian binds the main port: a readiness probe here must not send clients to a
    port that refuses them. Its other routes answer meanwhile."""

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    main_port = procs.free_port()
    observer = Observer(app, "127.0.0.1", 0, main=("127.0.0.1", main_port))
    url = f"http://127.0.0.1:{observer.port}"
    try:
        not_yet = requests.get(f"{url}/v2/health/ready", timeout=5)
        assert not_yet.status_code == 400 and "main port" in not_yet.json()["error"]
        assert requests.get(f"{url}/v2/health/live", timeout=5).status_code == 200
        with listening(main_port):
            assert requests.get(f"{url}/v2/health/ready", timeout=5).status_code == 200
        assert requests.get(f"{url}/v2/health/ready", timeout=5).status_code == 200  # once seen, not probed again
    finally:
        observer.close()
