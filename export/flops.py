"""FLOPs per sample of an ONNX graph: dense layers, batched MatMuls, convolutions and LSTM/GRU cells."""

from __future__ import annotations

import math

import onnx
from onnx import shape_inference


def flops_per_sample(model: onnx.ModelProto, dims: dict[str, int] | None = None) -> int | None:
    """2 x multiply-adds of MatMul, Gemm, Conv, LSTM and GRU nodes, for one sample (batch axis excluded).

    Symbolic axes other than the batch (a sequence length) take their size from `dims`; None when a
    counted node's size cannot be known that way (elementwise ops, norms and softmax are not counted)."""
    dims = dict(dims or {})
    weights = {init.name: list(init.dims) for init in model.graph.initializer}
    shapes = _shapes(model, dims)
    total = 0
    for node in model.graph.node:
        flops = _node_flops(node, weights, shapes)
        if flops is None:
            return None
        total += flops
    return total


def _node_flops(node: onnx.NodeProto, weights: dict[str, list[int]], shapes: dict[str, list]) -> int | None:
    if node.op_type in ("MatMul", "Gemm"):
        return _matmul(node, weights, shapes)
    if node.op_type == "Conv":
        kernel, out = _static(node.input[1], weights, shapes), shapes.get(node.output[0])
        spatial = out[2:] if out else None
        if kernel is None or not spatial or not all(isinstance(d, int) for d in spatial):
            return None
        return 2 * math.prod(kernel) * math.prod(spatial)
    if node.op_type in ("LSTM", "GRU"):
        w, r = _static(node.input[1], weights, shapes), _static(node.input[2], weights, shapes)
        x = shapes.get(node.input[0])
        layout = next((a.i for a in node.attribute if a.name == "layout"), 0)
        steps = x[layout] if x else None  # layout 0: [seq, batch, in]; 1: [batch, seq, in]
        if w is None or r is None or not isinstance(steps, int):
            return None
        # per step and direction, every gate multiplies the input (W) and the previous state (R)
        return 2 * (math.prod(w) + math.prod(r)) * steps
    return 0


def _static(name: str, weights: dict[str, list[int]], shapes: dict[str, list]) -> list[int] | None:
    """A weight's shape: an initializer's, or (when the exporter computes it, e.g. concatenated gates) inferred."""
    shape = weights.get(name, shapes.get(name))
    return shape if shape is not None and all(isinstance(d, int) for d in shape) else None


def _matmul(node: onnx.NodeProto, weights: dict[str, list[int]], shapes: dict[str, list]) -> int | None:
    a, b = node.input[0], node.input[1]
    if node.op_type == "Gemm" or (b in weights and len(weights[b]) == 2):
        if b not in weights:
            return 0 if node.op_type == "Gemm" else None
        rows = shapes.get(a)
        # dense layer: one weight pass per row; a [batch, seq, d] input makes seq rows per sample
        extra = rows[1:-1] if rows and len(rows) > 2 else []
        if not all(isinstance(d, int) for d in extra):
            return None
        return 2 * math.prod(weights[b]) * math.prod(extra)
    out, left = shapes.get(node.output[0]), shapes.get(a)
    if not out or not left or len(out) < 2:
        return None
    per_sample = out[1:] + [left[-1]]  # attention scores and context: [heads, seq, seq] x inner dim
    if not all(isinstance(d, int) for d in per_sample):
        return None
    return 2 * math.prod(per_sample)


def _shapes(model: onnx.ModelProto, dims: dict[str, int]) -> dict[str, list]:
    """Every value's shape after ONNX shape inference; symbolic sizes replaced from `dims` where given."""
    try:
        inferred = shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # inference is best effort; without shapes only dense FLOPs are counted
        inferred = model
    graph = inferred.graph
    shapes: dict[str, list] = {}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        tensor = value.type.tensor_type
        if tensor.HasField("shape"):
            shapes[value.name] = [
                dims.get(d.dim_param, d.dim_param)
                if d.HasField("dim_param")
                else (d.dim_value if d.HasField("dim_value") else None)
                for d in tensor.shape.dim
            ]
    return shapes
