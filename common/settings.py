"""The batcher and provider settings of a deployment, one set of types for every stage: the server reads them from
its TOML config (server/config.py), the lab and the search plan them, the load tester reads them from a server's
/config, a results file records them and the report names curves by them.

A record of them may be partial: another server says only some of its settings (Triton's model config: a batch size,
a wait, instances), a plan sets only the ones it changes, an older results file lacks settings added since.
`from_mapping` reads such a record (a setting it lacks takes its default, one it does not know is kept aside),
`says` tells which settings it named, and `as_dict` writes back exactly the record's keys, in its order. Settings
built in code say every setting."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, ClassVar, Mapping, Self

BUCKET_SESSIONS = ("auto", "shared", "per_bucket")
GRAPH_OPTIMIZATION_LEVELS = ("disable", "basic", "extended", "all")
EXECUTION_MODES = ("sequential", "parallel")
CONV_ALGO_SEARCHES = ("exhaustive", "heuristic", "default")
ARENA_EXTEND_STRATEGIES = ("next_power_of_two", "same_as_requested")


class SettingsError(ValueError):
    """Settings that contradict themselves (a bound below 1, a choice not offered); the message names the setting."""


class Settings:
    """What the settings types share: reading a partial record, writing it back as it was, checking the values."""

    _said: ClassVar[tuple[str, ...] | None] = None
    """The keys of the record the settings were read from, in its order; None (every setting) for settings built
    in code. Set per instance by from_mapping, never a field: equality, repr and the server's checks see only the
    settings themselves, and dataclasses.replace gives settings built in code."""
    _extra: ClassVar[Mapping[str, Any]] = MappingProxyType({})
    """The record's keys that name no setting of this version (a newer server's), kept to be written back."""

    @classmethod
    def from_mapping(cls, record: Mapping[str, Any]) -> Self:
        """Settings from a record (a /config answer, a results file, a plan): a setting it lacks takes its default,
        a key that names none is kept aside; values are taken as they are (lists as tuples), not checked."""
        known = {f.name: f for f in fields(cls)}
        values = {
            key: tuple(value) if isinstance(value, list) and isinstance(known[key].default, tuple) else value
            for key, value in record.items()
            if key in known
        }
        settings = cls(**values)
        object.__setattr__(settings, "_said", tuple(record))
        object.__setattr__(settings, "_extra", {k: v for k, v in record.items() if k not in known})
        return settings

    @classmethod
    def partial(cls, **settings: Any) -> Self:
        """Settings that name only these (a plan's): the rest is left to whoever reads them (the server's defaults)."""
        return cls.from_mapping(settings)

    def says(self, setting: str) -> bool:
        """Whether the record these settings were read from names `setting` (settings built in code name all)."""
        return self._said is None or setting in self._said

    def as_dict(self) -> dict[str, Any]:
        """The record: the keys it was read with, in its order (every setting for settings built in code), as JSON
        and TOML write them (tuples as lists)."""
        keys = self._said if self._said is not None else [f.name for f in fields(self)]
        return {key: self._extra[key] if key in self._extra else _plain(getattr(self, key)) for key in keys}

    def updated(self, **settings: Any) -> Self:
        """These settings over the record's: a key it has keeps its place, a new one comes last."""
        return self.from_mapping({**self.as_dict(), **settings})

    def without(self, *names: str) -> Self:
        """The record without these settings (whoever reads it then takes their defaults)."""
        return self.from_mapping({k: v for k, v in self.as_dict().items() if k not in names})

    def validate(self) -> None:
        """Raise SettingsError naming the first value out of its range or choices; settings of no range: nothing."""


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    return dict(value) if isinstance(value, dict) else value


