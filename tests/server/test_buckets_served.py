"""Batch buckets through the real server process: concurrent requests padded to buckets, exact answers, padded
rows in /metrics apart from requests, a bad request alone refused."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import requests

from tests.conftest import build_tiny_model
from tests.reliability.conftest import assert_error, output_of, running_server, tiny_body, tiny_y


def test_served_batches_pad_to_buckets_and_answer_exactly(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "tiny" / "model.onnx")
    deployment = {
        "name": "tiny",
        "model_path": str(model),
        "batcher": {"max_batch_size": 8, "batch_buckets": [1, 2, 4, 8], "max_queue_delay_ms": 30.0},
    }
    rng = np.random.default_rng(11)
    inputs = [rng.standard_normal((rows, 4)).astype(np.float32) for rows in (1, 2, 1, 3, 1)]
    answers: list = [None] * len(inputs)
    with running_server(tmp_path, [deployment]) as server:
        labels = {"deployment": "tiny", "model": "tiny", "provider": "cpu"}
        assert requests.get(f"{server.url}/v2/models/tiny/config", timeout=10).json()["bucket_runs"] == {
            "batch_buckets": [1, 2, 4, 8],
            "bucket_mode": "shared",
            "sessions": 1,
        }

        def send(i: int) -> None:
            answers[i] = server.infer(tiny_body(inputs[i]))

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(inputs))]
        for thread in threads:
            thread.start()
        assert_error(server.infer(tiny_body(np.ones((2, 5), np.float32))), 400, "must have shape")
        for thread in threads:
            thread.join(30)
        for x, response in zip(inputs, answers):
            assert response.status_code == 200
            np.testing.assert_allclose(output_of(response, (len(x), 3)), tiny_y(x), rtol=1e-5, atol=1e-5)
        samples = sum(len(x) for x in inputs)
        run_rows = server.metric("latlab_batcher_run_rows_total", **labels)
        padded = server.metric("latlab_batcher_padded_rows_total", **labels)
        assert run_rows == samples + padded  # every row run is a sample asked for or a padded one
        assert server.metric("latlab_batcher_batch_size_sum", **labels) == samples  # padding is not a request
        assert server.metric("latlab_server_requests_total", **labels, outcome="ok") == len(inputs)
        alone = rng.standard_normal((3, 4)).astype(np.float32)  # by itself: 3 rows run as bucket 4
        np.testing.assert_allclose(
            output_of(server.infer(tiny_body(alone)), (3, 3)), tiny_y(alone), rtol=1e-5, atol=1e-5
        )
        assert server.metric("latlab_batcher_padded_rows_total", **labels) == padded + 1
