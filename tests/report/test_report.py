"""latlab.report.write and results: max rate under an SLO, the verdict, the self-contained HTML report."""

from __future__ import annotations

import base64
import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest

from latlab import cli
from latlab.common.user_input import UserError, parse_rates, parse_slos
from latlab.report import write as report_module
from latlab.loadtest.search import NEVER
from latlab.report.write import REPORT_FILE, write_report
from latlab.report.findings import findings_of
from latlab.report.rates import max_rate_under
from latlab.report.verdict import verdict
from latlab.common.settings import BatcherSettings, CpuOptions
from latlab.loadtest.results import RESULTS_FILE, SCHEMA, Curve, Run, Step, read_results, write_results

from .report_fixtures import bare_step

PNG_HEADER = b"\x89PNG\r\n\x1a\n"


def step(target: float, achieved: float, p99: float | None, errors: int = 0, avg_batch: float | None = None) -> Step:
    """One step with the fields sweep.py writes; p50/p90/max derived from p99 so curves stay ordered."""
    empty = p99 is None or (isinstance(p99, float) and math.isnan(p99))
    sent = 0 if empty else int(achieved * 10)
    return Step(
        target=target,
        target_rps=target,
        offered_rps=target,
        achieved_rps=achieved,
        sent=sent,
        ok=sent - errors,
        errors=errors,
        dropped=0,
        late=0,
        incomplete=0,
        p50_s=None if empty else p99 / 4,
        p90_s=None if empty else p99 / 2,
        p99_s=p99,
        max_s=None if empty else p99 * 1.5,
        mean_s=None if empty else p99 / 3,
        duration_s=10.0,
        avg_batch_size=avg_batch,
        generator_cpu_percent=12.5,
        generator_bound=False,
    )


B1_STEPS = [step(100, 99, 0.010), step(200, 198, 0.020), step(400, 300, 0.200)]
BATCH_STEPS = [
    step(100, 100, 0.008, avg_batch=1.2),
    step(200, 199, 0.012, avg_batch=2.5),
    step(400, 398, 0.022, avg_batch=5.0),
    step(800, 790, 0.030, errors=3, avg_batch=9.0),  # meets 50 ms but has errors
    step(1600, 0, float("nan")),
]  # an empty window


def deployment(name: str, batch_size: int, delay_ms: float, steps: list[Step]) -> Curve:
    return Curve(
        name=name,
        model="ffn",
        provider="cpu",
        batcher=BatcherSettings.partial(max_batch_size=batch_size, max_queue_delay_ms=delay_ms),
        steps=steps,
        stop_reason="all rates done",
    )


