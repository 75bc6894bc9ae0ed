"""The fp16 variant of an exported model, for GPU deployments: weights and compute in half precision.

It is written as its own model folder, models/<name>-fp16/ (model.onnx + metadata.json), so a serving
config deploys it like any other model, side by side with the fp32 one. Inputs and outputs stay FP32
(keep_io_types): clients send the same tensors to both; the casts sit inside the graph.
"""

from __future__ import annotations

from pathlib import Path

import onnx

FP16_SUFFIX = "-fp16"
# fp16 has an 11-bit significand (~3 decimal digits); through several layers 1% of the output scale is
# what a healthy conversion reaches, and an overflow or a broken cast misses it by orders of magnitude
FP16_MAX_REL_ERROR = 1e-2


def convert(model: onnx.ModelProto) -> onnx.ModelProto:
    """A half-precision copy of the graph; I/O types unchanged; ORT's default list of fp32-only ops kept."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    converted = convert_float_to_float16(model, keep_io_types=True)
    _sort_nodes(converted.graph)
    return converted


def _sort_nodes(graph: onnx.GraphProto) -> None:
    """Put nodes in topological order: the converter appends its input casts last, which the checker refuses."""
    ready = {v.name for v in graph.input} | {i.name for i in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        runnable = [n for n in pending if all(i in ready for i in n.input)]
        if not runnable:  # a cycle or outer-scope names: keep what is left in its order rather than loop
            ordered.extend(pending)
            break
        for node in runnable:
            ready.update(node.output)
        ordered.extend(runnable)
        pending = [n for n in pending if not any(n is r for r in runnable)]
    copies = [onnx.NodeProto.FromString(n.SerializeToString()) for n in ordered]
    del graph.node[:]
    graph.node.extend(copies)


def fp16_folder(models_dir: Path, name: str) -> Path:
    """Where the fp16 variant of model `name` goes."""
    return Path(models_dir) / f"{name}{FP16_SUFFIX}"
