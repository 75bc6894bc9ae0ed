"""Several front-end processes feeding one engine ([server] frontends = 2), against the real server processes:
the routes and statuses of one process, admission counted across front ends, /metrics summed over every
process, a front end or the engine killed mid-load, and SIGTERM draining them all."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import numpy as np
import orjson
import psutil
import pytest
import requests

from latlab.server.config import INTERFACE_ENV
from tests.conftest import build_tiny_model
from tests.reliability.conftest import Server, output_of, running_server, tiny_body, tiny_y
from tests.reliability.test_overload import build_slow_model
from tests.text_models import TOKENIZER, WIDTH, token_model

FRONTENDS = 2


@pytest.fixture(scope="module", params=["wsgi", "native"], autouse=True)
def interface(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test of this module against front ends of each interface: Granian's WSGI workers, and the native
    interface's processes (server/processes/native_frontend.py), whose calls to the engine wait on no thread."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(INTERFACE_ENV, request.param)
        yield request.param


def processes(server: Server) -> tuple[list[psutil.Process], psutil.Process | None]:
    """(front ends, engine) of a running server: its front-end processes (Granian's workers, or the native
    interface's) and the engine process under the supervisor."""
    children = psutil.Process(server.process.pid).children()
    engine = [c for c in children if "latlab.server.processes.engine" in " ".join(c.cmdline())]
    return [c for c in children if c not in engine], (engine[0] if engine else None)


def wait_for(condition, what: str, limit_s: float = 60.0) -> None:
    """Poll until `condition()`; the limit only keeps a broken server from hanging the suite."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)


def observer_metrics(server: Server) -> str:
    """/metrics on the observer port (the engine's own threads: never behind a model run, as a forwarded GET
    on the main port may be)."""
    port = getattr(server, "observer_port", None)
    if port is None:
        port = server.observer_port = requests.get(f"{server.url}/v2", timeout=10).json()["metrics_port"]
    return requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text


def inflight(server: Server) -> float:
    return sample(observer_metrics(server), "latlab_server_inflight_requests", deployment="slow")


def sample(text: str, name: str, **labels: str) -> float:
    """One sample's value from a /metrics text (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(name + ("{" if labels else " ")) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.split()[-1])
    return 0.0


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, interface: str) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("frontends")
    deployments = [
        {"name": "tiny", "model_path": str(build_tiny_model(folder / "tiny.onnx")), "batcher": {"max_batch_size": 8}},
        {
            "name": "text",
            "model_path": str(token_model(folder / "toy" / "model.onnx")),
            "batcher": {"max_batch_size": 8},
            "tokenizer": {"file": str(TOKENIZER), "max_length": 16},
        },
    ]
    with running_server(folder, deployments, frontends=FRONTENDS) as server:
        yield server


def test_two_front_ends_and_one_engine_run(shared, interface):
    front_ends, engine = processes(shared)
    assert len(front_ends) == FRONTENDS and engine is not None
    assert "2 front-end processes feed the cpu engine process" in shared.log.read_text()
    native = ["latlab.server.processes.native_frontend" in " ".join(p.cmdline()) for p in front_ends]
    assert native == [interface == "native"] * FRONTENDS
    # what a load test records of the server (results' frontends and interface) says so too
    config = requests.get(f"{shared.url}/v2/models/tiny/config", timeout=10).json()
    assert (config["frontends"], config["interface"]) == (FRONTENDS, interface)


def test_json_and_binary_infer_with_the_stock_triton_client(shared):
    import tritonclient.http as triton

    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    response = shared.infer(tiny_body(x))
    assert response.status_code == 200 and np.allclose(output_of(response, (3, 3)), tiny_y(x), rtol=1e-4, atol=1e-5)
    client = triton.InferenceServerClient(shared.url.removeprefix("http://"))
    try:
        for binary in (True, False):
            tensor = triton.InferInput("x", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x, binary_data=binary)
            result = client.infer("tiny", [tensor], outputs=[triton.InferRequestedOutput("y", binary_data=binary)])
            assert np.allclose(result.as_numpy("y"), tiny_y(x), rtol=1e-4, atol=1e-5)
        assert client.is_server_ready() and client.is_model_ready("tiny")
        assert client.get_model_metadata("tiny")["inputs"][0]["name"] == "x"
    finally:
        client.close()


