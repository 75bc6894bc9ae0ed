"""latlab.export.flops on hand-built graphs: computed weights, symbolic sequence lengths, unknown sizes."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from latlab.export.flops import flops_per_sample

H, IN, SEQ = 8, 4, 6


def lstm_graph(computed_weights: bool, seq: int | str = "seq") -> onnx.ModelProto:
    """x [seq, batch, IN] -> LSTM(hidden H); W either an initializer or a Concat of two halves (as the
    exporter leaves big gate weights), so both paths are counted."""
    w = np.zeros((1, 4 * H, IN), np.float32)
    r = numpy_helper.from_array(np.zeros((1, 4 * H, H), np.float32), "R")
    nodes = [helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=H)]
    if computed_weights:
        halves = [numpy_helper.from_array(w[:, : 2 * H], "W0"), numpy_helper.from_array(w[:, 2 * H :], "W1")]
        nodes.insert(0, helper.make_node("Concat", ["W0", "W1"], ["W"], axis=1))
        inits = [*halves, r]
    else:
        inits = [numpy_helper.from_array(w, "W"), r]
    graph = helper.make_graph(
        nodes,
        "lstm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, "batch", IN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_lstm_counts_input_and_recurrent_gates_per_step() -> None:
    want = 2 * 4 * H * (IN + H) * SEQ
    assert flops_per_sample(lstm_graph(False), {"seq": SEQ}) == want
    assert flops_per_sample(lstm_graph(True), {"seq": SEQ}) == want  # weights computed at run time
    assert flops_per_sample(lstm_graph(False, seq=SEQ)) == want  # a static sequence needs no dims


def test_unknown_sequence_length_gives_none_not_a_wrong_number() -> None:
    assert flops_per_sample(lstm_graph(False)) is None


def test_conv_counts_kernel_times_output_pixels() -> None:
    kernel = numpy_helper.from_array(np.zeros((16, 3, 3, 3), np.float32), "K")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "K"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[kernel],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    assert flops_per_sample(model) == 2 * 16 * 3 * 3 * 3 * 16 * 16
