"""latlab.server.batching.admission: the bound at the door; the request threads it calls for (config) and checks."""

from __future__ import annotations

import threading

import pytest

from latlab.server.batching.admission import Admission
from latlab.server.config import SPARE_THREADS, BatcherSettings, admitted_bound, auto_threads, parse_config
from latlab.server.errors import ConfigError, QueueFull


def doc(server: dict | None = None, **batcher: object) -> dict:
    return {
        "server": server or {},
        "deployments": [
            {"name": "a", "model_path": "/m.onnx", "batcher": batcher},
            {
                "name": "b",
                "model_path": "/m.onnx",
                "batcher": {"max_batch_size": 8, "instances": 2, "max_queue_size": 10},
            },
        ],
    }


def test_the_bound_is_a_full_queue_plus_the_largest_batches_in_flight() -> None:
    assert admitted_bound(BatcherSettings()) == 256 + 1
    assert admitted_bound(BatcherSettings(max_batch_size=32, instances=2, max_queue_size=100)) == 100 + 64


def test_threads_default_to_every_admitted_request_plus_spares() -> None:
    config = parse_config(doc(max_queue_size=50))
    assert config.threads == (50 + 1) + (10 + 2 * 8) + SPARE_THREADS == auto_threads(config.deployments)


def test_explicit_threads_must_exceed_the_admitted_requests() -> None:
    assert parse_config(doc({"threads": 78}, max_queue_size=50)).threads == 78  # 77 admitted: one thread to refuse
    with pytest.raises(ConfigError) as caught:
        parse_config(doc({"threads": 64}))  # the old default, below the default queue bound
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("[server]: threads = 64 must exceed the 283 infer requests")
    assert "'a' 256 + 1 x 1, 'b' 10 + 2 x 8" in message and "leave threads unset (287)" in message


def test_admission_off_skips_the_thread_check() -> None:
    config = parse_config(doc({"threads": 64, "admission": False}))
    assert (config.threads, config.admission) == (64, False)


@pytest.mark.parametrize(
    "server, message",
    [
        ({"threads": -1}, "threads >= 0"),
        ({"metrics_port": 70000}, "metrics_port must be in 0..65535"),
        ({"port": 9000, "metrics_port": 9000}, "differ from port, got 9000"),
        ({"admission": "yes"}, "admission must be true or false"),
    ],
)
def test_bad_server_settings_are_named(server: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(doc(server))


def test_admission_refuses_past_its_limit_and_counts_the_refusal() -> None:
    refused = []
    admission = Admission(2, lambda: refused.append(1), detail=": max_queue_size 1 waiting + 1 x max_batch_size 1")
    admission.enter()
    admission.enter()
    with pytest.raises(QueueFull, match=r"deployment is full \(2 requests admitted: max_queue_size 1 waiting"):
        admission.enter()
    assert (admission.count, refused) == (2, [1])
    admission.leave()
    admission.enter()  # a place freed is a place taken
    assert admission.count == 2


def test_without_a_limit_everything_is_admitted() -> None:
    admission = Admission(None)
    for _ in range(1000):
        admission.enter()
    assert admission.count == 1000


def test_the_count_holds_under_concurrent_threads() -> None:
    admission, admitted, start = Admission(50), [], threading.Barrier(8)

    def client() -> None:
        start.wait()
        for _ in range(200):
            try:
                admission.enter()
            except QueueFull:
                continue
            admitted.append(1)

    threads = [threading.Thread(target=client) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert admission.count == len(admitted) == 50
