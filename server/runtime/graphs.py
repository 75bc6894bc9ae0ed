"""One captured CUDA graph per batch bucket on one session: fixed buffers, a binding and a graph id per bucket."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import onnxruntime as ort

GRAPH_WARMUP_RUNS = 3
"""Runs per bucket before a graph is known to be captured: ORT runs a graph id normally first (allocating
what the graph will reuse), captures it on a later run and replays it from then on."""


@dataclass(frozen=True)
class RunTimings:
    """Where one bound run's time went: host-to-device copy, the run itself, device-to-host copy."""

    input_s: float
    compute_s: float
    output_s: float


@dataclass
class _Bucket:
    inputs: dict[str, ort.OrtValue]
    outputs: dict[str, ort.OrtValue]
    binding: ort.IOBinding
    run_options: ort.RunOptions


class CudaGraphRunner:
    """Runs each bucket through its own fixed-shape, fixed-address device buffers, bound once; on CUDA each
    bucket's run carries the run option `gpu_graph_id` = bucket index + 1, so ORT captures one graph per
    bucket and replays it. With device "cpu" the same buffers, bindings and run options run on ORT's CPU
    provider, which captures nothing: that is how this bookkeeping is tested off a GPU box.

    `inputs` and `outputs` are (name, dtype, shape) with the batch axis first; a run's inputs must already
    have a bucket's batch size (OnnxModel pads them)."""

    def __init__(
        self,
        session: ort.InferenceSession,
        inputs: Sequence[tuple[str, np.dtype, tuple[int, ...]]],
        outputs: Sequence[tuple[str, np.dtype, tuple[int, ...]]],
        buckets: Sequence[int],
        device: str = "cuda",
        device_id: int = 0,
        graph_ids: bool | None = None,
    ) -> None:
        self._session = session
        self.device = device
        # On CUDA always; tests set graph_ids on the CPU device, whose provider ignores the option.
        graph_ids = device == "cuda" if graph_ids is None else graph_ids
        self._buckets: dict[int, _Bucket] = {}
        for index, size in enumerate(buckets):

            def buffer(spec: tuple[str, np.dtype, tuple[int, ...]]) -> ort.OrtValue:
                _, dtype, shape = spec
                return ort.OrtValue.ortvalue_from_shape_and_type(
                    [size, *shape[1:]], np.dtype(dtype).type, device, device_id
                )

            bucket = _Bucket(
                {s[0]: buffer(s) for s in inputs},
                {s[0]: buffer(s) for s in outputs},
                session.io_binding(),
                ort.RunOptions(),
            )
            for name, value in bucket.inputs.items():
                bucket.binding.bind_ortvalue_input(name, value)
            for name, value in bucket.outputs.items():
                bucket.binding.bind_ortvalue_output(name, value)
            if graph_ids:
                bucket.run_options.add_run_config_entry("gpu_graph_id", str(index + 1))
            self._buckets[size] = bucket
        # ORT forbids concurrent Run() on a session with graphs; batches in flight (instances > 1) take turns.
        self._lock = threading.Lock()

    @property
    def buckets(self) -> tuple[int, ...]:
        return tuple(self._buckets)

    def graph_id(self, size: int) -> int | None:
        """The `gpu_graph_id` a bucket's runs carry (None without graph ids)."""
        try:
            return int(self._buckets[size].run_options.get_run_config_entry("gpu_graph_id"))
        except RuntimeError:  # ORT's answer for an entry never set
            return None

    def buffer_address(self, size: int, name: str) -> int:
        """Where a bucket's buffer lives: a captured graph replays on these addresses, so they never move."""
        bucket = self._buckets[size]
        return (bucket.inputs.get(name) or bucket.outputs[name]).data_ptr()

    def run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> tuple[dict[str, np.ndarray], RunTimings]:
        """Copy the inputs into the bucket's buffers, replay its graph, copy the asked outputs out."""
        rows = next(iter(inputs.values())).shape[0]
        bucket = self._buckets.get(rows)
        if bucket is None:
            raise ValueError(f"a batch of {rows} rows has no CUDA graph bucket (buckets {self.buckets})")
        with self._lock:
            started = time.perf_counter()
            for name, array in inputs.items():
                bucket.inputs[name].update_inplace(np.ascontiguousarray(array))
            copied_in = time.perf_counter()
            self._session.run_with_iobinding(bucket.binding, bucket.run_options)
            computed = time.perf_counter()
            results = {name: bucket.outputs[name].numpy() for name in outputs}
        return results, RunTimings(copied_in - started, computed - copied_in, time.perf_counter() - computed)
