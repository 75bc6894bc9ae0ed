"""`latlab tune` end to end on the user's own ONNX file: real servers (one per round), real SLO searches, the best
configuration printed as a block that loads as a serving config, every process stopped; and its bad input."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
import requests

from latlab import cli
from latlab.common import procs
from latlab.lab.children import start_server
from latlab.lab.plan import PLANS
from latlab.server.config import load_config, save_config
from tests.e2e.test_lab_user import scorer

pytestmark = pytest.mark.e2e


@pytest.fixture
def short_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Probes of short steps: a test of the path, not a measurement."""
    monkeypatch.setitem(PLANS, "quick", replace(PLANS["quick"], step_seconds=0.5, warmup_seconds=0.3, max_windows=3))


def test_tune_an_onnx_file_prints_a_config_block_that_loads(tmp_path: Path, short_probes: None, capsys) -> None:
    model = scorer(tmp_path / "scorer.onnx")
    out = tmp_path / "tune"
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    status = cli.main(
        ["tune", "--onnx", str(model), "--slo", "20ms", "--search-minutes", "1.5", "--cores", "1"]
        + ["--models-dir", str(tmp_path / "models"), "--out", str(out)]
    )
    printed = capsys.readouterr().out
    assert status == 0, printed
    assert not {p.pid for p in psutil.Process().children(recursive=True)} - before, "tune left processes running"
    record = json.loads((out / "tune.json").read_text())
    assert record["model"] == "scorer" and record["provider"] == "cpu" and record["slo_p99_s"] == 0.02
    tried = record["tried"]
    assert tried and tried[0]["round"] == 0 and all(t["rate"] is None or t["rate"] > 0 for t in tried)
    start = tried[0]["candidate"]  # where the lab's search starts: the plan's batching for a fast model
    assert (start["max_batch_size"], start["max_queue_delay_ms"]) == (64, 2.0)
    assert record["stopped"].startswith(("the budget", "a top"))
    side_by_side = {t["round"] for t in record["confirmed"]}  # the finalists' rounds follow the climb's
    assert len(record["rounds"]) == len({t["round"] for t in tried}) + len(side_by_side)
    configurations = record["configurations"]  # each once, best first: the mean of its probes
    assert len(configurations) == len({json.dumps(t["candidate"], sort_keys=True) for t in tried})
    # the best few measured again side by side, finer, in the part of the budget kept for them; they decide
    finalists = [c for c in configurations if c["confirmed"] is not None]
    assert record["confirmed"] and len(finalists) >= 2 and configurations[: len(finalists)] == finalists
    assert record["rounds"][-1]["resolution"] < record["rounds"][0]["resolution"]
    best = configurations[0]
    assert best["confirmed"] == max(c["confirmed"] for c in finalists)
    assert f"best: {best['label']}, {best['confirmed']:.0f} req/s side by side" in printed
    block = printed[printed.index("[[deployments]]") :]
    assert block == (out / "best.toml").read_text() + "\n"
    (served,) = load_config(out / "best.toml").deployments
    assert served.name == "scorer-cpu" and served.model_path == model.resolve()
    assert served.batcher.max_batch_size == best["candidate"]["max_batch_size"]
    assert served.cpu.intra_op_threads * served.batcher.instances == 1  # --cores 1


@pytest.mark.parametrize(
    "args, says",
    [
        ([], "name one model"),
        (["ffn", "--onnx", "x.onnx"], "name one model"),
        (["ffn", "--provider", "tpu"], "--provider 'tpu'"),
        (["ffn", "--slo", "fast"], "--slo"),
        (["ffn", "--search-minutes", "0"], "--search-minutes must be positive"),
        (["resnet"], "MODEL: resnet not in this plan"),
    ],
)
def test_tune_refuses_bad_input_in_one_line(tmp_path: Path, capsys, args: list[str], says: str) -> None:
    status = cli.main(["tune", *args, "--models-dir", str(tmp_path / "models"), "--out", str(tmp_path / "t")])
    err = capsys.readouterr().err
    assert status == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "t").exists() and not (tmp_path / "models").exists()


