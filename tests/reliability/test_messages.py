"""What a client may read of a server-side error: one line, no file paths, no C++ frames, bounded."""

from __future__ import annotations

import pytest

from latlab.server.errors import one_line, public_message
from latlab.server.protocol import MAX_ERROR_LENGTH, encode_error

ORT_LOAD_ERROR = (
    "[ONNXRuntimeError] : 1 : FAIL : Load model from /srv/models/secret/model.onnx failed:"
    "/onnxruntime_src/onnxruntime/core/graph/model.cc:256 onnxruntime::Model::Model(onnx::ModelProto&&, "
    "const onnxruntime::PathString&, const onnxruntime::logging::Logger&) Unsupported model IR version: 99\n"
)
CUDA_ERROR = (
    "CUDA failure 2: out of memory ; GPU=0 ; hostname=box ; "
    "file=/onnxruntime_src/onnxruntime/core/providers/cuda/cuda_allocator.cc ; line=47"
)


@pytest.mark.parametrize(
    "raw, kept, gone",
    [
        (
            ORT_LOAD_ERROR,
            ["Load model from <path>", "Unsupported model IR version: 99"],
            ["/srv/models", "model.cc", "onnxruntime::Model::Model", "\n"],
        ),
        (CUDA_ERROR, ["CUDA failure 2: out of memory", "file=<path>"], ["cuda_allocator.cc", "/onnxruntime_src"]),
        (
            "indices element out of data bounds, idx=99 must be within the inclusive range [-8,7]",
            ["idx=99 must be within the inclusive range [-8,7]"],
            ["<path>"],
        ),
        ("ratio 3/4 and a/b stay", ["ratio 3/4 and a/b stay"], ["<path>"]),
    ],
)
def test_public_message_keeps_the_cause_and_drops_paths(raw: str, kept: list[str], gone: list[str]) -> None:
    message = public_message(RuntimeError(raw))
    for fragment in kept:
        assert fragment in message, message
    for fragment in gone:
        assert fragment not in message, message


def test_public_message_is_bounded() -> None:
    assert len(public_message(RuntimeError("x" * 10_000))) == 303


def test_one_line_joins_lines() -> None:
    assert one_line("a\n  b\r\nc\n") == "a b c"


def test_error_bodies_are_bounded() -> None:
    assert len(encode_error("y" * 100_000)) < MAX_ERROR_LENGTH + 20
