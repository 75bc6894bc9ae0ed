"""latlab.report.predict: the batch-time fit and the dynamic-batcher queueing formula, on known answers."""

from __future__ import annotations

import math
import random

from dataclasses import replace

import pytest

from latlab.common.settings import BatcherSettings
from latlab.loadtest.results import Curve
from latlab.report.predict import (
    BatchTimeFit,
    FitError,
    batch_size_at,
    bench_fits,
    capacity_rps,
    max_rate_under_slo,
    p99_latency_s,
    predict_deployment,
    request_overheads,
)

from .report_fixtures import bare_step

MS = 1e-3


def line(a: float, b: float) -> BatchTimeFit:
    return BatchTimeFit(a, b, points=2, max_batch=64)


# --- the fit ---------------------------------------------------------------------------------------


def test_fit_recovers_an_exact_line() -> None:
    fit = BatchTimeFit.from_points([(n, 0.5 * MS + 0.02 * MS * n) for n in (1, 4, 16, 64, 256)])
    assert fit.a_s == pytest.approx(0.5 * MS)
    assert fit.b_s == pytest.approx(0.02 * MS)
    assert fit.points == 5 and fit.max_batch == 256
    assert fit.time_s(100) == pytest.approx(2.5 * MS)


def test_fit_is_close_on_noisy_points() -> None:
    rng = random.Random(7)
    points = [(n, (1.0 + 0.1 * n) * MS * (1 + rng.uniform(-0.02, 0.02))) for n in range(1, 129) for _ in range(3)]
    fit = BatchTimeFit.from_points(points)
    assert fit.a_s == pytest.approx(1.0 * MS, rel=0.1)
    assert fit.b_s == pytest.approx(0.1 * MS, rel=0.02)


def test_fit_of_a_falling_curve_is_flat_at_the_weighted_mean() -> None:
    fit = BatchTimeFit.from_points([(1, 3 * MS), (2, 2 * MS), (4, 1 * MS)])
    weighted_mean = (1 / 3 + 1 / 2 + 1) / (1 / 9 + 1 / 4 + 1) * MS  # Σ t/t² / Σ 1/t²
    assert fit.b_s == 0.0 and fit.a_s == pytest.approx(weighted_mean)


def test_fit_weighs_relative_errors_so_small_batches_are_not_drowned() -> None:
    # A +9% outlier at batch 1024 pulls an unweighted intercept to 0.44 ms (-12%); weighted, it stays within 5%.
    points = [(n, (0.5 + 0.01 * n) * MS) for n in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)] + [(1024, 11.7 * MS)]
    fit = BatchTimeFit.from_points(points)
    assert fit.a_s == pytest.approx(0.5 * MS, rel=0.05)
    assert fit.time_s(1) == pytest.approx(0.51 * MS, rel=0.05)


@pytest.mark.parametrize(
    "points",
    [
        [],
        [(8, 1 * MS)],
        [(8, 1 * MS), (8, 2 * MS)],
        [(1, 0.0), (2, 1 * MS)],
        [(0, 1 * MS), (2, 1 * MS)],
        [(1, math.nan), (2, 1 * MS)],
    ],
)
def test_fit_refuses_points_that_do_not_make_a_line(points) -> None:
    with pytest.raises(FitError):
        BatchTimeFit.from_points(points)


def test_bench_fits_pick_batch_size_sweeps_per_backend() -> None:
    points = [
        {"backend": backend, "batch_size": n, "params": 1000, "median_s": (a + b * n) * MS}
        for backend, a, b in (("ort-cpu", 0.2, 0.05), ("ort-cuda", 1.0, 0.001))
        for n in (1, 8, 64)
    ]
    doc = {
        "schema": "latlab.bench/1",
        "machine": {"hostname": "gpubox"},
        "experiments": [
            {"name": "batch", "model": "ffn", "vary": "batch_size", "points": points},
            {"name": "width", "model": "ffn", "vary": "d_model", "points": points},
        ],
    }
    fits = {f["backend"]: f for f in bench_fits([doc])}
    assert set(fits) == {"ort-cpu", "ort-cuda"}  # the d_model sweep is not a batch-time fit
    assert fits["ort-cuda"]["fit"].a_s == pytest.approx(1.0 * MS)
    assert fits["ort-cpu"]["fit"].b_s == pytest.approx(0.05 * MS)
    assert fits["ort-cpu"]["model"] == "ffn" and fits["ort-cpu"]["machine"]["hostname"] == "gpubox"


