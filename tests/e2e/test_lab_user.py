"""`latlab lab` on the user's own model, end to end to a report: ONNX files built here (not zoo models), one
loaded with real inputs from a sample file, one with a dynamic sequence axis sized with --dim."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import psutil
import pytest
from onnx import TensorProto, helper, numpy_helper

from latlab import cli
from latlab.lab.plan import PLANS
from latlab.loadtest.results import Run, read_results

pytestmark = pytest.mark.e2e
VOCAB, WIDTH, FEATURES = 128, 8, 6


def scorer(path: Path) -> Path:
    """y = x @ W with x FP32 [batch, 6]: a model of the user's, not of the zoo."""
    w = np.random.default_rng(3).standard_normal((FEATURES, 2)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["score"])],
        "scorer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", FEATURES])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["n", 2])],
        initializer=[numpy_helper.from_array(w, "W")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return path


def pooled_embedding(path: Path) -> Path:
    """Token ids INT64 [batch, seq] -> the mean of their embeddings [batch, 8]: a dynamic sequence axis."""
    table = np.random.default_rng(4).standard_normal((VOCAB, WIDTH)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["vectors"]),
        helper.make_node("ReduceMean", ["vectors"], ["pooled"], axes=[1], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "pooled",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", WIDTH])],
        initializer=[numpy_helper.from_array(table, "table")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return path


@pytest.fixture
def short_quick_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--quick` in fewer, shorter steps, with no raising past the listed rates: a test of the path, not a
    measurement."""
    monkeypatch.setitem(
        PLANS, "quick", replace(PLANS["quick"], step_seconds=0.5, warmup_seconds=0.3, max_windows=3, raise_cap=1.0)
    )


def run_lab(tmp_path: Path, *args: str) -> Path:
    """The CLI's `latlab lab --quick` with args on CPU at two low rates; the run folder it made. Checks that
    every process the lab started is gone."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    runs = tmp_path / "runs"
    status = cli.main(
        [
            "lab",
            "--quick",
            "--providers",
            "cpu",
            "--rates",
            "40,120",
            "--runs-dir",
            str(runs),
            "--models-dir",
            str(tmp_path / "models"),
            *args,
        ]
    )
    assert status == 0
    left = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert not left, f"lab left processes running: {left}"
    (run,) = runs.iterdir()
    return run


def verdict_of(report: Path, model: str) -> str:
    """The model's part of the report's first screen: its sentence and verdict table."""
    page = report.read_text()
    answer = page[page.index("<section id='answer'>") :]
    answer = answer[: answer.index("</section>")]
    assert f"<h2 class='model'>{model}</h2>" in answer
    return answer[answer.index(f"<h2 class='model'>{model}</h2>") :]


def check_results(run: Path, model: str, row_shape: list[int]) -> Run:
    (doc,) = read_results(run / model / "results.json")
    assert [d.name for d in doc.deployments] == [f"{model}-b1", f"{model}-batch"]
    for deployment in doc.deployments:
        assert deployment.steps and all(s.errors == 0 and s.ok > 0 for s in deployment.steps)
    sent = np.load(doc.payload["inputs"])  # what the generator sent lies in the run folder
    assert Path(doc.payload["inputs"]).parent == run / model
    assert [list(sent[n].shape[1:]) for n in sent.files] == [row_shape]
    return doc


def test_lab_on_an_onnx_file_with_real_inputs_from_a_sample_file(tmp_path: Path, short_quick_plan: None) -> None:
    model = scorer(tmp_path / "scorer.onnx")
    samples = tmp_path / "samples.npz"
    real = np.random.default_rng(5).uniform(0, 1, (10, FEATURES)).astype(np.float32)
    np.savez(samples, x=real)
    run = run_lab(tmp_path, "--onnx", str(model), "--inputs", str(samples), "--slo", "20ms,80ms", "--price", "cpu=0.20")
    check_results(run, "scorer", [FEATURES])
    np.testing.assert_array_equal(np.load(run / "scorer" / "inputs.npz")["x"], real)  # the user's rows, as given
    verdict = verdict_of(run / "report.html", "scorer")
    assert "p99 ≤ 20 ms" in verdict and "p99 ≤ 80 ms" in verdict and "p99 ≤ 10 ms" not in verdict
    assert "<table class='answer'>" in verdict
    assert "cpu $0.20/h (as given with --price)" in (run / "report.html").read_text()


def test_lab_on_an_onnx_file_with_a_dynamic_sequence_axis_given_by_dim(tmp_path: Path, short_quick_plan: None) -> None:
    model = pooled_embedding(tmp_path / "pooled.onnx")
    run = run_lab(tmp_path, "--onnx", str(model), "--dim", "seq=24", "--name", "pooled-24")
    check_results(run, "pooled-24", [24])
    verdict = verdict_of(run / "report.html", "pooled-24")
    assert "<table class='answer'>" in verdict and "pooled-24: at p99 ≤ 10 ms" in verdict


def test_lab_searches_configurations_and_sweeps_the_best_in_place_of_the_batching_on_one(
    tmp_path: Path, short_quick_plan: None
) -> None:
    """--search-minutes: the search starts at the plan's batching-on settings and its best is served and swept in
    full as <model>-tuned in their place, beside batching off; its probes stay out of the run's curves; the report
    lists every configuration tried, the best marked, and why this model has no INT8 variant."""
    import json

    model = scorer(tmp_path / "scorer.onnx")
    # with 2 minutes a loaded machine's slow first probes left no room for a second configuration; with 4 the
    # climb and its side-by-side confirmation ended within the budget on an idle 2-core machine
    run = run_lab(tmp_path, "--onnx", str(model), "--slo", "20ms,80ms", "--search-minutes", "4", "--cpu-threads", "1")
    (doc,) = read_results(run)  # the search's probe rounds are not curves of the run
    assert [d.name for d in doc.deployments] == ["scorer-b1", "scorer-tuned"]
    record = json.loads((run / "search" / "scorer-cpu" / "tune.json").read_text())
    assert record["swept_as"] == "scorer-tuned" and record["slo_p99_s"] == 0.08  # the middle of the two SLOs
    best = record["configurations"][0]["candidate"]
    first = record["tried"][0]["candidate"]  # the plan's batching for a fast model, where the climb began
    assert (first["max_batch_size"], first["max_queue_delay_ms"]) == (64, 2.0)
    tuned = doc.deployments[1]
    assert tuned.batcher.max_batch_size == best["max_batch_size"]
    assert tuned.batcher.instances == best["instances"] and tuned.cpu.intra_op_threads == best["threads"]
    assert tuned.steps and all(s.errors == 0 for s in tuned.steps) and tuned.slo_brackets
    notes = json.loads((run / "search" / "variants.json").read_text())
    assert notes["scorer"]["int8"]["status"] == "not made" and "PyTorch source" in notes["scorer"]["int8"]["why"]
    page = (run / "report.html").read_text()
    tried = page[page.index("<h2>Configurations tried</h2>") : page.index("<h3>scorer: latency against throughput")]
    assert "scorer on cpu, ranked by p99 ≤ 80 ms" in tried
    assert len(record["configurations"]) >= 2 and record["confirmed"]  # a climb, then its finalists side by side
    table = tried[: tried.index("</table>")]
    assert table.count("<tr>") - 1 == len(record["configurations"]) and table.count("★ ") == 1
    assert "scorer-tuned, swept in full: p99 ≤ 20 ms:" in tried and "INT8 not made" in tried
    assert page.index("<h2>Configurations tried</h2>") < page.index("<h3>scorer: latency against throughput</h3>")


def test_lab_under_two_traffic_profiles_sets_the_bursty_one_beside_the_verdict(
    tmp_path: Path, short_quick_plan: None
) -> None:
    """--traffic poisson,gamma:3: each deployment swept under both, the first in the model's folder, the second
    beside it; the report judges under Poisson and gives the bursty one a section of its own."""
    model = scorer(tmp_path / "scorer.onnx")
    run = run_lab(tmp_path, "--onnx", str(model), "--traffic", "poisson,gamma:3", "--slo", "20ms")
    (first,) = read_results(run / "scorer" / "results.json")
    (bursty,) = read_results(run / "scorer" / "traffic-1" / "results.json")
    assert (first.arrivals, bursty.arrivals) == ("poisson", "gamma:3")
    assert [d.name for d in bursty.deployments] == [d.name for d in first.deployments]
    cvs = [s.arrival_cv for d in bursty.deployments for s in d.steps if s.arrival_cv is not None]
    poisson_cvs = [s.arrival_cv for d in first.deployments for s in d.steps if s.arrival_cv is not None]
    assert cvs and poisson_cvs and min(cvs) > max(poisson_cvs)  # the bursts reached the server as sent
    page = (run / "report.html").read_text()
    assert "<h2>scorer under your traffic</h2>" in page and "Under gamma:3 (CV " in page
    assert (run / "traffic-scorer.png").exists()
