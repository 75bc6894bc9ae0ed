"""`latlab loadtest --text` with real Locust against the real server: sentences of the asked length in tokens
reach a text deployment (its tokenization histogram counts them), JSON and binary; --text refuses a
deployment that takes token ids, in one line, before any load is sent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import requests

from latlab.common import procs
from latlab.loadtest.results import read_results
from tests.conftest import build_tiny_model
from tests.text_models import TOKENIZER, token_model

pytestmark = pytest.mark.e2e
CLI = [sys.executable, "-m", "latlab.cli"]
LABELS = 'deployment="text",model="toy",provider="cpu"'


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("text-load")
    port = procs.free_port()
    config = folder / "server.toml"
    config.write_text(f"""
[server]
port = {port}
[[deployments]]
name = "text"
model_path = "{token_model(folder / "toy" / "model.onnx")}"
[deployments.batcher]
max_batch_size = 8
max_queue_delay_ms = 2
[deployments.tokenizer]
file = "{TOKENIZER}"
max_length = 64
[[deployments]]
name = "tiny"
model_path = "{build_tiny_model(folder / "tiny" / "model.onnx")}"
""")
    process = procs.start([*CLI, "serve", "--config", str(config)], log_path=folder / "server.log")
    url = f"http://127.0.0.1:{port}"
    try:
        procs.wait_ready(f"{url}/v2/health/ready", process, timeout_s=60, log_path=folder / "server.log")
        yield url
    finally:
        procs.stop(process)


def preprocess(host: str, suffix: str) -> float:
    for line in requests.get(f"{host}/metrics", timeout=10).text.splitlines():
        if line.startswith(f"latlab_server_preprocess_duration_seconds_{suffix}{{{LABELS}}}"):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.parametrize("encoding", ["json", "binary"])
def test_text_load_reaches_the_tokenizer(host: str, tmp_path: Path, encoding: str) -> None:
    before = preprocess(host, "count")
    out = tmp_path / "run"
    result = subprocess.run(
        [
            *CLI,
            "loadtest",
            "--host",
            host,
            "--deployment",
            "text",
            "--text",
            "--seq-len",
            "12",
            "--seq-len-max",
            "40",
            "--rates",
            "30",
            "--step-seconds",
            "1.5",
            "--warmup-seconds",
            "0.5",
            "--max-windows",
            "3",
            "--out",
            str(out),
            *(["--binary"] if encoding == "binary" else []),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (doc,) = read_results(out / "results.json")
    assert doc.payload["text"] is True and doc.payload["encoding"] == encoding
    assert doc.payload["seq_len"] == 12 and doc.payload["seq_len_max"] == 40
    (step,) = doc.deployments[0].steps
    assert step.ok > 0 and not step.errors, step
    assert preprocess(host, "count") - before >= step.ok  # every answered request was tokenized


def test_text_against_a_token_deployment_is_one_readable_line(host: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [
            *CLI,
            "loadtest",
            "--host",
            host,
            "--deployment",
            "tiny",
            "--text",
            "--rates",
            "10",
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "deployment 'tiny'" in result.stderr and "takes no text" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_plain_locust_with_the_shipped_locustfile_sends_sentences(host: str, tmp_path: Path) -> None:
    """`locust -f loadtest/locustfile.py --latlab-text ...` on its own, headless, for a few seconds."""
    before = preprocess(host, "count")
    locustfile = Path(__file__).resolve().parents[2] / "loadtest" / "locustfile.py"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "locust",
            "-f",
            str(locustfile),
            "--headless",
            "--users",
            "1",
            "--spawn-rate",
            "1",
            "--run-time",
            "3s",
            "--host",
            host,
            "--latlab-deployment",
            "text",
            "--latlab-text",
            "--latlab-rate",
            "20",
            "--latlab-seq-len",
            "10",
            "--latlab-binary",
            "--only-summary",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert preprocess(host, "count") - before >= 20  # ~60 sentences in 3 s at 20/s, all tokenized


def text_run(host: str, out: Path, *options: str) -> tuple[subprocess.CompletedProcess, object]:
    result = subprocess.run(
        [*CLI, "loadtest", "--host", host, "--deployment", "text", "--text", "--rates", "200"]
        + ["--step-seconds", "2", "--warmup-seconds", "0.5", "--max-windows", "3", "--calibrate-seconds", "0"]
        + ["--out", str(out), *options],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (doc,) = read_results(out / "results.json")
    return result, doc


def test_sentences_of_drawn_lengths_are_capped_at_max_length_said_and_padded_in_batches(
    host: str, tmp_path: Path
) -> None:
    """Log-normal token counts past the deployment's max_length (64): the run says how many are sent at 64, and
    the server's batches pad their shorter sentences (its padding counters, read into the step); sentences of
    one length, the same server and rate, are padded not at all."""
    result, doc = text_run(host, tmp_path / "drawn", "--dim", "seq=lognormal:16:160")
    assert doc.payload["sizes"] == "lognormal:16:160"
    assert "of the sizes lognormal:16:160 are above its maximum of 64 tokens" in result.stdout
    (step,) = doc.deployments[0].steps
    assert step.ok > 0 and not step.errors, step
    assert step.server["padded_position_share"] > 0
    _, fixed = text_run(host, tmp_path / "fixed", "--seq-len", "16")
    assert fixed.deployments[0].steps[0].server["padded_position_share"] == 0  # none padded
