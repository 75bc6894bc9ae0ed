"""measure(): warm-up, then repeats bounded by count and time; grid helpers and option parsing."""

from __future__ import annotations

import pytest

from latlab.bench.experiments import BenchError, BenchSettings, MeasureSettings, fixed_params_width, grid, measure
from latlab.bench.plan import parse_ints


class FakeClock:
    """Each run takes `step` seconds of fake time."""

    def __init__(self, step: float) -> None:
        self.now, self.step, self.runs = 0.0, step, 0

    def __call__(self) -> float:
        return self.now

    def run(self) -> None:
        self.runs += 1
        self.now += self.step


def test_fast_runs_repeat_until_min_time() -> None:
    clock = FakeClock(0.01)
    timing = measure(clock.run, MeasureSettings(warmup=2, min_repeats=5, min_time_s=0.2, max_repeats=1000), clock)
    assert timing.repeats == 20  # 0.2 s of 0.01 s runs
    assert clock.runs == 22  # plus the two warm-up runs, not timed
    assert timing.median_s == pytest.approx(0.01)


def test_slow_runs_still_get_min_repeats() -> None:
    clock = FakeClock(1.0)
    timing = measure(clock.run, MeasureSettings(warmup=0, min_repeats=5, min_time_s=0.2, max_time_s=100), clock)
    assert timing.repeats == 5


def test_max_time_caps_very_slow_points_at_three_runs() -> None:
    clock = FakeClock(2.0)
    timing = measure(clock.run, MeasureSettings(warmup=0, min_repeats=5, min_time_s=0.2, max_time_s=3.0), clock)
    assert timing.repeats == 3


def test_max_repeats_caps_fast_points() -> None:
    clock = FakeClock(1e-6)
    timing = measure(clock.run, MeasureSettings(warmup=0, min_repeats=5, min_time_s=10, max_repeats=50), clock)
    assert timing.repeats == 50


def test_median_min_max_come_from_the_samples() -> None:
    durations = iter([0.0, 3.0, 1.0, 2.0, 5.0])
    now = [0.0]

    def run() -> None:
        now[0] += next(durations)

    timing = measure(
        run, MeasureSettings(warmup=1, min_repeats=4, min_time_s=0, max_repeats=4, max_time_s=100), lambda: now[0]
    )
    assert (timing.median_s, timing.min_s, timing.max_s, timing.repeats) == (2.5, 1.0, 5.0, 4)


def test_fixed_params_width_is_a_multiple_of_eight_near_sqrt() -> None:
    assert fixed_params_width(2**27, 1) == 11584
    assert fixed_params_width(2**27, 128) == 1024
    assert all(fixed_params_width(2**27, 2**k) % 8 == 0 for k in range(15))


def test_grids_follow_the_seed() -> None:
    settings = BenchSettings(
        batches=[1, 2], d_models=[64, 128], layers=[128, 256], fixed_params=2**20, fixed_layers=[1, 16]
    )
    assert grid("batch_size", settings) == ({"d_model": 128, "n_layers": 128}, [(128, 128, [1, 2])])
    assert grid("d_model", settings)[1] == [(64, 128, [1]), (128, 128, [1])]
    assert grid("n_layers", settings)[1] == [(128, 128, [1]), (128, 256, [1])]
    assert grid("fixed_params", settings) == ({"batch_size": 1, "params": 2**20}, [(1024, 1, [1]), (256, 16, [1])])


@pytest.mark.parametrize(
    "text, expected", [("1,2,4", [1, 2, 4]), ("128:512:128", [128, 256, 384, 512]), (" 8 , 16:32:8", [8, 16, 24, 32])]
)
def test_parse_ints(text: str, expected: list[int]) -> None:
    assert parse_ints("--batches", text) == expected


@pytest.mark.parametrize("text", ["", "0", "1,x", "-4", "3:1", "1.5"])
def test_parse_ints_rejects_bad_values(text: str) -> None:
    with pytest.raises(BenchError, match="--batches"):
        parse_ints("--batches", text)
