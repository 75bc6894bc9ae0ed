"""The report of a model swept under several arrival processes: judged under the first, the others set beside it
in a section of their own (a sentence per process, a table per SLO and provider, a picture against the CV)."""

from __future__ import annotations

import html
import re
from pathlib import Path

from latlab.loadtest.results import Run, write_results
from latlab.report.write import write_report
from tests.report.report_fixtures import CPU_NAME, GPU_NAME, curve, step

SLOS = [0.01, 0.025]
PRICES = {"cpu": 0.8, "cuda": 2.5}
PNG_HEADER = b"\x89PNG"


def swept(folder: Path, arrivals: str, cv: float, cpu_p99_ms: list[float], gpu_p99_ms: list[float]) -> None:
    """One CPU and one GPU deployment of minilm at the same rates, the CPU's and the GPU's p99 as given."""
    cpu_env = {"name": CPU_NAME, "cpu": "SYNTHETIC CPU", "cores": 16, "cpu_threads": 16}
    gpu_env = {"name": GPU_NAME, "gpu": "NVIDIA H100 80GB HBM3", "cpu": "SYNTHETIC Xeon", "cores": 16}
    cpu_rates, gpu_rates = [50, 100, 200], [250, 500, 1000]
    cpu = curve("minilm-cpu-b1", "cpu", 1, [step(r, p, arrival_cv=cv) for r, p in zip(cpu_rates, cpu_p99_ms)], cpu_env)
    gpu = curve(
        "minilm-cuda-batch", "cuda", 32, [step(r, p, arrival_cv=cv) for r, p in zip(gpu_rates, gpu_p99_ms)], gpu_env
    )
    for name, deployment, env in (("cpu", cpu, cpu_env), ("gpu", gpu, gpu_env)):
        run = Run(
            run_id="SYNTHETIC-run", machine={"hostname": "vm", **env}, deployments=[deployment], arrivals=arrivals
        )
        write_results(folder / f"results-{name}.json", run)


def test_bursts_are_set_beside_the_poisson_verdict(tmp_path: Path) -> None:
    run = tmp_path / "run"
    swept(run / "minilm", "poisson", 1.0, cpu_p99_ms=[5, 8, 30], gpu_p99_ms=[4, 6, 9])
    # under bursts the CPU's p99 at 100 req/s breaks 10 ms; the GPU's batches absorb them
    swept(run / "minilm" / "traffic-1", "gamma:3", 2.9, cpu_p99_ms=[7, 14, 60], gpu_p99_ms=[4, 6, 9.5])
    page = write_report(run, SLOS, prices=PRICES, out=tmp_path / "out").read_text()
    assert "<h2>minilm under your traffic</h2>" in page
    assert "The verdict above speaks of poisson (CV 1.0 as sent) arrivals." in page
    assert (
        html.escape(
            "Under gamma:3 (CV 2.9 as sent) arrivals, at p99 ≤ 10 ms: the CPU's best (minilm-cpu-b1) falls from 100 to "
            "50 req/s (-50%); the GPU's best (minilm-cuda-batch) keeps 1000 req/s (+0%)."
        )
        in page
    )
    row = re.search(r"<tr><td>p99 ≤ 10 ms</td><td>cpu</td><td>(\d+)</td><td>(\d+)</td></tr>", page)
    assert row is not None and row.groups() == ("100", "50"), page[page.index("under your traffic") :][:2000]
    assert (tmp_path / "out" / "traffic-minilm.png").read_bytes().startswith(PNG_HEADER)
    # the answer above is the first process's: no deployment is listed twice for the bursty curves
    answer = page.split("under your traffic")[0]
    assert "minilm: at p99 ≤ 10 ms" in answer and answer.count("minilm-cpu-b1") <= page.count("minilm-cpu-b1")


def test_one_process_adds_no_traffic_section(tmp_path: Path) -> None:
    run = tmp_path / "run"
    swept(run / "minilm", "poisson", 1.0, cpu_p99_ms=[5, 8, 30], gpu_p99_ms=[4, 6, 9])
    page = write_report(run, SLOS, prices=PRICES, out=tmp_path / "out").read_text()
    assert "under your traffic" not in page and not (tmp_path / "out" / "traffic-minilm.png").exists()


def test_a_step_shows_the_pad_tokens_its_batches_added(tmp_path: Path) -> None:
    env = {"name": CPU_NAME, "cpu": "SYNTHETIC CPU", "cores": 16, "cpu_threads": 16}
    figures = {"seconds": 10.0, "request_s": 0.01, "padded_position_share": 0.23}
    text = curve("minilm-text-batch", "cpu", 8, [step(50, 8, server=figures), step(100, 9)], env)
    write_results(
        tmp_path / "run" / "results.json", Run(run_id="r", machine={"hostname": "vm", **env}, deployments=[text])
    )
    page = write_report(tmp_path / "run", SLOS, prices=PRICES, out=tmp_path / "out").read_text()
    assert "<td>1.0, 23% pad tokens</td>" in page and page.count("pad tokens") == 1


def test_a_deployment_through_a_fleet_says_what_the_proxy_added(tmp_path: Path) -> None:
    env = {"name": CPU_NAME, "cpu": "SYNTHETIC CPU", "cores": 16, "cpu_threads": 16}
    lone = {"requests": 300, "errors": 0, "max_s": 0.004, "too_few_samples": False}
    added = {
        "replica": "r0",
        "pairs": 300,
        "proxy": {**lone, "p50_s": 0.0015, "p99_s": 0.0031},
        "direct": {**lone, "p50_s": 0.0011, "p99_s": 0.0022},
        "added_p50_s": 0.0015 - 0.0011,
        "added_p99_s": 0.0031 - 0.0022,
    }
    fleet = curve("mlp-batch", "cpu", 8, [step(50, 8), step(100, 9)], env)
    fleet.proxy_added = added
    alone = curve("mlp-b1", "cpu", 1, [step(50, 8), step(100, 9)], env)
    run = Run(run_id="r", machine={"hostname": "vm", **env}, deployments=[fleet, alone])
    write_results(tmp_path / "run" / "results.json", run)
    page = html.unescape(write_report(tmp_path / "run", SLOS, prices=PRICES, out=tmp_path / "out").read_text())
    said = "mlp-batch: the proxy added p50 +0.40 ms, p99 +0.90 ms to a lone request (300 pairs: through it p50 1.50"
    assert said in page and "r0 direct 1.10 / 2.20 ms" in page
    assert page.count("the proxy added") == 1  # the deployment served without the proxy says nothing of one
