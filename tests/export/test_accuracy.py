"""latlab.export.accuracy and samples: each measure on outputs of known closeness, the bounds, the fixed input sets."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from latlab.export import samples
from latlab.export.accuracy import DEFAULT_MIN, Accuracy, Bound, compare
from latlab.export.minilm import CLS_ID, SEP_ID, model_dir
from latlab.export.zoo import ZooModel, build_mlp

RNG = np.random.default_rng(3)


def batched(*arrays: np.ndarray) -> list[list[np.ndarray]]:
    """Outputs as accuracy.run returns them: per batch, a list of the model's outputs."""
    return [[a] for a in arrays]


def test_each_zoo_model_gets_the_measure_that_fits_its_output() -> None:
    assert Bound.for_model("minilm") == Bound("cosine", DEFAULT_MIN["cosine"])
    assert Bound.for_model("cnn") == Bound("top1", DEFAULT_MIN["top1"])
    for kind in ("mlp", "ffn", "rnn", None):  # None: the user's own module
        assert Bound.for_model(kind).measure == "relative"
    assert Bound.for_model("cnn", 0.5) == Bound("top1", 0.5)


def test_cosine_is_one_for_the_same_embeddings_and_takes_the_worst_row() -> None:
    want = RNG.standard_normal((8, 16)).astype(np.float32)
    assert compare("cosine", batched(want), batched(want.copy())).figure == pytest.approx(1.0)
    have = want.copy()
    have[5] = -want[5]  # one embedding turned around: cosine -1 for that row
    accuracy = compare("cosine", batched(want[:4], want[4:]), batched(have[:4], have[4:]))
    assert accuracy.figure == pytest.approx(-1.0)
    assert accuracy.details["mean_cosine"] == pytest.approx((7 - 1) / 8)
    assert accuracy.details["samples"] == 8


def test_top1_counts_agreeing_rows_and_records_the_logit_error() -> None:
    want = np.eye(10, dtype=np.float32)  # row i's top class is i
    have = want.copy()
    have[[0, 1]] = have[[1, 0]]  # two rows now pick another class
    accuracy = compare("top1", batched(want), batched(have))
    assert accuracy.figure == pytest.approx(0.8)
    assert accuracy.details["max_logit_error"] == pytest.approx(1.0)
    assert accuracy.details["max_logit_error_rel"] == pytest.approx(1.0)


def test_relative_is_one_minus_the_error_over_the_output_scale() -> None:
    want = np.array([[2.0, -4.0], [1.0, 0.5]], np.float32)
    have = want + np.array([[0.0, 0.1], [0.0, 0.0]], np.float32)
    accuracy = compare("relative", batched(want), batched(have))
    assert accuracy.details["max_rel_error"] == pytest.approx(0.1 / 4.0)
    assert accuracy.figure == pytest.approx(1 - 0.1 / 4.0)


def test_a_broken_variant_scores_zero_and_fails_any_bound() -> None:
    want = RNG.standard_normal((4, 3)).astype(np.float32)
    for measure in ("cosine", "top1", "relative"):
        broken = compare(measure, batched(want), batched(np.full_like(want, np.nan)))
        assert broken.figure == 0.0 and broken.details["non_finite_values"] == want.size
        assert not broken.meets(Bound(measure, 0.01))
    assert not Accuracy("relative", math.nan).meets(Bound("relative", 0.0))


def test_shortfall_names_the_variant_its_figure_and_the_bound() -> None:
    line = Accuracy("top1", 0.875).shortfall("the int8 variant of cnn", Bound("top1", 0.95))
    assert line == "the int8 variant of cnn refused: top-1 agreement with FP32 0.8750 < 0.95 (--min-accuracy)"


def test_the_check_set_is_fixed_and_apart_from_calibration() -> None:
    torch.manual_seed(0)
    zoo = build_mlp(4, 8, 2)
    first, again = samples.check_batches(zoo), samples.check_batches(zoo)
    assert len(first) * samples.BATCH == samples.CHECK_SAMPLES
    assert all(np.array_equal(a["x"], b["x"]) for a, b in zip(first, again))
    calibration = samples.calibration_batches(zoo)
    assert len(calibration) * samples.BATCH == samples.CALIBRATION_SAMPLES
    assert not np.array_equal(calibration[0]["x"], first[0]["x"])
    state = torch.get_rng_state()
    samples.check_batches(zoo)
    assert torch.equal(state, torch.get_rng_state())  # the caller's random stream is left alone


def test_a_text_model_is_checked_on_real_sentences_through_its_tokenizer() -> None:
    ids = torch.zeros(2, 4, dtype=torch.int64)
    zoo = ZooModel(
        nn.Identity(),
        {"input_ids": ids, "attention_mask": ids},
        ["embedding"],
        files={samples.TOKENIZER_FILE: model_dir() / "tokenizer.json"},
    )
    batches = samples.check_batches(zoo)
    assert sum(len(b["input_ids"]) for b in batches) == len(samples.SENTENCES)
    for batch in batches:
        tokens, mask = batch["input_ids"], batch["attention_mask"]
        lengths = mask.sum(axis=1)
        assert (tokens[:, 0] == CLS_ID).all() and (tokens[np.arange(len(tokens)), lengths - 1] == SEP_ID).all()
        assert (tokens[mask == 0] == 0).all() and mask.max(axis=0).all()  # padding at the end, to the longest
    assert "sentences" in samples.describe(zoo, batches)
