"""latlab.server.batching.tensors: merging requests into one batch and splitting its outputs back (padding:
test_padding.py)."""

from __future__ import annotations

import numpy as np

from latlab.server.batching.tensors import merge, split


def test_merge_and_split_are_inverse() -> None:
    parts = [{"x": np.arange(n * 2).reshape(n, 2) + 10 * n} for n in (1, 3, 2)]
    merged = merge(parts)
    assert merged["x"].shape == (6, 2)
    for got, want in zip(split(merged, [1, 3, 2]), parts):
        np.testing.assert_array_equal(got["x"], want["x"])


def test_merge_of_one_request_is_that_request() -> None:
    inputs = {"x": np.ones((2, 2))}
    assert merge([inputs])["x"] is inputs["x"]
