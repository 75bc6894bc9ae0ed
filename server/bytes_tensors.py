"""BYTES tensors of the Open Inference Protocol <-> numpy object arrays of bytes, in JSON and binary form."""

from __future__ import annotations

import math

import numpy as np

from latlab.server.errors import BadRequest

_LENGTH_PREFIX = np.dtype("<u4")
"""Each binary BYTES element: its length as 4 little-endian bytes, then the bytes."""


def bytes_from_json(name: str, data: object, datatype: str, shape: list[int]) -> np.ndarray:
    """BYTES in JSON: strings (flat or nested like the shape), kept as their UTF-8 bytes."""
    try:
        nested, leaves = _nested(data, max(1, len(shape)))
        if len(nested) > 1 and nested != shape:
            raise ValueError(f"nested as {nested} but shape is {shape}")
        if not all(isinstance(leaf, str) for leaf in leaves):
            raise ValueError("BYTES elements must be strings")
    except ValueError as exc:
        raise BadRequest(f"input '{name}': data is not a valid {datatype} array: {exc}") from None
    array = np.empty(len(leaves), dtype=object)
    array[:] = [leaf.encode("utf-8") for leaf in leaves]
    return array


def _nested(data: object, max_depth: int) -> tuple[list[int], list[object]]:
    """The shape of regularly nested lists and their leaves, level by level (no recursion: JSON may nest
    a thousand deep); ValueError when ragged or deeper than `max_depth`."""
    level, shape = [data], []
    while any(isinstance(item, list) for item in level):
        lengths = {len(item) if isinstance(item, list) else -1 for item in level}
        if len(lengths) > 1:
            raise ValueError("nested lists of different lengths")
        shape.append(lengths.pop())
        if len(shape) > max_depth:
            raise ValueError(f"nested more than {max_depth} deep, the shape's dimensions")
        level = [leaf for item in level for leaf in item]
    return shape, level


def bytes_from_binary(
    name: str, shape: list[int], datatype: str, size: object, binary: memoryview, offset: int
) -> np.ndarray:
    """BYTES in the binary extension: per element a 4-byte little-endian length, then that many bytes."""
    if type(size) is not int or size < 0:
        raise BadRequest(f"input '{name}': binary_data_size must be a non-negative integer, got {size!r}")
    if offset + size > len(binary):
        raise BadRequest(f"input '{name}': binary_data_size {size} runs past the end of the body")
    raw, position = binary[offset : offset + size], 0
    elements = []
    for index in range(math.prod(shape)):
        if position + 4 > size:
            raise BadRequest(
                f"input '{name}': BYTES element {index} has no complete 4-byte length prefix (binary_data_size {size})"
            )
        length = int(np.frombuffer(raw[position : position + 4], dtype=_LENGTH_PREFIX)[0])
        position += 4
        if position + length > size:
            raise BadRequest(
                f"input '{name}': BYTES element {index} claims {length} bytes, past the end of "
                f"its binary_data_size {size}"
            )
        elements.append(bytes(raw[position : position + length]))
        position += length
    if position != size:
        raise BadRequest(
            f"input '{name}': binary_data_size is {size} but its {math.prod(shape)} BYTES element(s) use {position}"
        )
    array = np.empty(len(elements), dtype=object)
    array[:] = elements
    return array.reshape(shape)


def _as_bytes(item: object) -> bytes:
    return item if isinstance(item, bytes) else str(item).encode("utf-8")


def bytes_to_binary(array: np.ndarray) -> bytes:
    chunks = []
    for item in array.flat:
        raw = _as_bytes(item)
        chunks += [len(raw).to_bytes(4, "little"), raw]
    return b"".join(chunks)


def bytes_to_json(name: str, array: np.ndarray) -> list[str]:
    try:
        return [item.decode("utf-8") if isinstance(item, bytes) else str(item) for item in array.flat]
    except UnicodeDecodeError:
        raise BadRequest(
            f"output '{name}' holds bytes that are not UTF-8, which JSON cannot carry; "
            "ask for it with parameters.binary_data = true"
        ) from None
