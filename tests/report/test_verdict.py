"""latlab.report.verdict, best and prices: costs, best settings per provider and the CPU-vs-GPU verdict in words."""

from __future__ import annotations

from dataclasses import replace

import pytest

from latlab.common.settings import BatcherSettings
from latlab.loadtest.results import Curve, Step
from latlab.report import costs
from latlab.report.bench_crossover import human, size_crossover
from latlab.report.best import Best, best_per_provider
from latlab.report.answer import _winner_cell, crossover_clause
from latlab.report.findings import findings_of, open_contender
from latlab.report.prices import DEFAULT_PRICES, PriceError, parse_prices
from latlab.report.verdict import provider_verdict, verdict

from .report_fixtures import bare_step

PRICES = {"cpu": 0.10, "cuda": 2.50}


def steps(*points: tuple[float, float]) -> list[Step]:
    """(achieved req/s, p99 ms) pairs as result steps."""
    return [bare_step(rps, p99_ms / 1e3) for rps, p99_ms in points]


def curve(name: str, provider: str, batch: int, points: list[Step], host: str = "cpubox") -> Curve:
    return Curve(
        name=name,
        model="ffn",
        provider=provider,
        machine={"hostname": host, "name": host},
        batcher=BatcherSettings.partial(max_batch_size=batch, max_queue_delay_ms=2.0),
        steps=points,
    )


CPU_B1 = curve("ffn-b1", "cpu", 1, steps((100, 5), (400, 12), (800, 40)))
CPU_BATCH = curve("ffn-batch", "cpu", 64, steps((100, 6), (400, 9), (800, 20), (1600, 90)))
GPU_BATCH = curve("ffn-gpu", "cuda", 64, steps((1000, 4), (4000, 8), (8000, 22), (16000, 60)), host="gpubox")


# --- prices and costs ------------------------------------------------------------------------------


def test_cost_per_million_arithmetic() -> None:
    # $0.36/h at 100 req/s: 360 000 inferences per hour -> $1 per million
    def cost(per_hour, rate):
        step = bare_step(rate) if rate else None
        return Best("cpu", Curve("c"), step, costs.Price(per_hour, "") if per_hour is not None else None).cost

    assert cost(0.36, 100) == pytest.approx(1.0)
    assert cost(2.50, 8000) == pytest.approx(2.50 / (8000 * 3600) * 1e6)
    assert cost(None, 100) is None
    assert cost(0.10, 0) is None


def test_parse_prices() -> None:
    assert parse_prices("cpu=0.10,cuda=2.50") == {"cpu": 0.10, "cuda": 2.50}
    assert parse_prices(" CPU = 1 , ") == {"cpu": 1.0}
    assert DEFAULT_PRICES == {"cpu": 0.10, "cuda": 2.50}


def test_a_cpu_price_per_core_hour_is_charged_for_the_cores_a_deployment_computes_on() -> None:
    from latlab.report.costs import machine_price, price_unit

    prices = parse_prices("cpu=0.04/core,cuda=2.50/machine")
    assert prices == {"cpu": {"usd": 0.04, "per": "core-hour"}, "cuda": 2.50}
    sixteen = Curve("c", provider="cpu", environment={"cpu_threads": 16, "cores": 16})
    price = machine_price(prices, sixteen)
    assert price.per_hour == pytest.approx(0.64) and price.basis == "$0.04 per core-hour × 16 cores"
    assert machine_price(prices, Curve("g", provider="cuda", environment={"gpu": "H100"})).per_hour == 2.50
    assert price_unit(prices) == "per core-hour and per machine-hour"


@pytest.mark.parametrize(
    "text",
    ["", ",", "cpu", "cpu=", "=2", "cpu=abc", "cpu=-1", "cpu=0", "cpu=nan", "cpu=inf", "cpu=0.1/gpu", "cpu=/core"],
)
def test_parse_prices_refuses_unreadable_prices(text: str) -> None:
    with pytest.raises(PriceError, match="--price"):
        parse_prices(text)


def test_best_per_provider_picks_the_batcher_settings_with_the_highest_rate() -> None:
    rows = {r.provider: r for r in best_per_provider([CPU_B1, CPU_BATCH, GPU_BATCH], 0.025, PRICES)}
    assert rows["cpu"].curve.name == "ffn-batch" and rows["cpu"].rate == 800
    assert rows["cpu"].cost == pytest.approx(0.10 / (800 * 3600) * 1e6)
    assert rows["cuda"].rate == 8000 and rows["cuda"].price.per_hour == 2.50