B1 = deployment("ffn-b1", 1, 0.0, B1_STEPS)
BATCHED = deployment("ffn-batch", 64, 2.0, BATCH_STEPS)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run folder holding one results.json with two deployments of the model 'ffn'."""
    run = tmp_path / "20250101-120000"
    write_results(
        run / RESULTS_FILE,
        Run(
            run_id=run.name,
            created="2025-01-01T12:00:00+0000",
            host="http://127.0.0.1:8000",
            machine={
                "hostname": "labbox",
                "name": "labbox",
                "cpu": "Test CPU @ 3GHz",
                "cores": 8,
                "memory_gib": 31.3,
            },
            deployments=[B1, BATCHED],
        ),
    )
    return run


# --- max_rate_under and verdict --------------------------------------------------------------------


def test_max_rate_under_picks_highest_achieved_rate_meeting_slo() -> None:
    assert max_rate_under(B1_STEPS, 0.025).achieved_rps == 198
    assert max_rate_under(BATCH_STEPS, 0.025).achieved_rps == 398
    assert max_rate_under(BATCH_STEPS, 0.010).achieved_rps == 100


def test_max_rate_under_ignores_steps_with_errors() -> None:
    assert max_rate_under(BATCH_STEPS, 0.050).achieved_rps == 398  # not the 790 step with 3 errors


def test_max_rate_under_skips_empty_windows_and_none_when_nothing_meets() -> None:
    assert max_rate_under(B1_STEPS, 0.005) is None
    assert max_rate_under([step(100, 100, None), step(200, 200, float("nan"))], 1.0) is None
    assert max_rate_under([], 1.0) is None


def test_verdict_names_better_deployment_and_ratio() -> None:
    sentence = verdict(findings_of("ffn", [B1, BATCHED], [0.025]), 0.025)
    assert sentence.startswith("ffn at p99 ≤ 25 ms: ffn-batch (cpu, batch ≤ 64, wait ≤ 2 ms) sustains 398 req/s")
    assert "ffn-b1 (cpu, batching off) 198 req/s (2.0× less)" in sentence


def test_verdict_says_which_deployment_never_meets_slo() -> None:
    sentence = verdict(findings_of("ffn", [B1, BATCHED], [0.009]), 0.009)
    assert "ffn-batch" in sentence.split(":")[1] and "sustains 100 req/s" in sentence
    assert "ffn-b1 (cpu, batching off) does not meet it at the rates measured (not met at ≥ 100)" in sentence
    assert "never" not in sentence  # no one-at-a-time evidence in these results: "never" would be a guess


def test_verdict_says_never_only_with_the_single_request_evidence() -> None:
    single = {"requests": 300, "errors": 0, "p50_s": 0.0095, "p99_s": 0.0121, "max_s": 0.013, "too_few_samples": False}
    bracket = {
        "slo_p99_s": 0.009,
        "met_rps": None,
        "broke_rps": 100.0,
        "width": None,
        "resolution": 0.1,
        "floor_rps": 5.0,
        "meaning": NEVER,
    }
    sentence = verdict(
        findings_of("ffn", [replace(B1, single_request=single, slo_brackets=[bracket]), BATCHED], [0.009]), 0.009
    )
    assert "ffn-b1 (cpu, batching off) never meets it (p99 12 ms one request at a time)" in sentence


def test_verdict_when_no_deployment_meets_slo() -> None:
    assert (
        verdict(findings_of("ffn", [B1, BATCHED], [0.001]), 0.001)
        == "ffn: no deployment met p99 ≤ 1 ms at any measured load."
    )


# --- results file ----------------------------------------------------------------------------------


def test_results_round_trip_writes_null_for_nan(run_dir: Path) -> None:
    (run,) = read_results(run_dir)
    assert json.loads((run_dir / RESULTS_FILE).read_text())["schema"] == SCHEMA
    assert run.path == str(run_dir / RESULTS_FILE)
    empty_step = run.deployments[1].steps[-1]
    assert empty_step.p99_s is None
    assert "NaN" not in (run_dir / RESULTS_FILE).read_text()
    assert run.deployments[0].steps == B1_STEPS


def test_read_results_rejects_wrong_schema(tmp_path: Path) -> None:
    (tmp_path / RESULTS_FILE).write_text(json.dumps({"schema": "other/9", "deployments": []}))
    with pytest.raises(ValueError, match="not a latlab results file"):
        read_results(tmp_path)


def test_read_results_on_empty_folder_raises_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_results(tmp_path)


# --- the HTML report -------------------------------------------------------------------------------


def test_report_is_self_contained_with_embedded_curve(run_dir: Path) -> None:
    path = write_report(run_dir, [0.025, 0.050])
    assert path == run_dir / REPORT_FILE
    page = path.read_text()
    assert "data:image/png;base64," in page
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.IGNORECASE)
    png = (run_dir / "curve-ffn.png").read_bytes()
    assert png.startswith(PNG_HEADER)
    assert base64.b64encode(png).decode() in page  # the page embeds the very PNG it wrote


def test_report_contains_table_values_and_verdicts(run_dir: Path) -> None:
    page = write_report(run_dir, [0.009, 0.025]).read_text()
    assert "max req/s at p99 ≤ 9 ms" in page and "max req/s at p99 ≤ 25 ms" in page
    summary_row = re.compile(r"<tr><td>([^<]+)</td><td>[^<]+</td>((?:<td>[^<]*</td>)+)</tr>")
    rows = {m.group(1): m.group(2) for m in summary_row.finditer(page)}
    assert rows["ffn-b1 (cpu, batching off)"] == "<td>not met at ≥ 100</td><td>198</td>"
    assert rows["ffn-batch (cpu, batch ≤ 64, wait ≤ 2 ms)"] == "<td>100</td><td>398</td>"
    assert "sustains 398 req/s" in page and "(2.0× less)" in page
    assert "labbox" in page and "Test CPU @ 3GHz" in page


def test_report_step_table_handles_empty_window(run_dir: Path) -> None:
    page = write_report(run_dir, [0.025]).read_text()
    # The 1600 req/s step had no latencies: its cells read "–", its rates are still shown.
    empty_row = "".join(f"<td>{cell}</td>" for cell in ("1600", "0", "–", "–", "–", "–", "–", "0", "0", "–"))
    assert f"<tr>{empty_row}" in page
    assert "<td>22.00</td>" in page  # the 400 req/s step's p99 in ms
    assert "<td>5.0</td>" in page  # its average batch


def test_cli_report(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", str(run_dir), "--slo", "25ms,50ms"]) == 0
    assert str(run_dir / REPORT_FILE) in capsys.readouterr().out
    page = (run_dir / REPORT_FILE).read_text()
    assert "max req/s at p99 ≤ 25 ms" in page and "max req/s at p99 ≤ 50 ms" in page


def test_cli_report_on_empty_folder_is_a_user_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", str(tmp_path)]) == 2
    assert "no results" in capsys.readouterr().err


# --- CLI parsers -----------------------------------------------------------------------------------


def test_parse_slos_reads_ms_seconds_and_bare_numbers() -> None:
    assert parse_slos("25ms,0.1s,50") == pytest.approx([0.025, 0.1, 0.05])
    assert parse_slos(" 25MS , 2S ") == pytest.approx([0.025, 2.0])


def test_parse_slos_rejects_garbage() -> None:
    with pytest.raises(UserError, match="fast"):
        parse_slos("25ms,fast")


def test_parse_rates_reads_positive_numbers() -> None:
    assert parse_rates("100, 200,400,") == [100.0, 200.0, 400.0]


@pytest.mark.parametrize("text", ["", ",", "100,abc", "0", "100,-5"])
def test_parse_rates_errors(text: str) -> None:
    with pytest.raises(UserError, match="--rates"):
        parse_rates(text)


def test_verdict_survives_a_zero_throughput_step_that_meets_the_slo():
    curves = [
        Curve(name="a", steps=[bare_step(100.0, 0.01)]),
        Curve(name="b", steps=[bare_step(0.0, 0.002)]),
    ]
    sentence = verdict(findings_of("m", curves, [0.025]), 0.025)
    # no provider recorded (another server's deployment, no --provider): said as such, never "?"
    assert "a (" in sentence and "b (provider unknown, batcher settings unknown) does not meet it" in sentence


@pytest.mark.parametrize("text", ["nan", "inf", "-5", "0"])
def test_parse_rates_refuses_non_positive_or_non_finite(text):
    with pytest.raises(UserError):
        parse_rates(text)


@pytest.mark.parametrize("text", ["", "-5ms", "nan", "0s", "fast"])
def test_parse_slos_refuses_empty_negative_or_unreadable(text):
    with pytest.raises(UserError):
        parse_slos(text)


# --- merged runs, costs, bench, prediction, reference ----------------------------------------------


def gpu_run(tmp_path: Path) -> Path:
    """A second machine's run: the same model on CUDA, with a bench file holding batch sweeps and batch-1 sizes."""
    run = tmp_path / "gpu-run"
    gpu = replace(
        deployment(
            "ffn-gpu",
            64,
            2.0,
            [step(1000, 1000, 0.004), step(4000, 3990, 0.008), step(8000, 7900, 0.022), step(16000, 9000, 0.300)],
        ),
        provider="cuda",
        environment={"ort_version": "9.9.9", "gpu": "Test GPU 80GB"},
    )
    bound = replace(step(100, 100, 0.002), generator_bound=True)
    gpu.steps = [bound, *gpu.steps]
    write_results(
        run / "results.json",
        Run(
            run_id="gpu-run",
            machine={"hostname": "gpubox", "name": "gpubox", "cpu": "Big CPU", "cores": 32},
            deployments=[gpu],
        ),
    )

    def timing(median_ms: float) -> dict:  # plot_bench draws min-max bars
        return {
            "median_s": median_ms * 1e-3,
            "min_s": 0.9 * median_ms * 1e-3,
            "max_s": 1.1 * median_ms * 1e-3,
            "repeats": 5,
        }

    points = [
        {"backend": b, "batch_size": n, "d_model": 128, "n_layers": 128, "params": 2_100_000, **timing(a + k * n)}
        for b, a, k in (("ort-cpu", 0.3, 0.02), ("ort-cuda", 0.5, 0.001))
        for n in (1, 8, 64)
    ]
    points += [
        {"backend": b, "batch_size": 1, "params": p, "d_model": d, "n_layers": 128, **timing(t)}
        for p, d, c, g in ((1000, 8, 0.05, 0.4), (10_000_000, 256, 5.0, 0.6))
        for b, t in (("ort-cpu", c), ("ort-cuda", g))
    ]
    (run / "bench.json").write_text(
        json.dumps(
            {
                "schema": "latlab.bench/1",
                "machine": {"hostname": "gpubox", "name": "gpubox", "gpu": "Test GPU 80GB", "ort_version": "9.9.9"},
                "experiments": [
                    {
                        "name": "batch_size",
                        "model": "ffn",
                        "vary": "batch_size",
                        "points": points[:6],
                        "fixed": {"d_model": 128, "n_layers": 128},
                        "skipped": [],
                    },
                    {
                        "name": "d_model",
                        "model": "ffn",
                        "vary": "d_model",
                        "points": points[6:],
                        "fixed": {"batch_size": 1, "n_layers": 128},
                        "skipped": [],
                    },
                ],
            }
        )
    )
    return run