def test_text_is_tokenized_in_the_front_end(shared):
    body = orjson.dumps(
        {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["a short sentence", "word " * 40]}]}
    )
    response = shared.infer(body, model="text")
    assert response.status_code == 200, response.text
    doc = response.json()
    assert doc["outputs"][0]["shape"] == [2, WIDTH] and doc["parameters"]["truncated"] == 1
    metrics = observer_metrics(shared)
    assert sample(metrics, "latlab_server_preprocess_duration_seconds_count", deployment="text") >= 1


def test_errors_and_other_routes_are_those_of_one_process(shared):
    assert shared.infer(b"{not json").status_code == 400
    missing = shared.infer(tiny_body(np.ones((1, 4), np.float32)), model="nope")
    assert missing.status_code == 404 and "unknown model 'nope'" in missing.json()["error"]
    wrong = shared.infer(tiny_body(np.ones((1, 5), np.float32)))
    assert wrong.status_code == 400 and "must have shape" in wrong.json()["error"]
    assert requests.get(f"{shared.url}/v2/health/live", timeout=10).status_code == 200
    assert requests.get(f"{shared.url}/v2/health/ready", timeout=10).status_code == 200
    assert requests.get(f"{shared.url}/v2/models/tiny/config", timeout=10).json()["batcher"]["max_batch_size"] == 8
    assert requests.get(f"{shared.url}/v2/models/tiny/infer", timeout=10).status_code == 405


def test_metrics_count_every_front_end_and_the_engine(shared):
    before = sample(observer_metrics(shared), "latlab_server_requests_total", deployment="tiny", outcome="ok")
    n = 40
    with ThreadPoolExecutor(8) as pool:  # new connections each: both front ends take some
        codes = list(
            pool.map(
                lambda _: (
                    requests.post(
                        f"{shared.url}/v2/models/tiny/infer",
                        data=tiny_body(np.ones((1, 4), np.float32)),
                        headers={"Content-Type": "application/json", "Connection": "close"},
                        timeout=30,
                    ).status_code
                ),
                range(n),
            )
        )
    assert codes == [200] * n
    text = observer_metrics(shared)
    assert sample(text, "latlab_server_requests_total", deployment="tiny", outcome="ok") == before + n
    # batches are counted by the engine, requests by the front ends: one view holds both
    assert sample(text, "latlab_batcher_batch_size_sum", deployment="tiny") >= before + n
    assert sample(text, "latlab_server_processes") == 1 + FRONTENDS + 1  # supervisor, front ends, engine
    assert sample(text, "process_cpu_seconds_total") > 0
    assert requests.get(f"{shared.url}/metrics", timeout=10).text.count("latlab_server_requests_total{") >= 1


def test_each_request_is_counted_once_by_the_front_ends_and_the_engine(shared):
    """Requests counted in the front ends (request durations) and in the engine's batches (queue durations, batch
    sizes) read back in one view, each request exactly once, however batches grouped them."""
    names = {
        "latlab_server_request_duration_seconds_count": 1.0,
        "latlab_batcher_queue_duration_seconds_count": 1.0,
        "latlab_batcher_batch_size_sum": 1.0,  # one sample per request
    }
    before = {name: sample(observer_metrics(shared), name, deployment="tiny") for name in names}
    n = 32
    with ThreadPoolExecutor(8) as pool:
        codes = list(
            pool.map(
                lambda _: (
                    requests.post(
                        f"{shared.url}/v2/models/tiny/infer",
                        data=tiny_body(np.ones((1, 4), np.float32)),
                        headers={"Content-Type": "application/json"},
                        timeout=30,
                    ).status_code
                ),
                range(n),
            )
        )
    assert codes == [200] * n
    text = observer_metrics(shared)
    for name, per_request in names.items():
        assert sample(text, name, deployment="tiny") == before[name] + n * per_request, name


def slow_server(folder: Path, rows: int = 4096, **batcher: object):
    """The slow model behind a batcher that runs one request at a time, served by two front ends."""
    model = build_slow_model(folder / "slow.onnx", layers=48, rows=rows)
    settings = {"max_batch_size": 1, "max_queue_delay_ms": 0, "timeout_ms": 120000, **batcher}
    return running_server(
        folder, [{"name": "slow", "model_path": str(model), "batcher": settings}], frontends=FRONTENDS
    )


def send(server: Server, x: np.ndarray, results: list, index: int) -> None:
    started = time.monotonic()
    try:
        response = requests.post(
            f"{server.url}/v2/models/slow/infer",
            data=tiny_body(x),
            headers={"Content-Type": "application/json", "Connection": "close"},
            timeout=120,
        )
        results[index] = (response.status_code, response, started, time.monotonic())
    except requests.RequestException as exc:
        results[index] = (None, exc, started, time.monotonic())