def test_tensorrt_without_its_own_price_costs_what_the_cuda_machine_costs() -> None:
    trt = replace(GPU_BATCH, provider="tensorrt")
    (row,) = best_per_provider([trt], 0.025, PRICES)
    assert row.price.per_hour == 2.50 and row.cost == pytest.approx(2.50 / (8000 * 3600) * 1e6)
    assert best_per_provider([trt], 0.025, {**PRICES, "tensorrt": 3.0})[0].price.per_hour == 3.0


def test_best_per_provider_without_a_price_has_no_cost() -> None:
    (row,) = best_per_provider([CPU_BATCH], 0.025, {"cuda": 1.0})
    assert row.price is None and row.cost is None and row.rate == 800


# --- verdict sentences -----------------------------------------------------------------------------


def test_cpu_only_says_what_is_known_and_that_gpu_data_are_missing() -> None:
    sentence = provider_verdict(findings_of("ffn", [CPU_B1, CPU_BATCH], [0.025], PRICES), 0.025)
    assert sentence.startswith(
        "ffn, p99 ≤ 25 ms: the CPU sustains up to 800 req/s (ffn-batch (cpu, batch ≤ 64, "
        "wait ≤ 2 ms) on cpubox, $0.035 per 1M inferences)."
    )
    assert sentence.endswith("No GPU measurements for ffn: whether a GPU pays off is unknown.")


def test_cpu_and_gpu_with_a_crossover() -> None:
    sentence = provider_verdict(findings_of("ffn", [CPU_B1, CPU_BATCH, GPU_BATCH], [0.025], PRICES), 0.025)
    assert (
        "ffn, p99 ≤ 25 ms: below 800 req/s the CPU meets it at lower cost ($0.10/h against $2.50/h); "
        "above it only the GPU does, up to 8000 req/s, at 10.0× the throughput"
    ) in sentence
    assert "on gpubox" in sentence
    # ten CPU machines at $0.10/h undercut one GPU at $2.50/h
    assert "10 CPU machines would match that rate for $1.00/h against the GPU's $2.50/h: scale out on CPUs" in sentence


def test_crossover_when_the_gpu_is_cheap_enough_to_pay_off() -> None:
    sentence = provider_verdict(findings_of("ffn", [CPU_BATCH, GPU_BATCH], [0.025], {"cpu": 0.50, "cuda": 2.50}), 0.025)
    assert "10 CPU machines would match that rate for $5.00/h against the GPU's $2.50/h: the GPU pays off" in sentence


def test_crossover_without_a_gpu_price_does_not_compare_cost() -> None:
    sentence = provider_verdict(findings_of("ffn", [CPU_BATCH, GPU_BATCH], [0.025], {"cpu": 0.10}), 0.025)
    assert "cost not compared" in sentence and "CPU machines would" not in sentence


def test_gpu_slower_than_cpu_does_not_pay_off() -> None:
    slow_gpu = curve("ffn-gpu", "cuda", 1, steps((100, 8), (300, 20), (600, 80)), host="gpubox")
    sentence = provider_verdict(findings_of("ffn", [CPU_BATCH, slow_gpu], [0.025], PRICES), 0.025)
    assert "the CPU meets it up to 800 req/s" in sentence and "only up to 300 req/s" in sentence
    assert sentence.endswith("the GPU does not pay off here.")


def test_only_the_gpu_meets_a_tight_slo() -> None:
    sentence = provider_verdict(findings_of("ffn", [CPU_B1, CPU_BATCH, GPU_BATCH], [0.004], PRICES), 0.004)
    assert sentence.startswith("ffn, p99 ≤ 4 ms: only the GPU meets it, up to 1000 req/s")
    assert "no CPU deployment met it" in sentence


def test_none_meets_the_slo() -> None:
    assert (
        provider_verdict(findings_of("ffn", [CPU_B1, GPU_BATCH], [0.001], PRICES), 0.001)
        == "ffn, p99 ≤ 1 ms: neither the CPU nor the GPU met it at any measured load."
    )
    cpu_only = provider_verdict(findings_of("ffn", [CPU_B1], [0.001], PRICES), 0.001)
    assert "no CPU deployment met it at any measured load" in cpu_only and "No GPU measurements" in cpu_only