# --- the queueing formula --------------------------------------------------------------------------


def test_capacity_is_instances_times_full_batches_per_second() -> None:
    assert capacity_rps(BatchTimeFit(1 * MS, 0.1 * MS, 2, 10), max_batch=10, instances=2) == pytest.approx(10_000)


def test_batch_size_without_delay_is_what_arrives_during_one_batch() -> None:
    # n = λ·a / (k - λ·b): 5000/s, a = 1 ms, b = 0.1 ms, one instance -> 5 / 0.5 = 10
    assert batch_size_at(5000, line(1 * MS, 0.1 * MS), 64, 0.0, 1) == pytest.approx(10)
    assert batch_size_at(5000, line(1 * MS, 0.0), 64, 0.0, 1) == pytest.approx(5)
    assert batch_size_at(5000, line(1 * MS, 0.0), 64, 0.0, 5) == pytest.approx(1)


def test_batch_size_with_delay_and_caps() -> None:
    assert batch_size_at(100, line(1 * MS, 0.0), 64, 10 * MS, 1) == pytest.approx(2)  # 1 + λ·D
    assert batch_size_at(10, line(0.1 * MS, 0.0), 64, 0.0, 1) == 1.0  # never below one
    assert batch_size_at(100_000, line(1 * MS, 0.1 * MS), 8, 0.0, 1) == 8.0  # λ·b >= k: full batches
    assert batch_size_at(1000, line(1 * MS, 0.0), 1, 50 * MS, 1) == 1.0  # batching off


def test_p99_at_light_load_is_the_batch_time() -> None:
    assert p99_latency_s(5, line(1 * MS, 0.0), 1, 0.0, 1) == pytest.approx(1 * MS)  # ρ = 0.5%: nobody waits


def test_p99_at_half_load_has_kingman_tail() -> None:
    # ρ = 0.5, deterministic 1 ms batches: wait p99 = 1 ms / (2·0.5) · ln(50)
    expected = 1 * MS + 1 * MS * math.log(50)
    assert p99_latency_s(500, line(1 * MS, 0.0), 1, 0.0, 1) == pytest.approx(expected)


def test_p99_counts_the_fill_wait_of_the_oldest_request() -> None:
    # 10 req/s, delay 20 ms, B = 64: the oldest waits the full delay; batch ≈ 1.2 takes 1 ms, ρ ≈ 0.8%
    assert p99_latency_s(10, line(1 * MS, 0.0), 64, 20 * MS, 1) == pytest.approx(21 * MS)
    # at 10 000 req/s a batch of 8 fills in 0.7 ms, before the delay is out
    assert p99_latency_s(10_000, line(0.1 * MS, 0.0), 8, 20 * MS, 1) > 0.7 * MS


def test_p99_is_infinite_beyond_capacity() -> None:
    assert p99_latency_s(1001, line(1 * MS, 0.0), 1, 0.0, 1) == math.inf
    assert p99_latency_s(999, line(1 * MS, 0.0), 1, 0.0, 1) < math.inf


def test_max_rate_under_slo_inverts_the_p99_formula() -> None:
    slo = 1 * MS + 1 * MS * math.log(50)
    assert max_rate_under_slo(line(1 * MS, 0.0), 1, 0.0, 1, slo) == pytest.approx(500, rel=1e-3)


def test_max_rate_under_slo_is_zero_when_one_batch_is_too_slow() -> None:
    assert max_rate_under_slo(line(5 * MS, 0.0), 64, 0.0, 1, 4 * MS) == 0.0