def test_tune_a_deployment_of_a_config_starts_at_its_settings_and_keeps_the_rest(
    tmp_path: Path, short_probes: None, capsys
) -> None:
    model = scorer(tmp_path / "scorer.onnx")
    config = tmp_path / "serving.toml"
    config.write_text(
        '[[deployments]]\nname = "scoring"\nmodel_path = "scorer.onnx"\nprovider = "cpu"\n'
        "[deployments.batcher]\nmax_batch_size = 24\nmax_queue_delay_ms = 1.0\nmax_queue_size = 100\n"
        "[deployments.cpu]\nintra_op_threads = 1\n"
    )
    out = tmp_path / "tune"
    status = cli.main(
        ["tune", "--config", str(config), "--deployment", "scoring", "--slo", "20ms", "--search-minutes", "0.2"]
        + ["--cores", "1", "--models-dir", str(tmp_path / "models"), "--out", str(out)]
    )
    printed = capsys.readouterr().out
    assert status == 0, printed
    first = json.loads((out / "tune.json").read_text())["tried"][0]
    assert first["round"] == 0 and first["candidate"]["max_batch_size"] == 24
    assert first["candidate"]["max_queue_delay_ms"] == 1.0
    (served,) = load_config(out / "best.toml").deployments
    assert served.name == "scoring" and served.model_path == model.resolve()
    assert served.batcher.max_queue_size == 100  # a setting it does not search is kept


def test_tune_a_deployment_a_running_server_serves_reads_its_settings_and_leaves_it_serving(
    tmp_path: Path, short_probes: None, capsys
) -> None:
    """--server: the model file, provider and settings come from the running server's /config; tune measures on
    servers of its own, and the running one still answers afterwards."""
    model = scorer(tmp_path / "scorer.onnx")
    port = procs.free_port()
    config = save_config(
        {
            "server": {"port": port},
            "deployments": [
                {
                    "name": "scoring",
                    "model_path": model,
                    "batcher": {"max_batch_size": 12, "max_queue_delay_ms": 0.5, "max_queue_size": 77},
                    "cpu": {"intra_op_threads": 1},
                }
            ],
        },
        tmp_path / "serving.toml",
    )
    server, _ = start_server(config, port, tmp_path / "server.log")
    try:
        out = tmp_path / "tune"
        status = cli.main(
            ["tune", "--server", f"http://127.0.0.1:{port}", "--deployment", "scoring", "--slo", "20ms"]
            + ["--search-minutes", "0.2", "--cores", "1", "--models-dir", str(tmp_path / "models"), "--out", str(out)]
        )
        printed = capsys.readouterr().out
        assert status == 0, printed
        first = json.loads((out / "tune.json").read_text())["tried"][0]
        assert first["round"] == 0 and first["candidate"]["max_batch_size"] == 12
        assert first["candidate"]["max_queue_delay_ms"] == 0.5
        (served,) = load_config(out / "best.toml").deployments
        assert served.name == "scoring" and served.model_path == model.resolve()
        assert served.batcher.max_queue_size == 77
        body = {"inputs": [{"name": "x", "shape": [1, 6], "datatype": "FP32", "data": [0.5] * 6}]}
        answer = requests.post(f"http://127.0.0.1:{port}/v2/models/scoring/infer", json=body, timeout=30)
        assert answer.status_code == 200 and server.poll() is None
        status = cli.main(["tune", "--server", f"http://127.0.0.1:{port}", "--deployment", "nope"])
        err = capsys.readouterr().err
        assert status == 2 and "answered 404" in err and "'nope'" in err and len(err.strip().splitlines()) == 1
    finally:
        procs.stop(server)


@pytest.mark.parametrize(
    "args, says",
    [
        (["--server", "http://127.0.0.1:1"], "--server needs --deployment"),
        (["--server", "127.0.0.1:8000", "--deployment", "d"], "give the server's address"),
        (["--server", "http://127.0.0.1:1", "--config", "c.toml", "--deployment", "d"], "two ways"),
    ],
)
def test_tune_server_bad_input_in_one_line(tmp_path: Path, capsys, args: list[str], says: str) -> None:
    status = cli.main(["tune", *args, "--models-dir", str(tmp_path / "models"), "--out", str(tmp_path / "t")])
    err = capsys.readouterr().err
    assert status == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "t").exists()
