"""The report's first screen, cost picture and time breakdown: latlab.report.answer, costs, breakdown."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from latlab.report import best, breakdown, costs, sections
from latlab.report.write import REPORT_FILE, write_report
from latlab.common.settings import CpuOptions
from latlab.loadtest.results import Curve, Run, Step, read_results, to_dict, write_results

from .report_fixtures import CPU_NAME, GPU_NAME, cpu_run, curve, gpu_run, server, step

PNG_HEADER = b"\x89PNG\r\n\x1a\n"
SLOS = [0.010, 0.025, 0.050, 0.100]
PRICES = {"cpu": 0.80, "cuda": 2.50}


def curves_of(*runs: Path) -> list[Curve]:
    """Every deployment of the runs' results files, as the report reads them (each with its run's machine)."""
    return [d for folder in runs for run in read_results(folder) for d in run.deployments]


# --- the merged CPU+GPU report ---------------------------------------------------------------------


def test_merged_report_opens_with_the_answer_the_crossover_and_the_cost_picture(tmp_path: Path) -> None:
    page = write_report([cpu_run(tmp_path), gpu_run(tmp_path)], SLOS, prices=PRICES, out=tmp_path / "out").read_text()
    assert page.index("<table class='answer'") < page.index("<img")  # the answer before any picture
    assert "Compared: 16 CPU cores vs 1 NVIDIA H100 80GB HBM3." in page
    assert (
        "minilm: at p99 ≤ 10 ms the GPU (1 NVIDIA H100 80GB HBM3, batching ≤ 32, wait ≤ 2 ms) serves 250 req/s "
        "at $2.78 per million; the CPU (16 CPU cores, batching off) tops out at 50 req/s at $4.44 per million; "
        "below 303 req/s the CPU is cheaper, above it the GPU."
    ) in page
    row = re.search(r"<tr><td>p99 ≤ 25 ms</td>(.*?)</tr>", page).group(1)
    assert (
        "<td class='text'>batching ≤ 32, wait ≤ 2 ms</td><td>240</td><td>$0.93</td>" in row
        and "<td>≥ 1347 (not saturated)</td><td>≤ $0.52</td>" in row
        and "cuda (cheaper per inference)" in row
    )
    assert (tmp_path / "out" / "cost-minilm.png").read_bytes().startswith(PNG_HEADER)
    assert "crossover" not in page.split("<table class='answer'")[0]  # the picture follows the table
    assert "below 303 req/s the CPU is cheaper" in page.split("cost against sustained rate")[1]
    assert "No GPU data" not in page and CPU_NAME in page and GPU_NAME in page and ">vm<" not in page
    assert "synthetic (not saturated, rate cap 1347 req/s)</summary>" in page  # the GPU's steps, folded


def test_cpu_only_report_says_what_is_missing_and_the_command_that_adds_it(tmp_path: Path) -> None:
    page = write_report(cpu_run(tmp_path), SLOS).read_text()
    first_screen = page.split("<table class='answer'")[0]
    assert "No GPU data" in first_screen and "latlab report RUN --with-reference" in first_screen
    assert "latlab lab --plan gpu" in first_screen and "Compared: 16 CPU cores." in first_screen
    assert "no GPU measurements, so whether a GPU pays off is unknown" in first_screen
    assert "example prices" in first_screen


# --- ≥ N (not saturated) -----------------------------------------------------------------------------


def older_results(run: Path, drop: str) -> Path:
    """The run's results file rewritten as `latlab.results/1` without the deployments' `drop` field: results
    from before it was recorded."""
    path = run / "results-minilm.json"
    doc = {"schema": "latlab.results/1", **to_dict(read_results(path)[0])}
    for deployment in doc["deployments"]:
        del deployment[drop]
    path.write_text(json.dumps(doc))
    return run


@pytest.mark.parametrize(
    "saturated, shown",
    [
        (False, "≥ 1347 (not saturated)"),
        (True, "1347"),
        (None, "1347"),  # a /1 file from before `saturated` was recorded: unknown counts as saturated
    ],
)
def test_a_maximum_at_the_last_rate_of_an_unsaturated_sweep_is_a_lower_bound(
    tmp_path: Path, saturated: bool | None, shown: str
) -> None:
    if saturated is None:
        (gpu,) = curves_of(older_results(gpu_run(tmp_path), "saturated"))  # unknown counts as saturated
    else:
        (gpu,) = curves_of(gpu_run(tmp_path, saturated=saturated))
    (row,) = best.best_per_provider([gpu], 0.025, PRICES)
    assert best.best_rate_text(row) == shown
    closed = replace(gpu, steps=[replace(s, target_rps=None) for s in gpu.steps])  # closed loop: no target rate
    assert best.best_rate_text(best.best_per_provider([closed], 0.025, PRICES)[0]) == shown
    # Below the last rate the maximum is a measured one even when the sweep never saturated.
    (tight,) = best.best_per_provider([gpu], 0.010, PRICES)
    assert best.best_rate_text(tight) == "250"


# --- too few samples ---------------------------------------------------------------------------------


def test_a_step_with_too_few_samples_is_marked_and_never_decides_an_slo(tmp_path: Path) -> None:
    run = cpu_run(tmp_path)
    batch = [c for c in curves_of(run) if c.name == "minilm-cpu-batch"]
    # Its only step within 10 ms is the 5 req/s one, from 50 requests: so it does not meet 10 ms at all.
    (row,) = best.best_per_provider(batch, 0.010, PRICES)
    assert row.rate == 0 and best.best_rate_text(row) == "not met at ≥ 5"  # never said without the evidence
    page = write_report(run, SLOS).read_text()
    assert "(too few samples: 50)" in page
    table = re.search(r"<tr><td>minilm-cpu-batch \(cpu, batch ≤ 32, wait ≤ 2 ms\)</td><td>[^<]+</td>(.*?)</tr>", page)
    assert table.group(1).startswith("<td>not met at ≥ 5</td><td>240</td>")


# --- cost ----------------------------------------------------------------------------------------------


def test_fleet_cost_is_a_staircase() -> None:
    one = costs.fleet_cost_per_million(100, 100, 0.36)  # one machine, full: $0.36/h over 360k requests
    assert one == pytest.approx(1.0)
    assert costs.fleet_cost_per_million(50, 100, 0.36) == pytest.approx(2.0)  # half full, same bill
    assert costs.fleet_cost_per_million(101, 100, 0.36) == pytest.approx(2 * 0.36 / (101 * 3600) * 1e6)


def test_crossover_is_where_the_other_provider_becomes_and_stays_cheaper() -> None:
    # CPU: 100 req/s for $0.40/h; GPU: 2000 req/s for $2.50/h. Seven CPUs ($2.80) cost more than one GPU from 601.
    found = costs.crossover((100, 0.40), (2000, 2.50), top_rps=8000)
    assert found["cheaper_low"] == "cpu" and found["cheaper_high"] == "gpu"
    assert 600 < found["from_rps"] < 600 * 1.03
    never = costs.crossover((240, 0.10), (1347, 2.50), top_rps=6000)  # the CPU's capacity is cheaper throughout
    assert never == {"cheaper_low": "cpu", "from_rps": None, "cheaper_high": "cpu"}


def test_core_hour_prices_are_charged_for_the_cpu_deployments_cores(tmp_path: Path) -> None:
    cpu, _ = curves_of(cpu_run(tmp_path))
    price = costs.machine_price({"cpu": {"usd": 0.05, "per": "core-hour"}}, cpu)
    assert price.per_hour == pytest.approx(0.80) and "× 16 cores" in price.basis
    assert costs.machine_price({"cpu": 0.8}, cpu).basis == "$0.80 per machine-hour"
    assert (
        costs.price_unit({"cpu": {"usd": 0.05, "per": "core-hour"}, "cuda": 2.5})
        == "per core-hour and per machine-hour"
    )


def test_cpu_threads_fall_back_to_intra_op_threads_and_zero_means_every_core() -> None:
    base = Curve("c", provider="cpu", environment={"cores": 8})
    assert costs.cpu_threads(replace(base, environment={"cores": 8, "cpu_threads": 6})) == 6
    assert costs.cpu_threads(replace(base, cpu=CpuOptions.partial(intra_op_threads=2))) == 2
    assert costs.cpu_threads(replace(base, cpu=CpuOptions.partial(intra_op_threads=0))) == 8
    assert costs.cpu_threads(replace(base, cpu=CpuOptions.partial(allow_spinning=False))) is None  # threads unsaid
    assert costs.cpu_threads(Curve("c", provider="cpu")) is None


# --- where the time goes and the server-bound rule --------------------------------------------------------


def test_breakdown_takes_transfers_out_of_compute_and_the_rest_makes_up_the_request() -> None:
    figures = {
        **server(request_ms=10, queue_ms=3, compute_ms=4, cpu_cores=0.5, busy_s=1, transfer_ms=1),
        "preprocess_s": 0.0015,
    }
    split = breakdown.parts(figures)
    assert split == pytest.approx(
        {
            "queue": 0.003,
            "preprocess": 0.0015,
            "input_transfer": 0.0005,
            "compute": 0.003,
            "output_transfer": 0.0005,
            "rest": 0.0015,
        }
    )
    assert sum(split.values()) == pytest.approx(0.010)
    # A request shorter than its parts (means from different histograms): the rest is 0, never negative.
    assert breakdown.parts({**figures, "request_s": 0.005})["rest"] == 0.0
    assert breakdown.parts({}) is None


def gpu_step(cpu_cores: float | None, busy_s: float) -> tuple[Step, Curve]:
    figures = server(10, 3, 4, cpu_cores or 0.0, busy_s)
    if cpu_cores is None:
        figures["process_cpu_cores"] = None
    the_step = step(100, 20, server=figures)
    return the_step, curve("g", "cuda", 8, [the_step], {"gpu": "X"})


@pytest.mark.parametrize(
    "cpu_cores, busy_s, bound",
    [
        (0.95, 2.0, True),  # the interpreter's core is full, the GPU ran batches 20% of the time
        (0.85, 2.0, False),  # the process has room left
        (0.95, 7.5, False),  # the device is busy: it, not the front end, is the limit
        (None, 2.0, None),  # no process CPU exported: unknown, not "no"
    ],
)
def test_server_bound_rule_on_a_gpu_deployment(cpu_cores: float | None, busy_s: float, bound: bool | None) -> None:
    the_step, gpu = gpu_step(cpu_cores, busy_s)
    assert breakdown.server_bound(the_step, gpu) is bound


@pytest.mark.parametrize(
    "frontends, cpu_cores, bound",
    [
        (1, 0.95, True),  # one process: its one interpreter is full
        (4, 0.95, False),  # four front ends and an engine: one core's worth leaves four idle
        (4, 4.6, True),  # all five interpreters full while the GPU idles: the front ends are the limit
    ],
)
def test_server_bound_counts_every_front_end_and_the_engine(frontends: int, cpu_cores: float, bound: bool) -> None:
    the_step, gpu = gpu_step(cpu_cores, busy_s=2.0)
    assert breakdown.server_bound(the_step, replace(gpu, frontends=frontends)) is bound


def test_the_breakdown_table_names_the_processes_of_a_server_bound_deployment() -> None:
    the_step, gpu = gpu_step(4.6, busy_s=2.0)
    curve = replace(gpu, frontends=4)
    bar = {
        "curve": curve,
        "slo_s": 0.05,
        "step": the_step,
        "parts": breakdown.parts(the_step.server),
        "client_mean_s": None,
        "server_bound": breakdown.server_bound(the_step, curve),
    }
    assert "<td>server-bound (4 front ends + engine)</td>" in breakdown.breakdown_table([bar])
    assert "<td>server-bound</td>" in breakdown.breakdown_table([{**bar, "curve": gpu, "server_bound": True}])


def test_server_bound_on_cpu_counts_ort_threads_while_batches_run() -> None:
    # 16 threads busy 10% of the time: usable 1 + 0.1 × 16 = 2.6 cores, 90% of that is 2.34.
    env = {"cpu_threads": 16, "cores": 16}
    for cpu_cores, bound in ((2.4, True), (2.2, False)):
        the_step = step(100, 20, server=server(10, 3, 4, cpu_cores, busy_s=1.0))
        assert breakdown.server_bound(the_step, curve("c", "cpu", 1, [the_step], env)) is bound


def test_report_flags_the_server_bound_step_and_shows_where_the_time_goes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    page = write_report([cpu_run(tmp_path), gpu_run(tmp_path)], SLOS, prices=PRICES, out=out).read_text()
    assert "<strong>Server-bound</strong>: minilm-cuda-batch @ 1347/s." in page
    assert page.count("(server-bound)") == 1  # and in the steps table, on that step only
    assert (out / "time-minilm.png").read_bytes().startswith(PNG_HEADER)
    row = re.search(r"<tr><td>minilm-cuda-batch \(cuda[^<]*</td><td>1347 \(p99 ≤ 25 ms\)</td>(.*?)</tr>", page)
    cells = re.findall(r"<td>([^<]*)</td>", row.group(1))
    # queue, preprocess, input transfer, compute, output transfer, rest; server total; client mean; CPU; busy; flag
    assert cells == ["9.00", "0.00", "0.25", "2.50", "0.25", "3.00", "15.00", "16.20", "0.97", "20%", "server-bound"]


def test_results_without_server_figures_say_so(tmp_path: Path) -> None:
    run = tmp_path / "old"
    (cpu,) = [c for c in curves_of(cpu_run(tmp_path)) if c.name == "minilm-cpu-b1"]
    old = copy.deepcopy(cpu)
    for s in old.steps:
        s.server = None
    write_results(run / "results.json", Run(run_id="old", machine={"cpu": "Old CPU"}, deployments=[old]))
    page = (write_report(run, SLOS).parent / REPORT_FILE).read_text()
    assert "No server figures in these results" in page and "Server-bound" not in page


def test_a_gpu_bench_without_served_gpu_curves_is_named_on_the_first_screen(tmp_path: Path) -> None:
    from .test_report import gpu_run as bench_and_served_gpu_run

    reference = bench_and_served_gpu_run(tmp_path / "reference")
    (reference / "results.json").unlink()  # the bench alone, as report/reference/h100/ holds it
    page = write_report(cpu_run(tmp_path), SLOS, with_reference=True, reference_dir=reference).read_text()
    first_screen = page.split("<table class='answer'")[0]
    assert "No served GPU data</strong>: the bench below compares CPU and GPU in process" in first_screen
    assert "latlab lab --plan gpu" in first_screen and "--with-reference" not in first_screen  # already merged


# --- the generator's send lateness ----------------------------------------------------------------------


def test_each_steps_send_lateness_is_in_the_details_and_older_steps_show_a_dash(tmp_path: Path) -> None:
    run = cpu_run(tmp_path)
    curves = curves_of(run)
    timed = replace(curves[0].steps[0], send_lateness_p50_s=0.00012, send_lateness_p99_s=0.00184)
    assert sections.lateness_text(timed) == "0.12 / 1.84"
    assert sections.lateness_text(curves[0].steps[0]) == "–"  # recorded before the generator measured itself
    html = sections.steps_table(replace(curves[0], steps=[timed, *curves[0].steps[1:]]))
    assert "<th>sent late p50 / p99 ms</th>" in html and "<td>0.12 / 1.84</td>" in html


def test_a_step_that_other_work_on_the_machine_shared_says_so_in_the_details(tmp_path: Path) -> None:
    """Step.other_load_cores (loadtest/machine_load.py): said where it is material on the run's machine (a tenth
    of its cores, at least a quarter of one), and not where it is not or was not recorded."""
    curve = curves_of(cpu_run(tmp_path))[0]
    cores = (curve.machine or {}).get("cores") or 16
    loaded = replace(curve.steps[0], other_load_cores=0.2 * cores)
    quiet = replace(curve.steps[1], other_load_cores=0.01 * cores)
    html = sections.steps_table(replace(curve, steps=[loaded, quiet, *curve.steps[2:]]))
    assert html.count("(other load ") == 1 and f"(other load {0.2 * cores:.1f} cores)" in html
