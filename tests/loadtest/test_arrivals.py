"""Arrival processes and trace replay (loadtest/arrivals.py): the gaps each process draws against its
distribution, one schedule shared by every sender, a real trace replayed at a scaled rate, and bad input."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from latlab.common.user_input import UserError
from latlab.loadtest.arrivals import Arrivals, FleetSchedule, load_trace, parse_traffic, share

TRACE = Path(__file__).parents[2] / "traces" / "AzureLLMInferenceTrace_conv.csv"
N = 20_000


def gaps(arrivals: Arrivals, rate: float, n: int = N, seed: int = 1) -> np.ndarray:
    return np.diff(np.fromiter(itertools.islice(arrivals.offsets(rate, seed), n + 1), float), prepend=0.0)[1:]


def cv(x: np.ndarray) -> float:
    return float(x.std() / x.mean())


TOGETHER_S = 1e-5
"""Gaps shorter than this are sends at the same moment: at CV 6 half of all Gamma gaps at 500 req/s are below
1e-12 s, which times summed in floating point cannot keep apart. The distribution is tested above it."""


def above(distribution, drawn: np.ndarray) -> tuple[np.ndarray, object]:
    """The gaps of at least TOGETHER_S, and their distribution's CDF given that."""
    floor = distribution.cdf(TOGETHER_S)
    return drawn[drawn >= TOGETHER_S], lambda x: (distribution.cdf(x) - floor) / (1 - floor)


@pytest.mark.parametrize("asked", [0.5, 1.0, 3.0, 6.0])
def test_gamma_gaps_follow_their_distribution_at_the_asked_mean_and_cv(asked):
    rate = 500.0
    drawn = gaps(Arrivals.parse(f"gamma:{asked:g}"), rate)
    shape = 1 / asked**2
    assert stats.kstest(*above(stats.gamma(shape, scale=1 / (rate * shape)), drawn)).pvalue > 0.001
    if asked != 1.0:  # and they are not Poisson's
        assert stats.kstest(*above(stats.expon(scale=1 / rate), drawn)).pvalue < 0.001
    assert drawn.mean() == pytest.approx(1 / rate, rel=0.1)


def test_poisson_gaps_are_exponential_and_constant_gaps_are_equal():
    rate = 200.0
    assert stats.kstest(gaps(Arrivals(), rate), stats.expon(scale=1 / rate).cdf).pvalue > 0.001
    assert np.allclose(gaps(Arrivals("constant"), rate), 1 / rate)


@pytest.mark.parametrize("spec", ["onoff:4,1,5", "onoff:3,0.2,1", "onoff:6,0.5,2.5"])
def test_bursts_keep_the_mean_rate_and_the_burstiness_their_model_predicts(spec):
    arrivals, rate = Arrivals.parse(spec), 100.0
    drawn = gaps(arrivals, rate, n=200_000)
    # about 2,000 s of bursts lasting seconds: a few hundred of them, so the mean wanders by several percent
    assert drawn.mean() == pytest.approx(1 / rate, rel=0.15)
    assert cv(drawn) == pytest.approx(arrivals.expected_cv(rate), rel=0.1)
    assert cv(drawn) > 1.2  # burstier than Poisson


def test_every_sender_takes_its_share_of_one_schedule_and_the_fleet_keeps_its_burstiness():
    """Two processes of two senders each: their arrivals together are the one schedule, arrival for arrival.
    Independent streams merge towards Poisson as they are added (sixteen Gamma streams of CV 3 merge to a CV
    well below 3)."""
    arrivals, rate, seed = Arrivals.parse("gamma:3"), 400.0, 11
    whole = list(itertools.islice(arrivals.offsets(rate, seed), 8000))
    senders = [
        list(
            itertools.islice(FleetSchedule(rate, seed, 100.0, process=p, processes=2, users=2).times(arrivals, u), 2000)
        )
        for p in (0, 1)
        for u in (0, 1)
    ]
    merged = sorted(itertools.chain(*senders))
    assert np.allclose(np.asarray(merged) - 100.0, whole)
    assert cv(np.diff(merged)) == pytest.approx(3.0, rel=0.15)
    horizon = merged[-1] - 100.0
    streams = (itertools.takewhile(lambda t: t < horizon, arrivals.offsets(rate / 16, s)) for s in range(16))
    independent = sorted(itertools.chain(*streams))
    assert cv(np.diff(independent)) < 0.8 * cv(np.diff(merged))


def test_share_partitions_a_schedule():
    offsets = list(range(30))
    parts = [list(share(iter(offsets), k, 3)) for k in range(3)]
    assert sorted(itertools.chain(*parts)) == offsets and parts[1][:3] == [1, 4, 7]


def test_a_real_trace_replays_at_the_asked_mean_rate_with_its_shape():
    trace = load_trace(TRACE)
    assert len(trace.times) == 19_366 and trace.duration_s == pytest.approx(58 * 60, rel=0.02)
    assert set(trace.columns) == {"ContextTokens", "GeneratedTokens"}
    assert np.percentile(trace.columns["ContextTokens"], 50) == pytest.approx(1020, rel=0.05)
    scaled = np.fromiter(itertools.islice(trace.replay(200.0), len(trace.times)), float)
    assert (len(scaled) - 1) / scaled[-1] == pytest.approx(200.0, rel=1e-6)
    # its shape: each scaled second holds the requests of 200 / 5.5 seconds of the trace, burst for burst
    per_second = np.asarray(trace.per_second(200.0, 0.0, int(scaled[-1])))
    span = trace.mean_rate / 200.0
    original = np.histogram(trace.times, bins=np.arange(len(per_second) + 1) / span)[0]
    assert np.array_equal(per_second, original)
    assert per_second.std() > 2 * math.sqrt(per_second.mean())  # burstier than Poisson counts