def test_batching_and_instances_raise_the_predicted_rate() -> None:
    fit = line(1 * MS, 0.05 * MS)
    off = max_rate_under_slo(fit, 1, 0.0, 1, 25 * MS)
    on = max_rate_under_slo(fit, 64, 2 * MS, 1, 25 * MS)
    two = max_rate_under_slo(fit, 64, 2 * MS, 2, 25 * MS)
    assert off < 1000 < on < two <= capacity_rps(fit, 64, 2)
    assert p99_latency_s(on, fit, 64, 2 * MS, 1) <= 25 * MS


def test_predict_deployment_uses_its_machine_model_and_provider() -> None:
    fits = [
        {"machine": {"hostname": "other"}, "model": "ffn", "backend": "ort-cpu", "fit": line(0.1 * MS, 0.0)},
        {"machine": {"hostname": "box"}, "model": "ffn", "backend": "ort-cpu", "fit": line(1 * MS, 0.0)},
    ]
    curve = Curve(
        name="ffn-b1",
        model="ffn",
        provider="cpu",
        machine={"hostname": "box"},
        batcher=BatcherSettings.partial(max_batch_size=1, max_queue_delay_ms=0.0, instances=1),
    )
    predicted = predict_deployment(curve, fits, 1 * MS + 1 * MS * math.log(50))
    assert predicted["rate"] == pytest.approx(500, rel=1e-3) and predicted["backend"] == "ort-cpu"
    assert predict_deployment(replace(curve, provider="cuda"), fits, 0.025) is None
    assert predict_deployment(replace(curve, machine={"hostname": "elsewhere"}), fits, 0.025) is None
    assert predict_deployment(replace(curve, model="mlp"), fits, 0.025) is None


def test_a_bench_from_another_machine_of_the_same_hostname_is_not_its_fit() -> None:
    """Every lab VM is called `vm`: a GPU box's bench must not predict a CPU box's runs."""
    fits = [
        {
            "machine": {"hostname": "vm", "cpu": "Intel Xeon", "cores": 16},
            "model": "ffn",
            "backend": "ort-cpu",
            "fit": line(1 * MS, 0.0),
        }
    ]
    curve = Curve(
        name="ffn-b1",
        model="ffn",
        provider="cpu",
        batcher=BatcherSettings.partial(max_batch_size=1, max_queue_delay_ms=0.0, instances=1),
    )
    assert (
        predict_deployment(replace(curve, machine={"hostname": "vm", "cpu": "AMD EPYC", "cores": 2}), fits, 0.025)
        is None
    )
    assert (
        predict_deployment(replace(curve, machine={"hostname": "vm", "cpu": "Intel Xeon", "cores": 16}), fits, 0.025)
        is not None
    )


def test_serving_overhead_is_calibrated_on_the_cheapest_batching_off_deployment() -> None:
    fits = [
        {"machine": {"hostname": "box"}, "model": "mlp", "backend": "ort-cpu", "fit": line(0.01 * MS, 0.0)},
        {"machine": {"hostname": "box"}, "model": "ffn", "backend": "ort-cpu", "fit": line(1 * MS, 0.0)},
    ]

    def curve(model: str, max_batch: int, top: float) -> Curve:
        return Curve(
            name=f"{model}-{max_batch}",
            model=model,
            provider="cpu",
            machine={"hostname": "box"},
            batcher=BatcherSettings.partial(max_batch_size=max_batch),
            steps=[bare_step(top / 2), bare_step(top)],
        )

    # mlp's model takes 10 us, so its 2000 req/s ceiling is the serving path: c = 0.5 ms - 0.01 ms.
    curves = [curve("mlp", 1, 2000), curve("ffn", 1, 600), curve("mlp", 64, 5000)]
    (overhead,) = request_overheads(curves, fits).values()
    assert overhead == pytest.approx(0.49 * MS)
    ffn = curve("ffn", 1, 600)
    plain = predict_deployment(ffn, fits, 0.025)
    loaded = predict_deployment(ffn, fits, 0.025, overhead)
    assert loaded["rate"] < plain["rate"] < 1000  # every request now costs 1.49 ms, not 1 ms
    assert loaded["rate"] < 1 / (1.49 * MS)
    assert request_overheads([curve("mlp", 64, 5000)], fits) == {}  # no batching-off curve: nothing to calibrate
