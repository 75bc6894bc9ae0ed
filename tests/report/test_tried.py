"""The report's "Configurations tried" section, from a run folder's search records: every configuration with its
variant's accuracy, screened and side-by-side rates, the best marked with its full sweep's rates, the variants
refused with their figure; a search's probe rounds never become curves of the run."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from latlab.loadtest.results import Run, read_results, write_results
from latlab.report.write import write_report
from latlab.tune.search import Candidate

from .report_fixtures import CPU_NAME, curve, step

SLOS = [0.010, 0.025, 0.050, 0.100]


def tried(candidate: Candidate, rate: float | None, confirmed: float | None = None) -> dict:
    return {
        "candidate": asdict(candidate),
        "label": candidate.label(),
        "rate": rate,
        "confirmed": confirmed,
        "round": 0,
        "note": "",
    }


def searched_run(tmp_path: Path) -> Path:
    """A CPU run of minilm with a search: three configurations tried, the best swept as minilm-tuned (INT8); an
    INT8 of another model refused."""
    env = {"name": CPU_NAME, "cpu": "SYNTHETIC CPU", "cores": 2, "cpu_threads": 1}
    accuracy = {"status": "checked", "label": "min embedding cosine similarity to FP32", "figure": 0.988,
                "min_accuracy": 0.98}  # fmt: skip
    plain = curve("minilm-b1", "cpu", 1, [step(20, 30), step(40, 120, achieved=35)], env, saturated=True)
    tuned = curve(
        "minilm-tuned",
        "cpu",
        16,
        [step(20, 20), step(60, 40), step(120, 200, achieved=90)],
        env,
        saturated=True,
        variant={"name": "int8", "precision": "int8 (dynamic)", "of": "minilm", "accuracy": accuracy},
    )
    run = tmp_path / "run"
    write_results(run / "minilm" / "results.json", Run(run_id="run", machine=env, deployments=[plain, tuned]))
    best = Candidate("int8", 16, 2.0, False, 1, 1)
    search = run / "search" / "minilm-cpu"
    search.mkdir(parents=True)
    probe = curve("minilm-tune-0", "cpu", 16, [step(100, 30)], env)  # a probe round's results: not a curve
    write_results(search / "round-0" / "results.json", Run(run_id="probe", machine=env, deployments=[probe]))
    record = {
        "model": "minilm",
        "provider": "cpu",
        "slo_p99_s": 0.05,
        "seconds": 120.0,
        "stopped": "a top: no neighbour held 5% more",
        "configurations": [
            tried(best, 70.0, 74.0),
            tried(Candidate("fp32", 16, 2.0, False, 1, 1), 40.0, 41.0),
            tried(Candidate("fp32", 1, 0.0, False, 1, 1), 25.0),
        ],
        "swept_as": "minilm-tuned",
    }
    (search / "tune.json").write_text(json.dumps(record))
    notes = {
        "minilm": {"int8": {"status": "made", "accuracy": accuracy}},
        "cnn": {"int8": {"status": "refused", "why": "the int8 variant of cnn refused: top-1 agreement 0.9 < 0.95"}},
    }
    (run / "search" / "variants.json").write_text(json.dumps(notes))
    return run


def test_the_section_lists_every_configuration_tried_and_marks_the_best(tmp_path: Path) -> None:
    run = searched_run(tmp_path)
    assert [d.name for r in read_results(run) for d in r.deployments] == ["minilm-b1", "minilm-tuned"]
    page = write_report(run, SLOS).read_text()
    section = page[page.index("<h2>Configurations tried</h2>") :]
    section = section[: section.index("<h3>minilm: latency against throughput</h3>")]
    rows = section.split("<tr>")[2:]
    assert len(rows) == 3
    assert rows[0].startswith("<td>★ int8, batch ≤ 16, wait ≤ 2 ms, 1 × 1 thread</td>")
    assert "min embedding cosine similarity to FP32 0.9880 (at least 0.98)" in rows[0]
    assert "<td>70</td><td>74</td><td>probed, then side by side; swept in full as minilm-tuned</td>" in rows[0]
    assert "the export itself" in rows[1] and "<td>25</td><td>–</td><td>probed</td>" in rows[2]
    assert "minilm-tuned, swept in full: p99 ≤ 10 ms:" in section and "p99 ≤ 50 ms: 60" in section
    # the answer names the variant of the deployment it chooses, with its accuracy
    answer = page[page.index("<section id='answer'>") : page.index("</section>")]
    assert "INT8 (min embedding cosine similarity to FP32 0.988), batching ≤ 16" in answer


def test_a_refused_variant_is_said_with_its_figure(tmp_path: Path) -> None:
    run = searched_run(tmp_path)
    record = json.loads((run / "search" / "minilm-cpu" / "tune.json").read_text())
    (run / "search" / "cnn-cpu").mkdir()
    (run / "search" / "cnn-cpu" / "tune.json").write_text(json.dumps({**record, "model": "cnn", "swept_as": None}))
    page = write_report(run, SLOS).read_text()
    assert "<li>INT8 refused: the int8 variant of cnn refused: top-1 agreement 0.9 &lt; 0.95</li>" in page


def test_a_run_without_a_search_has_no_such_section(tmp_path: Path) -> None:
    run = searched_run(tmp_path)
    import shutil

    shutil.rmtree(run / "search")
    assert "Configurations tried" not in write_report(run, SLOS).read_text()