def concurrently(server: Server, n: int) -> tuple[list, list[threading.Thread]]:
    results: list = [None] * n
    threads = [
        threading.Thread(target=send, args=(server, np.full((1, 4), i, np.float32), results, i)) for i in range(n)
    ]
    for thread in threads:
        thread.start()
    return results, threads


def run_time(server: Server) -> float:
    """One request's time alone: the slow model's run (and the hops)."""
    results: list = [None]
    send(server, np.ones((1, 4), np.float32), results, 0)
    send(server, np.ones((1, 4), np.float32), results, 0)
    status, _, started, ended = results[0]
    assert status == 200
    return ended - started


def test_admission_is_one_bound_across_front_ends(tmp_path):
    """Bound 3 (max_queue_size 2 + one batch of one): of 8 requests sent at once, whichever front end each
    reaches, 3 are admitted and 5 refused with 503 + Retry-After (two separate counts would admit 6). Runs of
    the model long enough that all 8 arrive before the first admitted one is answered, on a busy machine too."""
    with slow_server(tmp_path, rows=12288, max_queue_size=2) as server:
        assert len(processes(server)[0]) == FRONTENDS
        run_time(server)
        results, threads = concurrently(server, 8)
        for thread in threads:
            thread.join()
        codes = sorted(r[0] for r in results)
        assert codes == [200] * 3 + [503] * 5, [(r[0], getattr(r[1], "text", r[1])) for r in results]
        refused = [r[1] for r in results if r[0] == 503]
        # refused at the door ("deployment is full"), or, when the admitted three reached the engine before its
        # worker took the first from the queue, by the queue's own bound ("queue is full"): 503 + Retry-After both
        assert all(r.headers.get("Retry-After") == "1" and " is full (" in r.json()["error"] for r in refused), [
            (r.headers.get("Retry-After"), r.json()["error"]) for r in refused
        ]
        text = observer_metrics(server)
        assert sample(text, "latlab_server_requests_total", outcome="rejected") == 5
        assert sample(text, "latlab_batcher_rejections_total", reason="queue_full") == 5


def test_a_killed_front_end_is_replaced_and_the_other_keeps_serving(tmp_path):
    folder = tmp_path
    model = build_tiny_model(folder / "tiny.onnx")
    with running_server(folder, [{"name": "tiny", "model_path": str(model)}], frontends=FRONTENDS) as server:
        (victim, survivor), _ = processes(server)
        victim.send_signal(signal.SIGKILL)
        victim.wait(30)
        x = np.ones((1, 4), np.float32)
        codes = [
            requests.post(
                f"{server.url}/v2/models/tiny/infer",
                data=tiny_body(x),
                timeout=30,
                headers={"Content-Type": "application/json", "Connection": "close"},
            ).status_code
            for _ in range(30)
        ]
        assert codes == [200] * 30 and survivor.is_running()
        wait_for(lambda: len(processes(server)[0]) == FRONTENDS, "a new front end replaced the killed one")
        new = [p for p in processes(server)[0] if p.pid not in (victim.pid, survivor.pid)]
        assert len(new) == 1
        wait_for(lambda: requests.get(f"{server.url}/v2/health/ready", timeout=10).status_code == 200, "ready")


def test_a_killed_engine_fails_what_it_held_at_once_then_comes_back(tmp_path):
    """Requests held by an engine that dies are answered 503 (never lost, never left waiting for the model
    runs they queued behind), readiness says no while it is gone, and the restarted engine serves again."""
    with slow_server(tmp_path) as server:
        alone = run_time(server)
        observer_metrics(server)
        results, threads = concurrently(server, 10)  # one runs at a time: about 10 runs' worth of work
        wait_for(lambda: inflight(server) >= 8, "8 in flight")
        _, engine = processes(server)
        killed = time.monotonic()
        engine.send_signal(signal.SIGKILL)
        probes = []
        wait_for(
            lambda: (
                probes.append(requests.get(f"{server.url}/v2/health/ready", timeout=10).status_code)
                or probes[-1] != 200
            ),
            "readiness went false",
        )
        for thread in threads:
            thread.join()
        failed = [r for r in results if r[0] != 200]
        assert len(failed) >= 6 and all(r[0] == 503 for r in failed), [
            (r[0], getattr(r[1], "text", r[1])) for r in results
        ]
        # up to two of the ten may reach a front end only after the kill: those are refused as not running
        errors = [r[1].json()["error"] for r in failed]
        held = [r for r, error in zip(failed, errors) if "engine stopped while it held this request" in error]
        late = [e for e in errors if "engine is not running" in e or "engine is not reachable" in e]
        assert len(held) >= 6 and len(held) + len(late) == len(failed), errors
        # answered as soon as the engine was gone: the last of the >= 6 it held would have needed >= 6 more runs
        assert max(r[3] for r in held) - killed < 3 * alone, (alone, [r[3] - killed for r in held])
        wait_for(
            lambda: requests.get(f"{server.url}/v2/health/ready", timeout=10).status_code == 200,
            "the restarted engine is ready",
            limit_s=120,
        )
        assert processes(server)[1].pid != engine.pid
        x = np.full((1, 4), 2, np.float32)
        response = server.infer(tiny_body(x), model="slow")
        assert response.status_code == 200 and response.json()["outputs"][0]["shape"] == [1, 3]
        assert "the engine process" in server.log.read_text() and "restarting" in server.log.read_text()


