"""A user model's inputs for the lab: which declared signatures it can load (a dynamic batch axis, numeric
types), the size of every other dynamic axis (--dim, or the sample file's), and inputs generated from the
declared shapes and types. Pure numpy: each check raises ValueError with one line naming the input."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from latlab.loadtest.payloads import BODY_BUDGET_BYTES, random_tensor

SAMPLE_ROWS = 16
"""Rows generated from the declared shapes (fewer for big inputs): the requests vary without holding much."""
SEED = 0
LAB_TYPES = {
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(bool)": "BOOL",
}
"""ONNX Runtime's input types the lab generates and sends, with their protocol datatypes."""


@dataclass(frozen=True)
class InputSpec:
    """A declared model input as ONNX Runtime reads it: each axis a size, a symbolic name, or None (unnamed)."""

    name: str
    type: str
    shape: tuple[int | str | None, ...]


def check_batch_and_types(specs: list[InputSpec]) -> None:
    """Every input a type the lab can send and a dynamic first axis, the batch."""
    for spec in specs:
        if spec.type not in LAB_TYPES:
            raise ValueError(
                f"input '{spec.name}' has type {spec.type}, which the lab cannot generate or send "
                f"(it takes float, int, uint and bool tensors)"
            )
        if not spec.shape:
            raise ValueError(
                f"input '{spec.name}' is a scalar: it has no batch axis (the lab batches requests "
                f"along a dynamic first axis)"
            )
        if isinstance(spec.shape[0], int):
            raise ValueError(
                f"input '{spec.name}' has no batch axis: its first axis is fixed at {spec.shape[0]} "
                f"(the lab batches requests along a dynamic first axis; export the model with one)"
            )


PLACEHOLDER_NAMES = {"", "?"}
"""Axis names some exporters give every dynamic axis: no name at all, so each such axis goes by its position."""


def _position(spec: InputSpec, axis: int) -> str:
    return f"{spec.name}:{axis}"


def _axis_key(spec: InputSpec, axis: int) -> str:
    """An axis's --dim key: its symbolic name (shared by every input that names it), or INPUT:AXIS for an unnamed
    or placeholder-named one."""
    dim = spec.shape[axis]
    return dim if isinstance(dim, str) and dim not in PLACEHOLDER_NAMES else _position(spec, axis)


def _dynamic_axes(specs: list[InputSpec]) -> list[tuple[InputSpec, int, str]]:
    """(input, axis, --dim key) of every dynamic axis after the batch."""
    return [
        (spec, axis, _axis_key(spec, axis))
        for spec in specs
        for axis, dim in enumerate(spec.shape[1:], 1)
        if not isinstance(dim, int)
    ]


def by_name(specs: list[InputSpec], dims: dict[str, int]) -> dict[str, int]:
    """`dims` with INPUT:AXIS keys of named axes turned into their names, so a named axis can be given either
    way; ValueError where both ways give it different sizes."""
    named = {_position(spec, axis): key for spec, axis, key in _dynamic_axes(specs) if key != _position(spec, axis)}
    found: dict[str, int] = {}
    for key, size in dims.items():
        name = named.get(key, key)
        if name in found and found[name] != size:
            raise ValueError(f"--dim {key}={size}, but the axis '{name}' is also given {found[name]}")
        found[name] = size
    return found


def row_shapes(specs: list[InputSpec], dims: dict[str, int]) -> dict[str, tuple[int, ...]]:
    """Each input's shape past the batch axis, its dynamic axes sized by `dims`; ValueError for a dynamic axis
    without a size (naming the --dim to give) and for a --dim that names no dynamic axis."""
    axes = _dynamic_axes(specs)
    dims = by_name(specs, dims)
    batch_names = {spec.shape[0] for spec in specs if isinstance(spec.shape[0], str)}
    known = list(dict.fromkeys(key for _, _, key in axes))
    for key in dims:
        if key in batch_names and key not in known:
            raise ValueError(f"--dim {key}: '{key}' is the batch axis, which the lab sets itself (batching off and on)")
        if key not in known:
            raise ValueError(
                f"--dim {key}: the model has no dynamic axis of that name; its dynamic axes besides "
                f"the batch: {', '.join(known) or 'none'}"
            )
    for spec, axis, key in axes:
        if key not in dims:
            what = "is dynamic and unnamed" if key == _position(spec, axis) else f"('{key}') is dynamic"
            raise ValueError(
                f"input '{spec.name}' axis {axis} {what}: give its size with --dim {key}=N "
                f"(e.g. --dim {key}=128), or real inputs with --inputs samples.npz"
            )
    return {
        spec.name: tuple(
            d if isinstance(d, int) else dims[_axis_key(spec, axis)] for axis, d in enumerate(spec.shape[1:], 1)
        )
        for spec in specs
    }


def sample_dims(specs: list[InputSpec], samples: dict[str, np.ndarray], dims: dict[str, int]) -> dict[str, int]:
    """The sizes the samples give the dynamic axes, checked against each other (inputs sharing an axis name)
    and against --dim; with the --dim values that name no axis, for row_shapes to refuse."""
    found: dict[str, tuple[int, str]] = {}
    dims = by_name(specs, dims)
    for spec, axis, key in _dynamic_axes(specs):
        size = samples[spec.name].shape[axis]
        if key in dims and dims[key] != size:
            raise ValueError(
                f"--dim {key}={dims[key]}, but the samples of input '{spec.name}' have {size} on axis {axis}"
            )
        if key in found and found[key][0] != size:
            raise ValueError(
                f"inputs '{found[key][1]}' and '{spec.name}' share the axis '{key}', but their "
                f"samples have {found[key][0]} and {size} on it"
            )
        found[key] = (size, spec.name)
    return {**dims, **{key: size for key, (size, _) in found.items()}}


def generate_samples(specs: list[InputSpec], shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Random valid inputs, rows first: floats from N(0, 1), small integer ids, masks of ones (as the load
    generator's random bodies); SAMPLE_ROWS rows, fewer when a row is big."""

    def draw(rows: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(SEED)
        return {
            s.name: random_tensor(rng, {"name": s.name, "datatype": LAB_TYPES[s.type]}, [rows, *shapes[s.name]])
            for s in specs
        }

    return draw(max(1, min(SAMPLE_ROWS, BODY_BUDGET_BYTES // max(row_bytes(draw(1)), 1))))


def row_bytes(samples: dict[str, np.ndarray]) -> int:
    """The bytes of one request's tensors (one row of each input)."""
    return sum(a[:1].nbytes for a in samples.values())
