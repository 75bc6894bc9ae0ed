"""Request sizes drawn per request (loadtest/sizes.py): each distribution against its own (KS), a trace's column
row for row with the arrivals it replays and shared among the fleet's senders as they are, the share above a
deployment's maximum, the bodies built at each size, and bad input in one line."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import orjson
import pytest
from scipy import stats

from latlab.common.user_input import UserError
from latlab.loadtest.arrivals import Arrivals, FleetSchedule, load_trace
from latlab.loadtest.payloads import random_bodies, sized_body
from latlab.loadtest.plan import PayloadOptions, SweepPlan
from latlab.loadtest.sizes import Sizes, max_length, truncation_line

TRACE = Path(__file__).parents[2] / "traces" / "AzureLLMInferenceTrace_conv.csv"
N = 20_000


def drawn(spec: str, n: int = N, seed: int = 3) -> np.ndarray:
    return np.fromiter(itertools.islice(Sizes.parse(spec).draws(seed), n), int)


def test_lognormal_sizes_have_the_asked_median_and_99th_percentile():
    sizes = drawn("lognormal:1020:4142")
    p50, p99 = np.percentile(sizes, [50, 99])
    assert p50 == pytest.approx(1020, rel=0.05) and p99 == pytest.approx(4142, rel=0.08)
    sigma = math.log(4142 / 1020) / stats.norm.ppf(0.99)
    assert stats.kstest(sizes, stats.lognorm(s=sigma, scale=1020).cdf).pvalue > 0.001
    assert stats.kstest(sizes, stats.lognorm(s=sigma, scale=1100).cdf).pvalue < 0.001  # the test tells medians apart


def test_uniform_sizes_take_every_whole_size_between_the_ends_alike():
    sizes = drawn("uniform:4:13")
    counts = np.bincount(sizes, minlength=14)[4:]
    assert sizes.min() == 4 and sizes.max() == 13 and counts.sum() == N
    assert stats.chisquare(counts).pvalue > 0.001


def test_each_sender_draws_its_own_stream_and_a_fixed_size_is_every_request():
    schedule = FleetSchedule(rate=10, seed=5, users=2)
    sizes, arrivals = Sizes.parse("lognormal:20:200"), Arrivals()
    first, second = (list(itertools.islice(schedule.sizes(sizes, arrivals, k), 50)) for k in (0, 1))
    assert first != second
    assert first == list(itertools.islice(schedule.sizes(sizes, arrivals, 0), 50))  # seeded: the same again
    assert set(itertools.islice(Sizes.parse("12").draws(1), 100)) == {12}


def test_a_trace_column_goes_row_for_row_with_the_arrivals_every_sender_replays():
    trace, start_s, rate = load_trace(TRACE), 600.0, 50.0
    arrivals, sizes = Arrivals("trace", trace=str(TRACE), trace_start_s=start_s), Sizes.parse("trace:ContextTokens")
    schedule = FleetSchedule(rate=rate, seed=1, processes=2, users=3, trace=trace)
    column = trace.columns["ContextTokens"]
    first = int(np.searchsorted(trace.times, start_s))
    sent = {}  # the fleet's requests by intended time: each with the size of the trace row replayed then
    for process, local in itertools.product(range(2), range(3)):
        mine = replace(schedule, process=process)
        pairs = zip(mine.times(arrivals, local), mine.sizes(sizes, arrivals, local))
        sent.update(itertools.islice(pairs, 400))
    replayed = list(itertools.islice(trace.replay(rate, start_s), 6 * 400))
    assert [sent[t] for t in replayed[: 6 * 390]] == [column[first + k] for k in range(6 * 390)]


def test_a_trace_column_crosses_to_a_worker_with_its_times():
    trace = load_trace(TRACE)
    arrivals, sizes = Arrivals("trace", trace=str(TRACE)), Sizes.parse("trace:ContextTokens")
    message = FleetSchedule(rate=5, trace=trace).as_message(arrivals, ("ContextTokens",))
    assert list(message["columns"]) == ["ContextTokens"]
    rebuilt = FleetSchedule.from_message(orjson.loads(orjson.dumps(message)), arrivals)
    assert list(itertools.islice(rebuilt.sizes(sizes, arrivals, 0), 100)) == list(trace.columns["ContextTokens"][:100])


def test_the_share_above_a_maximum_is_the_draws_share_and_is_said():
    for spec, cap in (("lognormal:40:400", 128), ("uniform:10:109", 64), ("200", 128), ("20", 128)):
        sizes = Sizes.parse(spec)
        share = float((drawn(spec) > cap).mean())
        assert sizes.share_above(cap) == pytest.approx(share, abs=0.01)
    column = tuple(int(v) for v in load_trace(TRACE).columns["ContextTokens"])
    assert Sizes.parse("trace:ContextTokens").share_above(512, column) == sum(v > 512 for v in column) / len(column)
    line = truncation_line(Sizes.parse("lognormal:40:400"), "text", 128)
    assert line is not None and "above its maximum of 128 tokens" in line and line.startswith("text: ")
    assert truncation_line(Sizes.parse("uniform:3:60"), "text", 64) is None


TEXT = {"name": "t", "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}], "parameters": {"max_length": 64}}
TOKENS = {"name": "m", "inputs": [{"name": "ids", "datatype": "INT64", "shape": [-1, -1]}]}


def test_bodies_are_built_at_each_size_and_text_at_no_fewer_tokens_than_a_sentence_takes():
    rng = np.random.default_rng(0)
    body = orjson.loads(sized_body(TOKENS, rng, PayloadOptions(), 37).data)
    assert body["inputs"][0]["shape"] == [1, 37] and len(body["inputs"][0]["data"]) == 37
    words = orjson.loads(sized_body(TEXT, rng, PayloadOptions(text=True), 1).data)["inputs"][0]["data"][0].split()
    assert len(words) == 1  # a word and a period: with [CLS] and [SEP], the 3 tokens of the shortest sentence
    assert max_length(TEXT) == 64 and max_length(TOKENS) == 0


def test_a_one_at_a_time_probe_sends_sizes_of_the_distribution_capped_at_the_maximum():
    options = PayloadOptions(sizes="uniform:10:500")
    shapes = {orjson.loads(b.data)["inputs"][0]["shape"][1] for b in random_bodies(TOKENS, 1, options)}
    assert len(shapes) > 10 and min(shapes) >= 10 and max(shapes) <= 500
    texts = random_bodies(TEXT, 1, replace(options, text=True))
    words = [len(orjson.loads(b.data)["inputs"][0]["data"][0].split()) for b in texts]
    assert max(words) == 64 - 3 and words.count(64 - 3) > len(words) / 2  # most above 64 tokens: sent at 64
    assert len(set(words)) > 1


@pytest.mark.parametrize(
    "spec, says",
    [
        ("lognormal:100", "not one of"),
        ("lognormal:100:50", "P99 above P50"),
        ("uniform:9:3", "HI >= LO"),
        ("0", "whole numbers >= 1"),
        ("2.5", "whole numbers >= 1"),
        ("trace:", "name of a column"),
        ("pareto:1:2", "not one of"),
    ],
)
def test_a_bad_size_spec_is_refused_in_one_line(spec, says):
    with pytest.raises(UserError, match=says):
        Sizes.parse(spec)


def test_specs_read_back_from_their_names():
    for spec in ("12", "uniform:4:60", "lognormal:1020:4142", "trace:ContextTokens"):
        assert Sizes.parse(spec).spec == spec


BASE = ["--host", "http://127.0.0.1:1", "--deployment", "m"]


@pytest.mark.parametrize(
    "options, says",
    [
        (["--dim", "seq=trace:ContextTokens"], "name it with --trace FILE"),
        (["--dim", "x:1=12"], "write --dim seq=SPEC"),
        (["--dim", "seq=12", "--dim", "seq=13"], "given 2 times"),
        (["--dim", "seq=uniform:4:9", "--seq-len-max", "20"], "give one"),
        (
            ["--dim", "seq=trace:Nope", "--trace", str(TRACE)],
            "has no numeric column 'Nope'; its columns: ContextTokens",
        ),
        (["--text", "--dim", "seq=uniform:1:9"], "at least 3 tokens"),
    ],
)
def test_a_size_option_that_cannot_be_served_stops_before_any_load(options, says):
    with pytest.raises(UserError, match=says):
        SweepPlan.from_options([*BASE, *options])


def test_a_size_column_with_a_hole_names_the_request(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,Tokens\n0,5\n1,\n2,7\n")
    with pytest.raises(UserError, match=r"request 2 \(data row 2\) has Tokens = nan"):
        SweepPlan.from_options([*BASE, "--trace", str(trace), "--dim", "seq=trace:Tokens"])
    plan = SweepPlan.from_options([*BASE, "--dim", "seq=lognormal:20:200"])
    assert plan.workload.payload.size_spec == Sizes("lognormal", 20, 200)
    assert SweepPlan.from_json(plan.to_json()) == plan