@dataclass(frozen=True)
class BatcherSettings(Settings):
    """How a deployment groups requests into batches (Triton's dynamic batcher semantics)."""

    max_batch_size: int = 1
    """Most samples (sum of the requests' batch dimensions) in one model run; 1 turns batching off."""
    max_queue_delay_ms: float = 0.0
    """How long the oldest waiting request may wait for a batch to fill before it is sent anyway."""
    max_queue_size: int = 256
    """Requests allowed to wait; one more is refused with 503 at once."""
    instances: int = 1
    """Batches in flight at once (worker threads sharing the queue)."""
    timeout_ms: float = 10_000.0
    """A request not computed within this long is answered with a timeout error, never computed.
    A request's `parameters.timeout` (µs) may shorten it, never lengthen it."""
    preferred_batch_sizes: tuple[int, ...] = ()
    """Batch sizes worth sending at once, without waiting out the delay (Triton's preferred_batch_size)."""
    adaptive: bool = False
    """Wait for a batch to fill only while waiting is predicted to pay (see server/batching/latency_model.py): a lone
    request at low load is sent at once; max_queue_delay_ms stays the upper bound on any wait."""
    priority_levels: int = 1
    """Priority levels (Triton's): a request's `parameters.priority` 1 (highest) .. priority_levels is served
    before lower levels, FIFO within a level; max_queue_size counts all levels together."""
    default_priority_level: int = 1
    """The level of a request whose `parameters.priority` is 0 or absent; in 1..priority_levels."""
    batch_buckets: tuple[int, ...] = ()
    """The batch sizes a model run may have: a batch is padded (rows repeated, never returned) up to the
    smallest bucket that holds it, so each run has one of a few fixed shapes (ONNX Runtime's CUDA Conv
    rebuilds its cuDNN plan whenever a shape changes). Ascending, >= 1, the last = max_batch_size; [] turns
    it off. Unset: powers of two up to max_batch_size (itself included) on cuda and tensorrt, off on cpu."""
    bucket_sessions: str = "auto"
    """How buckets run: "per_bucket" gives each bucket its own session (the weights once per bucket) so no
    Conv sees a shape other than its last one; "shared" runs every bucket on one session; "auto" is
    per_bucket on cuda for a model with Conv nodes, else shared. With enable_cuda_graph: one session and
    one captured graph per bucket, whatever this says."""

    def validate(self) -> None:
        if self.bucket_sessions not in BUCKET_SESSIONS:
            raise SettingsError(
                f"[batcher] bucket_sessions must be one of {BUCKET_SESSIONS}, got {self.bucket_sessions!r}"
            )
        buckets = self.batch_buckets
        if not all(type(b) is int and b >= 1 for b in buckets) or list(buckets) != sorted(set(buckets)):
            raise SettingsError(f"batch_buckets must be ascending, distinct integers >= 1, got {list(buckets)}")
        if buckets and buckets[-1] != self.max_batch_size:
            raise SettingsError(
                f"the last of batch_buckets must be max_batch_size ({self.max_batch_size}) so every batch has a "
                f"bucket, got {list(buckets)}"
            )
        if self.max_batch_size < 1 or self.max_queue_size < 1 or self.instances < 1:
            raise SettingsError("max_batch_size, max_queue_size and instances must be >= 1")
        if not all(type(p) is int and 1 <= p <= self.max_batch_size for p in self.preferred_batch_sizes):
            raise SettingsError("preferred_batch_sizes must be integers in 1..max_batch_size")
        if self.max_queue_delay_ms < 0 or self.timeout_ms <= 0:
            raise SettingsError("max_queue_delay_ms must be >= 0 and timeout_ms > 0")
        if self.priority_levels < 1 or not 1 <= self.default_priority_level <= self.priority_levels:
            raise SettingsError(
                f"priority_levels must be >= 1 and default_priority_level in 1..priority_levels, got "
                f"{self.priority_levels} and {self.default_priority_level}"
            )


def admitted_bound(batcher: BatcherSettings) -> int:
    """The most infer requests a deployment holds at once: a full queue plus its largest batches in flight
    (a request carries at least one sample, so a batch of max_batch_size samples holds at most that many)."""
    return batcher.max_queue_size + batcher.instances * batcher.max_batch_size


def default_buckets(provider: str, max_batch_size: int) -> tuple[int, ...]:
    """The batch_buckets of settings that leave them unset: powers of two below max_batch_size, then max_batch_size
    itself, on a device; none on the CPU, whose kernels do not depend on the previous run's shape."""
    if provider == "cpu":
        return ()
    sizes = [1 << i for i in range(max_batch_size.bit_length()) if 1 << i < max_batch_size]
    return (*sizes, max_batch_size)


@dataclass(frozen=True)
class PaddingSettings(Settings):
    """Variable-length inputs: requests whose length on `axis` differs share a batch, padded to its longest."""

    axis: int = 1
    """The padded axis (0 is the batch axis, so >= 1), e.g. 1 for a sequence's tokens."""
    values: dict = field(default_factory=dict)
    """Pad value per input name, e.g. {input_ids = 0, attention_mask = 0}. Inputs not named are never padded
    and must agree in shape to share a batch. Empty: padding off, requests grouped by trailing shape."""
    bucket: int = 0
    """Lengths 1..bucket, bucket+1..2*bucket, ... form separate batches, so a short request pads to at most
    bucket-1 extra positions (less wasted compute); 0: any lengths share a batch."""

    def validate(self) -> None:
        if not isinstance(self.values, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in self.values.values()
        ):
            raise SettingsError(f"values must be a table of input name = number, got {self.values!r}")
        if self.axis < 1 or self.bucket < 0:
            raise SettingsError(
                f"axis must be >= 1 (0 is the batch axis) and bucket >= 0, got axis {self.axis} and bucket "
                f"{self.bucket}"
            )


