"""Merging requests' tensors into one batch and splitting the outputs back, with optional padding."""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

from latlab.common.settings import PaddingSettings
from latlab.server.errors import BadRequest

Tensors = dict[str, np.ndarray]


def request_length(inputs: Tensors, padding: PaddingSettings | None) -> int:
    """A request's length on the padded axis (the longest of its padded inputs); 0 when padding is off."""
    if not padding or not padding.values:
        return 0
    lengths = []
    for name in padding.values:
        array = inputs.get(name)
        if array is None:
            continue
        if array.ndim <= padding.axis:
            raise BadRequest(
                f"input '{name}' has {array.ndim} dimension(s), so it cannot be padded on axis {padding.axis}"
            )
        lengths.append(array.shape[padding.axis])
    return max(lengths, default=0)


def shape_key(inputs: Tensors, padding: PaddingSettings | None = None) -> tuple:
    """What must agree for requests to share a batch: every input's trailing dimensions, except that a
    padded input's length is replaced by its bucket (any length when bucketing is off)."""
    key = []
    for name, array in sorted(inputs.items()):
        trailing = list(array.shape[1:])
        if padding and name in padding.values and array.ndim > padding.axis:
            length = trailing[padding.axis - 1]
            trailing[padding.axis - 1] = -((-length) // padding.bucket) if padding.bucket else -1
        key.append((name, tuple(trailing)))
    return tuple(key)


def pad_to(array: np.ndarray, axis: int, length: int, value: float) -> np.ndarray:
    """`array` extended on `axis` to `length` with `value` (the array itself when already that long)."""
    missing = length - array.shape[axis]
    if missing <= 0:
        return array
    widths = [(0, 0)] * array.ndim
    widths[axis] = (0, missing)
    return np.pad(array, widths, constant_values=np.array(value).astype(array.dtype))


def merge(requests: list[Tensors], padding: PaddingSettings | None = None) -> Tensors:
    """Concatenate the requests' inputs along the batch axis (no copy for a single request); padded inputs
    are first extended to the batch's longest on the padded axis with their pad value."""
    if len(requests) == 1:
        return requests[0]
    merged = {}
    for name in requests[0]:
        arrays = [r[name] for r in requests]
        if padding and name in padding.values:
            longest = max(a.shape[padding.axis] for a in arrays)
            arrays = [pad_to(a, padding.axis, longest, padding.values[name]) for a in arrays]
        merged[name] = np.concatenate(arrays)
    return merged


def split(
    outputs: Tensors, sizes: Sequence[int], lengths: Sequence[int] = (), padding: PaddingSettings | None = None
) -> list[Tensors]:
    """Cut each batched output back into the requests' parts, in order. With padding, an output whose
    padded axis has the batch's padded length is cut back to each request's own length; the others (a
    pooled embedding, say) are only split on the batch axis."""
    if len(sizes) == 1:
        return [outputs]
    bounds = [0, *itertools.accumulate(sizes)]  # views by slicing, without np.split's bookkeeping per part
    parts = [{name: array[start:end] for name, array in outputs.items()} for start, end in zip(bounds, bounds[1:])]
    if padding and lengths and len(set(lengths)) > 1:
        padded_length, axis = max(lengths), padding.axis
        for name, array in outputs.items():
            if array.ndim > axis and array.shape[axis] == padded_length:
                for part, length in zip(parts, lengths):
                    part[name] = part[name].take(np.arange(length), axis=axis)
    return parts