def test_ranking_names_machines_when_runs_are_merged() -> None:
    merged = verdict(findings_of("ffn", [CPU_BATCH, GPU_BATCH], [0.025]), 0.025)
    assert merged.startswith("ffn at p99 ≤ 25 ms: ffn-gpu (cuda, batch ≤ 64, wait ≤ 2 ms) on gpubox sustains 8000")
    assert "ffn-batch (cpu, batch ≤ 64, wait ≤ 2 ms) on cpubox 800 req/s (10.0× less)" in merged
    assert " on cpubox" not in verdict(findings_of("ffn", [CPU_B1, CPU_BATCH], [0.025]), 0.025)


# --- model-size crossover from bench ---------------------------------------------------------------


def bench(pairs: list[tuple[int, float, float]], host: str = "gpubox") -> dict:
    """(params, CPU ms, GPU ms) at batch 1 as a bench document of one width sweep."""
    points = [
        {"backend": backend, "batch_size": 1, "params": params, "d_model": params, "median_s": ms / 1e3}
        for params, cpu, gpu in pairs
        for backend, ms in (("ort-cpu", cpu), ("ort-cuda", gpu))
    ]
    return {
        "schema": "latlab.bench/1",
        "machine": {"hostname": host, "name": host},
        "experiments": [{"name": "width", "model": "ffn", "vary": "d_model", "points": points}],
    }


def test_size_crossover_names_the_size_from_which_the_gpu_wins() -> None:
    doc = bench([(10_000, 0.1, 0.5), (1_000_000, 1.0, 0.6), (100_000, 0.3, 0.5), (10_000_000, 9.0, 0.8)])
    assert size_crossover([doc]) == [
        "bench on gpubox: from about 1M parameters the GPU wins at batch 1 (2 of 4 sizes, 10k to 10M parameters)."
    ]


def test_size_crossover_when_cpu_always_wins_or_results_are_mixed() -> None:
    cpu_wins = bench([(1000, 0.1, 0.5), (2000, 0.2, 0.5)])
    assert "the CPU was as fast or faster at every measured size" in size_crossover([cpu_wins])[0]
    mixed = bench([(1000, 0.5, 0.1), (2000, 0.2, 0.5)])
    assert "no size crossover" in size_crossover([mixed])[0]


def test_size_crossover_needs_both_backends() -> None:
    doc = bench([(1000, 0.1, 0.5)])
    doc["experiments"][0]["points"] = [p for p in doc["experiments"][0]["points"] if p["backend"] == "ort-cpu"]
    assert size_crossover([doc]) == []


def test_human_counts() -> None:
    assert [human(n) for n in (950, 2_100_000, 16_512, 2**31)] == ["950", "2.1M", "16.5k", "2.15G"]


def test_an_unsaturated_maximum_shows_as_a_lower_bound_in_the_tables() -> None:
    from latlab.report.sections import slo_table
    from latlab.report.rates import rate_text

    steps = [bare_step(t - 1, 0.005, target=t) for t in (100, 200)]
    curve = Curve(
        name="mlp-b1",
        run_id="r",
        provider="cpu",
        batcher=BatcherSettings.partial(max_batch_size=1),
        machine={"cpu": "Test CPU"},
        steps=steps,
        saturated=False,
    )
    assert rate_text(curve, steps[1]) == "≥ 199 (not saturated)" and rate_text(curve, steps[0]) == "99"
    assert "<td>≥ 199 (not saturated)</td>" in slo_table(findings_of("ffn", [curve], [0.025]))
    assert "<td>199</td>" in slo_table(findings_of("ffn", [replace(curve, saturated=True)], [0.025]))
    assert rate_text(curve, None) == "–"