def test_a_replay_starts_where_asked_and_loops_at_the_end():
    trace = load_trace(TRACE)
    start = trace.times[1000]
    later = list(itertools.islice(trace.replay(trace.mean_rate, start), 3))
    assert later[0] == 0.0 and later[1] == pytest.approx(trace.times[1001] - start)
    tail = list(itertools.islice(trace.replay(trace.mean_rate, trace.times[-2]), 4))
    assert tail[2] == pytest.approx(tail[1] + 1 / trace.mean_rate)  # one mean gap, then the trace's first request
    assert tail[3] - tail[2] == pytest.approx(trace.times[1])


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "text, says",
    [
        ("", "at least 2 requests, found 0"),
        ("TIMESTAMP,ContextTokens\n", "at least 2 requests, found 0"),
        ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,10\n", "at least 2 requests, found 1"),
        ("t,n\n1.0,3\n2.0,4\nsoon,5\n", "row 4: cannot read the timestamp 'soon'"),
        ("t,n\n1.0,3\n3.0,4\n2.0,5\n", "row 4: its timestamp is earlier than the row before's"),
        ("t\n5\n5\n5\n", "the trace spans no time"),
    ],
)
def test_a_bad_trace_is_refused_in_one_line_naming_the_row(tmp_path, text, says):
    with pytest.raises(UserError, match=says):
        Arrivals("trace", trace=write(tmp_path, text)).check()


def test_a_missing_trace_or_a_start_past_its_end_is_refused(tmp_path):
    with pytest.raises(UserError, match="cannot read the trace"):
        Arrivals("trace", trace=str(tmp_path / "none.csv")).check()
    with pytest.raises(UserError, match="past the end"):
        Arrivals("trace", trace=write(tmp_path, "1\n2\n3\n"), trace_start_s=5).check()


def test_timestamps_are_iso_or_seconds_and_rows_may_lack_a_size(tmp_path):
    trace = load_trace(write(tmp_path, "when,size\n2023-11-16T18:15:46Z,4\n2023-11-16 18:15:47.5000000,\n"))
    assert trace.times == (0.0, 1.5) and trace.columns["size"][0] == 4 and math.isnan(trace.columns["size"][1])


@pytest.mark.parametrize(
    "spec, says",
    [
        ("bursty", "not one of"),
        ("gamma", "not one of"),
        ("gamma:0", "positive, finite CV"),
        ("gamma:x", "not one of"),
        ("onoff:9,1,1", "PEAK can be at most"),
        ("onoff:1,1,1", "PEAK > 1"),
        ("trace:", "needs a file"),
    ],
)
def test_a_bad_arrival_process_is_refused_in_one_line(spec, says):
    with pytest.raises(UserError, match=says):
        Arrivals.parse(spec)


@pytest.mark.parametrize("spec", ["poisson", "constant", "gamma:3", "onoff:4,1,5"])
def test_a_process_reads_back_from_its_name(spec):
    assert Arrivals.parse(spec).spec == spec and Arrivals.parse(spec).expected_cv(100.0) is not None


def test_bursty_arrivals_ask_for_windows_that_hold_their_bursts():
    """A window's count of Gamma arrivals varies CV^2 times Poisson's: measured, not only assumed."""
    arrivals, rate, window = Arrivals.parse("gamma:3"), 400.0, 0.5
    times = np.fromiter(itertools.islice(arrivals.offsets(rate, 3), 400_000), float)
    counts = np.bincount((times // window).astype(int))[:-1]
    assert counts.var() / counts.mean() == pytest.approx(arrivals.dispersion, rel=0.25)
    assert Arrivals().dispersion == Arrivals.parse("gamma:0.5").dispersion == 1.0
    assert Arrivals.parse("onoff:4,1,5").burst_cycle_s(rate) == 6.0 and Arrivals().burst_cycle_s(rate) == 0.0
    trace = load_trace(TRACE)  # a trace minute at its own rate, shorter in proportion at a higher one
    assert Arrivals("trace", trace=str(TRACE)).burst_cycle_s(trace.mean_rate * 10) == pytest.approx(6.0)


def test_traffic_lists_read_an_onoff_with_its_numbers_and_refuse_repeats():
    assert [a.spec for a in parse_traffic("poisson, onoff:4,1,5,gamma:3")] == ["poisson", "onoff:4,1,5", "gamma:3"]
    assert parse_traffic(f"trace:{TRACE}")[0].trace == str(TRACE)
    with pytest.raises(UserError, match="gamma:3 twice"):
        parse_traffic("gamma:3,gamma:3.0")
    with pytest.raises(UserError, match="at least one"):
        parse_traffic(" , ")
    with pytest.raises(UserError, match="not one of"):
        parse_traffic("poisson,onoff:4")