def test_sigterm_drains_every_process(tmp_path):
    """SIGTERM with requests in flight: each is answered 200, then the front ends, the engine and the supervisor
    exit and the run folder is gone."""
    with slow_server(tmp_path) as server:
        run_time(server)
        observer_metrics(server)
        results, threads = concurrently(server, 3)
        wait_for(lambda: inflight(server) == 3, "3 in flight")
        front_ends, engine = processes(server)
        run_dir = Path(engine.environ()["LATLAB_RUN_DIR"])
        assert run_dir.is_dir()
        os.killpg(server.process.pid, signal.SIGTERM)
        for thread in threads:
            thread.join()
        assert [r[0] for r in results] == [200] * 3, [(r[0], getattr(r[1], "text", r[1])) for r in results]
        assert server.process.wait(60) == 0
        assert not any(p.is_running() for p in [*front_ends, engine])
        assert not run_dir.exists()


def engines_of(server: Server) -> dict[str, psutil.Process]:
    """The engine processes by their index (the last argument of their command line)."""
    children = psutil.Process(server.process.pid).children()
    return {c.cmdline()[-1]: c for c in children if "latlab.server.processes.engine" in " ".join(c.cmdline())}


def test_each_engine_serves_its_deployments_and_fails_alone(tmp_path):
    """Two deployments given engines of their own ([deployments] engine; by default one per device): each is
    served by its engine through the same front ends, both are described on both ports, and when one engine
    dies only its deployment answers 503 while the other keeps serving."""
    model = build_tiny_model(tmp_path / "tiny.onnx")
    deployments = [
        {"name": name, "model_path": str(model), "engine": name, "batcher": {"max_batch_size": 8}}
        for name in ("first", "second")
    ]
    with running_server(tmp_path, deployments, frontends=FRONTENDS) as server:
        engines = engines_of(server)
        assert sorted(engines) == ["0", "1"]
        log = server.log.read_text()
        assert "the first engine process" in log and "the second engine process" in log
        x = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)
        for name in ("first", "second"):
            response = server.infer(tiny_body(x), model=name)
            assert response.status_code == 200 and np.allclose(
                output_of(response, (2, 3)), tiny_y(x), rtol=1e-4, atol=1e-5
            )
        observer_metrics(server)
        observer = f"http://127.0.0.1:{server.observer_port}"
        for base in (server.url, observer):
            for name in ("first", "second"):
                assert requests.get(f"{base}/v2/models/{name}", timeout=10).json()["name"] == name
            assert requests.get(f"{base}/v2/health/ready", timeout=10).status_code == 200
        text = observer_metrics(server)
        assert all(
            sample(text, "latlab_batcher_batches_total", deployment=n, outcome="ok") >= 1 for n in ("first", "second")
        )
        engines["1"].send_signal(signal.SIGKILL)
        engines["1"].wait(30)
        # the supervisor waits before restarting and a new engine must start Python and load: refused meanwhile
        down = server.infer(tiny_body(x), model="second")
        assert down.status_code == 503 and "engine" in down.json()["error"], down.text
        assert server.infer(tiny_body(x), model="first").status_code == 200
        assert requests.get(f"{server.url}/v2/health/ready", timeout=10).status_code != 200
        wait_for(
            lambda: requests.get(f"{server.url}/v2/health/ready", timeout=10).status_code == 200,
            "the second engine is back",
            limit_s=120,
        )
        assert engines_of(server)["1"].pid != engines["1"].pid and engines_of(server)["0"].pid == engines["0"].pid
        # ready is the engine's word: a front end whose client has not heard the new engine yet holds the call
        # until it does (EngineClient.send_many), so the first request after it is answered
        again = server.infer(tiny_body(x), model="second")
        assert again.status_code == 200, again.text
