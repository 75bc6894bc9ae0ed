"""Batch buckets: padding a batch's rows up to a fixed batch size, cutting the outputs back, and what a model's
graph says about running it per bucket (Conv nodes, control flow)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import onnx

Tensors = dict[str, np.ndarray]
CONV_OPS = frozenset({"Conv", "ConvTranspose", "FusedConv"})
"""Ops whose CUDA kernel rebuilds its cuDNN plan when the input shape differs from its previous run's."""
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})
"""Ops a CUDA graph cannot capture (their work depends on values known only at run time)."""


def bucket_for(rows: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds `rows`; `rows` itself without buckets (or beyond the last one, which
    a validated config never lets a batch reach)."""
    for bucket in buckets:
        if bucket >= rows:
            return bucket
    return rows


def pad_rows(inputs: Tensors, rows: int) -> Tensors:
    """Every input extended on the batch axis to `rows` by repeating its last row. A repeated row is a real
    sample, so padded rows compute like any other: zeros could be invalid input (an all-zero attention mask
    divides by zero in mean pooling) and a NaN in a padded row is still a NaN in the run."""
    padded = {}
    for name, array in inputs.items():
        missing = rows - array.shape[0] if array.ndim else 0  # a scalar input has no rows to pad
        padded[name] = array if missing <= 0 else np.concatenate([array, np.repeat(array[-1:], missing, axis=0)])
    return padded


def cut_rows(outputs: Tensors, rows: int) -> Tensors:
    """The outputs of a padded run without the padded rows (views, no copy)."""
    return {name: array[:rows] if array.ndim else array for name, array in outputs.items()}


@functools.cache
def _op_types_of(path: str, mtime_ns: int) -> frozenset[str]:
    model = onnx.load(path, load_external_data=False)  # the graph only: weights may be gigabytes apart
    found: set[str] = set()
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            found.add(node.op_type)
            for attr in node.attribute:  # If/Loop/Scan bodies are graphs held in attributes
                graphs.extend([attr.g] if attr.HasField("g") else attr.graphs)
    return frozenset(found)


def op_types(path: Path | str) -> frozenset[str]:
    """Every op type in the model's graph and its subgraphs (cached per file and modification time)."""
    path = Path(path)
    return _op_types_of(str(path), path.stat().st_mtime_ns)


def has_conv(path: Path | str) -> bool:
    """Whether the model has a convolution, the op whose CUDA plan depends on the previous run's shape."""
    return bool(op_types(path) & CONV_OPS)


def session_mode(provider: str, wanted: str, buckets: Sequence[int], conv: Callable[[], bool]) -> str:
    """How buckets run without CUDA graphs: "off" (no buckets), "shared" or "per_bucket". "auto" is
    per_bucket only on cuda for a model with a convolution (`conv`, asked only then: it reads the graph),
    the one case measured to re-plan on a shape change (gpu-findings item 2); elsewhere a copy of the
    weights per bucket would buy nothing."""
    if len(buckets) < 2:
        return "shared" if buckets else "off"
    if wanted != "auto":
        return wanted
    return "per_bucket" if provider == "cuda" and conv() else "shared"


def capture_refusal(path: Path | str, dynamic: Sequence[str], string_tensors: bool) -> str | None:
    """Why ORT could not capture this model as a CUDA graph (checked before a session is made), or None.
    Nodes ORT places off CUDA are found only when the session is made: ORT then refuses it itself."""
    if string_tensors:
        return "it has string tensors, which I/O binding (and so a graph's fixed buffers) cannot hold"
    flow = sorted(op_types(path) & CONTROL_FLOW_OPS)
    if flow:
        return f"it has control-flow nodes ({', '.join(flow)}) that a CUDA graph cannot capture"
    if dynamic:
        return f"{list(dynamic)} have dynamic dimensions besides the batch (a graph replays fixed shapes)"
    return None