def test_machines_are_named_by_what_they_are_never_by_hostname() -> None:
    """Every lab VM is called `vm`: a merged report names machines by --machine-name, GPU or CPU model."""
    from latlab.common import machine
    from latlab.report.naming import machine_name

    here = machine.describe()
    assert "name" not in here and here["hostname"]
    assert machine.describe("h100-box")["name"] == "h100-box"
    cpu = Curve(
        "c",
        provider="cpu",
        machine={"hostname": "vm", "cpu": "Intel Xeon", "cores": 16, "gpu": "NVIDIA H100"},
        environment={"cpu": "Intel Xeon"},
    )
    gpu = replace(cpu, provider="cuda", environment={"cpu": "Intel Xeon", "gpu": "NVIDIA H100 80GB HBM3"})
    assert machine_name(cpu) == "Intel Xeon" and machine_name(gpu) == "NVIDIA H100 80GB HBM3"
    named = replace(gpu, machine={**gpu.machine, "name": "h100-box"})
    assert machine_name(named) == "h100-box"
    assert "vm" not in {machine_name(c) for c in (cpu, gpu, named)}


# --- a side whose sweep ended before it saturated ---------------------------------------------------------------

GPU_OPEN = replace(  # its sweep reached its cap at 1000 req/s still meeting 25 ms: 1000 is only a lower bound
    curve("ffn-gpu", "cuda", 64, [bare_step(r, p / 1e3, target=r) for r, p in ((250, 4), (500, 6), (1000, 8))]),
    saturated=False,
    machine={"hostname": "gpubox", "name": "gpubox"},
)


def test_a_gpu_not_saturated_leaves_open_which_is_cheaper_and_says_the_rate_that_decides() -> None:
    found = findings_of("ffn", [CPU_BATCH, GPU_OPEN], [0.025], PRICES).at(0.025)
    assert found.gpu.unsaturated and found.winner is found.cpu  # at the rates measured the CPU is cheaper
    # The GPU costs $2.50/h against $0.10/h for 800 req/s: kept busy it is cheaper per inference above 20000 req/s.
    assert found.crossover["open"] == {"side": "gpu", "rate_rps": 1000, "needs_rps": pytest.approx(20000)}
    words = crossover_clause(found.crossover)
    assert words.startswith("the CPU is cheaper at every rate up to 4000 req/s as measured, but the GPU was not ")
    assert "saturated at 1000 req/s: if it serves more than 20000 req/s it is the cheaper at high rates" in words
    cell = _winner_cell(found)
    assert (
        cell == "cpu (cheaper per inference at the rates measured; cuda, not saturated at 1000, wins above 20000 req/s)"
    )
    sentence = provider_verdict(findings_of("ffn", [CPU_BATCH, GPU_OPEN], [0.025], PRICES), 0.025)
    assert "above it only the GPU does, up to ≥ 1000 req/s (not saturated), at at least 1.2× the throughput" in sentence
    assert "scale out on CPUs unless the GPU serves more than 20000 req/s" in sentence
    assert verdict(findings_of("ffn", [CPU_BATCH, GPU_OPEN], [0.025]), 0.025).startswith(
        "ffn at p99 ≤ 25 ms: ffn-gpu (cuda, batch ≤ 64, wait ≤ 2 ms) on gpubox sustains ≥ 1000 req/s (not saturated)"
    )


def test_a_gpu_not_saturated_but_already_cheaper_makes_the_crossover_an_upper_bound() -> None:
    # One CPU machine ($0.20/h) is cheaper than one GPU ($0.24/h) at a low rate; kept busy, the GPU is cheaper.
    found = findings_of("ffn", [CPU_BATCH, GPU_OPEN], [0.025], {"cpu": 0.20, "cuda": 0.24}).at(0.025)
    assert found.winner is found.gpu and "open" not in found.crossover and open_contender(found) is None
    assert found.crossover["from_rps"] is not None and found.crossover["at_most"]
    assert crossover_clause(found.crossover).startswith("below at most ")
    assert "at the rates measured" not in _winner_cell(found)
    # The other way round: a saturated GPU and an unsaturated CPU that looks dearer leave it open for the CPU.
    cpu_open = replace(
        CPU_BATCH, saturated=False, steps=[replace(s, target_rps=s.achieved_rps) for s in CPU_BATCH.steps[:3]]
    )
    found = findings_of("ffn", [cpu_open, GPU_BATCH], [0.025], {"cpu": 1.0, "cuda": 2.5}).at(0.025)
    assert found.winner is found.gpu and found.crossover["open"]["side"] == "cpu"
    rival, needs = open_contender(found)
    assert rival is found.cpu and needs == pytest.approx(1.0 / 2.5 * 8000)