@dataclass(frozen=True)
class CpuOptions(Settings):
    """ONNX Runtime session options that shape CPU execution (they apply on every provider's session)."""

    intra_op_threads: int = 0
    """Threads for one operator; 0 lets ONNX Runtime use every core."""
    inter_op_threads: int = 0
    """Threads running independent operators at once (only with execution_mode = "parallel"); 0: ORT's choice."""
    allow_spinning: bool = True
    """Whether idle ORT threads spin; spinning cuts latency but steals CPU from HTTP threads."""
    graph_optimization_level: str = "all"
    """ORT graph rewrites before the first run: "disable", "basic", "extended" or "all"."""
    execution_mode: str = "sequential"
    """"sequential" runs one operator at a time; "parallel" runs independent branches at once."""

    def validate(self) -> None:
        _choice("[cpu] graph_optimization_level", self.graph_optimization_level, GRAPH_OPTIMIZATION_LEVELS)
        _choice("[cpu] execution_mode", self.execution_mode, EXECUTION_MODES)
        _count("[cpu] intra_op_threads", self.intra_op_threads)
        _count("[cpu] inter_op_threads", self.inter_op_threads)


@dataclass(frozen=True)
class CudaOptions(Settings):
    """ONNX Runtime CUDA provider options (provider = "cuda" or "tensorrt")."""

    device_id: int = 0
    """Which GPU (CUDA's numbering) runs the session and holds the bound inputs and outputs."""
    cudnn_conv_algo_search: str = "exhaustive"
    """How cuDNN picks convolution kernels per shape: "exhaustive" (benchmarks all, best but slow first
    run per shape: warm-up pays it), "heuristic" or "default"."""
    enable_cuda_graph: bool = False
    """Capture one CUDA graph per batch bucket (run option gpu_graph_id) and replay it: cuts kernel-launch
    overhead on small models. Needs every node on CUDA, no control flow (If/Loop/Scan) and no dynamic
    dimension besides the batch; such a model is refused, naming why, unless cuda_graph_fallback."""
    gpu_mem_limit: int = 0
    """Most bytes ORT's device arena may hold; 0: no limit."""
    arena_extend_strategy: str = "next_power_of_two"
    """How the arena grows: "next_power_of_two" (fewer, larger allocations) or "same_as_requested"."""
    copy_in_default_stream: bool = True
    """Copy between host and device on the compute stream (safe); false uses a separate copy stream."""
    cuda_graph_fallback: bool = False
    """With enable_cuda_graph: serve a model that cannot be captured without graphs (said in the log and in
    the deployment's /config, `bucket_runs.cuda_graph`) instead of refusing to start."""
    use_tf32: bool = True
    """Let MatMul and Conv use TF32 tensor cores on Ampere and newer (ORT's default: on): faster, ~1e-3
    relative error in FP32 models. Off gives FP32 results (~1e-7)."""
    fuse_conv_bias: bool = False
    """Let cuDNN fuse a Conv's bias (and activation) into the convolution (ORT's default: off)."""

    def validate(self) -> None:
        _choice("[cuda] cudnn_conv_algo_search", self.cudnn_conv_algo_search, CONV_ALGO_SEARCHES)
        _choice("[cuda] arena_extend_strategy", self.arena_extend_strategy, ARENA_EXTEND_STRATEGIES)
        _count("[cuda] device_id", self.device_id)
        _count("[cuda] gpu_mem_limit", self.gpu_mem_limit)


@dataclass(frozen=True)
class TensorrtOptions(Settings):
    """ONNX Runtime TensorRT provider options (provider = "tensorrt"; CUDA then CPU run what TensorRT cannot)."""

    fp16: bool = False
    """Let TensorRT build FP16 kernels (faster, less precise)."""
    engine_cache_dir: str = ""
    """Folder to keep built engines in, so a restart skips the minutes-long build; empty: no cache."""
    max_workspace_bytes: int = 0
    """Scratch memory TensorRT may use while building; 0: TensorRT's default."""

    def validate(self) -> None:
        _count("[tensorrt] max_workspace_bytes", self.max_workspace_bytes)


TABLES: Mapping[str, type[Settings]] = MappingProxyType(
    {
        "batcher": BatcherSettings,
        "cpu": CpuOptions,
        "cuda": CudaOptions,
        "tensorrt": TensorrtOptions,
        "padding": PaddingSettings,
    }
)
"""The settings of a deployment by the name of their table: in the server's TOML config, in its /config answer and
in a results file's curve alike."""


def _choice(where: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SettingsError(f"{where} must be one of {choices}, got {value!r}")


def _count(where: str, value: int) -> None:
    if value < 0:
        raise SettingsError(f"{where} must be >= 0, got {value}")