def test_report_merges_two_machines_with_costs_verdict_bench_and_prediction(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "merged"
    page = write_report([run_dir, gpu_run(tmp_path)], [0.025], prices={"cpu": 0.2, "cuda": 2.0}, out=out).read_text()
    assert (out / REPORT_FILE).is_file() and (out / "curve-ffn.png").read_bytes().startswith(PNG_HEADER)
    assert "<td>20250101-120000 on labbox</td>" in page and "<td>gpu-run on gpubox</td>" in page
    assert "Test GPU 80GB" in page and "ort_version: 9.9.9" in page and "Big CPU" in page
    assert (
        "below 398 req/s the CPU meets it at lower cost ($0.20/h against $2.00/h); above it only the GPU does, "
        "up to 7900 req/s, at 19.8× the throughput"
    ) in page
    assert ("<td>p99 ≤ 25 ms</td><td>cuda</td><td>ffn-gpu (cuda, batch ≤ 64, wait ≤ 2 ms)</td><td>gpubox</td>") in page
    assert f"<td>${2.0 / (7900 * 3600) * 1e6:.3f}</td>" in page and "as given with --price" in page
    assert "from about 10M parameters the GPU wins at batch 1" in page
    assert (out / "cost-ffn.png").read_bytes().startswith(PNG_HEADER)  # the cost picture, CPU and GPU priced
    assert page.count("data:image/png;base64,") == 4 and len(list(out.glob("bench-gpubox-*.png"))) == 2
    prediction = re.search(r"<table class='prediction'>.*?</table>", page).group(0)
    assert (
        "ffn-gpu (cuda, batch ≤ 64, wait ≤ 2 ms)</td><td>gpubox</td><td>p99 ≤ 25 ms</td>"
        "<td>0.500 + (0.0010 + c 0.000)·n (bench d_model=128, n_layers=128)</td>"
    ) in prediction
    assert "No prediction for ffn-b1 (cpu, batching off) on labbox" in page  # no bench from labbox
    assert "bench ran ORT with threads" not in page  # a CUDA fit: CPU threads do not matter
    assert "Generator-bound steps" in page and "ffn-gpu on gpubox at 100 req/s offered" in page
    assert "No GPU measurements" not in page and "How the predictions are made" in page


def test_report_prediction_error_is_relative_to_measurement(tmp_path: Path) -> None:
    run = gpu_run(tmp_path)
    page = write_report(run, [0.025]).read_text()
    row = re.search(
        r"<td>p99 ≤ 25 ms</td><td>0\.500 \+ \(0\.0010 \+ c 0\.000\)·n[^<]*</td>"
        r"<td>(\d+)</td><td>(\d+)</td><td>([^<]+)</td>",
        page,
    )
    predicted, measured, error = float(row.group(1)), float(row.group(2)), row.group(3)
    assert measured == 7900 and error == f"{(predicted - measured) / measured:+.0%}"


def test_prediction_flags_a_bench_with_other_cpu_threads_than_the_server(tmp_path: Path) -> None:
    run = tmp_path / "cpu-run"
    served = replace(deployment("ffn-b1", 1, 0.0, B1_STEPS), cpu=CpuOptions.partial(intra_op_threads=1))
    write_results(
        run / "results.json",
        Run(run_id="cpu-run", machine={"hostname": "labbox", "name": "labbox"}, deployments=[served]),
    )
    points = [
        {"backend": "ort-cpu", "batch_size": n, "median_s": n * 1e-4, "min_s": n * 1e-4, "max_s": n * 1e-4}
        for n in (1, 2)
    ]
    (run / "bench.json").write_text(
        json.dumps(
            {
                "schema": "latlab.bench/1",
                "machine": {"hostname": "labbox", "name": "labbox", "threads": 0},
                "experiments": [
                    {"name": "batch_size", "model": "ffn", "vary": "batch_size", "fixed": {}, "points": points}
                ],
            }
        )
    )
    page = write_report(run, [0.025]).read_text()
    assert "bench ran ORT with threads=0, the server with intra_op_threads=1 (0 = every core)" in page


def test_report_cpu_only_says_no_gpu_measurements_and_example_prices(run_dir: Path) -> None:
    page = write_report(run_dir, [0.025]).read_text()
    assert "No GPU measurements</strong>: every figure in this report comes from the CPU of labbox" in page
    assert "No GPU measurements for ffn" in page and "example prices" in page
    assert "No bench*.json in the input folders" in page and "No prediction for ffn-batch" in page


def test_report_with_reference_merges_committed_data_marked_as_such(run_dir: Path, tmp_path: Path) -> None:
    reference = tmp_path / "reference"
    gpu = gpu_run(tmp_path)
    reference.mkdir()
    for name in ("results.json", "bench.json"):
        (reference / name.replace(".json", "-gpubox.json")).write_text((gpu / name).read_text())
    page = write_report(run_dir, [0.025], with_reference=True, reference_dir=reference).read_text()
    assert "run gpu-run (reference data)" in page and "bench (reference data)" in page and "only the GPU does" in page
    page = write_report(run_dir, [0.025], reference_dir=reference).read_text()
    assert "only the GPU does" not in page and "add --with-reference" in page


def test_cli_report_merges_runs_with_prices_and_out(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "both"
    assert (
        cli.main(
            [
                "report",
                str(run_dir),
                str(gpu_run(tmp_path)),
                "--out",
                str(out),
                "--slo",
                "25ms",
                "--price",
                "cpu=0.2,cuda=2",
            ]
        )
        == 0
    )
    assert str(out / REPORT_FILE) in capsys.readouterr().out
    assert "$0.20/h against $2.00/h" in (out / REPORT_FILE).read_text()


@pytest.mark.parametrize("price", ["cpu", "cpu=abc", "cpu=-1", ""])
def test_cli_report_refuses_bad_prices(run_dir: Path, price: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", str(run_dir), "--price", price]) == 2
    assert "--price" in capsys.readouterr().err
    assert not (run_dir / REPORT_FILE).exists()


def test_cli_report_on_missing_folder_is_a_user_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", str(tmp_path / "nope")]) == 2
    assert "no such run folder" in capsys.readouterr().err


def test_cli_with_reference_merges_the_reference_folder(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = tmp_path / "reference"
    reference.mkdir()
    (reference / "results-gpubox.json").write_text((gpu_run(tmp_path) / "results.json").read_text())
    monkeypatch.setattr(report_module, "REFERENCE_DIR", reference)
    assert cli.main(["report", str(run_dir), "--slo", "25ms"]) == 0
    assert "gpubox" not in (run_dir / REPORT_FILE).read_text()
    assert cli.main(["report", str(run_dir), "--slo", "25ms", "--with-reference"]) == 0
    page = (run_dir / REPORT_FILE).read_text()
    assert "run gpu-run (reference data)" in page and "<td>gpu-run on gpubox</td>" in page


def test_cli_from_prometheus_takes_exactly_one_folder(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["report", str(run_dir), str(tmp_path), "--from-prometheus", "http://127.0.0.1:9"]) == 2
    assert "give exactly one RUN folder" in capsys.readouterr().err


def test_with_reference_shows_the_committed_h100_seed_bench_cpu_and_gpu_side_by_side(run_dir: Path) -> None:
    """The committed H100 bench (report/reference/h100/) reaches the report: all four seed experiments, each
    point's CPU and CUDA medians in one row with ORT's GPU speed-up, read from the unedited files."""
    reference = report_module.REFERENCE_DIR / "h100"
    docs = [
        json.loads((reference / name).read_text())
        for name in ("bench-seed003-h100.json", "bench-seed003-fixed-params-h100.json")
    ]
    assert {e["name"] for d in docs for e in d["experiments"]} == {"batch_size", "d_model", "n_layers", "fixed_params"}
    page = write_report(run_dir, [0.025], with_reference=True).read_text()
    last = next(p for p in docs[0]["experiments"][0]["points"] if p["batch_size"] == 2048 and p["backend"] == "ort-cpu")
    cuda = next(
        p for p in docs[0]["experiments"][0]["points"] if p["batch_size"] == 2048 and p["backend"] == "ort-cuda"
    )
    row = f"<td>2048</td><td>{last['params']}</td>"
    assert "NVIDIA H100 80GB HBM3 (reference data)" in page
    assert row in page and f"<td>{last['median_s'] * 1e3:.3f}</td>" in page
    assert f"<td>{cuda['median_s'] * 1e3:.3f}</td><td>{last['median_s'] / cuda['median_s']:.2f}x</td>" in page
    for name in ("batch_size", "d_model", "n_layers", "fixed_params"):
        assert f"<p>{name}</p><table>" in page


def test_the_environment_says_which_sender_drove_a_closed_loop() -> None:
    from latlab.report.sections import environment_section

    machine = {"cpu": "SYNTHETIC 2-core CPU", "cores": 2}
    native = Run(run_id="closed", machine=machine, mode="closed", payload={"closed_sender": "native"})
    python = Run(run_id="closed-py", machine=machine, mode="closed", payload={"closed_sender": "python"})
    opened = Run(run_id="open", machine=machine, mode="open", payload={"client": "lean"})
    text = environment_section([native, python, opened], [])
    assert "closed-loop sender: native (one C thread drives every connection, as wrk does)" in text
    assert "closed-loop sender: Python (the event loop&#x27;s callbacks)" in text
    assert text.count("closed-loop sender") == 2  # an open loop's run says nothing of it
