"""Typed server settings in one TOML file: the server block and its deployments, read and written here."""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Mapping

import tomli_w

from latlab.server.errors import ConfigError

PROVIDERS = ("cpu", "cuda", "tensorrt")
GRAPH_OPTIMIZATION_LEVELS = ("disable", "basic", "extended", "all")
EXECUTION_MODES = ("sequential", "parallel")
CONV_ALGO_SEARCHES = ("exhaustive", "heuristic", "default")
ARENA_EXTEND_STRATEGIES = ("next_power_of_two", "same_as_requested")
LOAD_FAILURE_POLICIES = ("fail", "skip")
BUCKET_SESSIONS = ("auto", "shared", "per_bucket")
AUTH_TOKEN_ENV = "LATLAB_AUTH_TOKEN"
FRONTENDS_ENV = "LATLAB_FRONTENDS"
"""Overrides [server] frontends (as `latlab serve --frontends` does, which wins): a container's setting, and how
the suite runs every test of the real server with several front ends."""
MAX_FRONTENDS = 64
"""Front-end processes a server may run (the [server] frontends bound): each owns one row of the admission counts
the processes share (server/processes/shared.py)."""
MIN_TOKEN_LENGTH = 16
# RFC 6750's b64token: what may follow "Bearer " in an Authorization header.
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


@dataclass(frozen=True)
class BatcherSettings:
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


@dataclass(frozen=True)
class PaddingSettings:
    """Variable-length inputs: requests whose length on `axis` differs share a batch, padded to its longest."""

    axis: int = 1
    """The padded axis (0 is the batch axis, so >= 1), e.g. 1 for a sequence's tokens."""
    values: dict = field(default_factory=dict)
    """Pad value per input name, e.g. {input_ids = 0, attention_mask = 0}. Inputs not named are never padded
    and must agree in shape to share a batch. Empty: padding off, requests grouped by trailing shape."""
    bucket: int = 0
    """Lengths 1..bucket, bucket+1..2*bucket, ... form separate batches, so a short request pads to at most
    bucket-1 extra positions (less wasted compute); 0: any lengths share a batch."""


@dataclass(frozen=True)
class TokenizerSettings:
    """A text deployment's tokenizer: the model then takes a BYTES input of UTF-8 sentences (see runtime/text.py)."""

    file: Path = Path()
    """The model's own tokenizer.json (Hugging Face `tokenizers`), relative to the config file's folder."""
    max_length: int = 0
    """Most tokens per sentence ([CLS] and [SEP] included); longer sentences are cut there, and every
    response says how many of its sentences were (parameters.truncated)."""


MAX_TOKENIZER_LENGTH = 8192


@dataclass(frozen=True)
class CpuOptions:
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


@dataclass(frozen=True)
class CudaOptions:
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


@dataclass(frozen=True)
class TensorrtOptions:
    """ONNX Runtime TensorRT provider options (provider = "tensorrt"; CUDA then CPU run what TensorRT cannot)."""

    fp16: bool = False
    """Let TensorRT build FP16 kernels (faster, less precise)."""
    engine_cache_dir: str = ""
    """Folder to keep built engines in, so a restart skips the minutes-long build; empty: no cache."""
    max_workspace_bytes: int = 0
    """Scratch memory TensorRT may use while building; 0: TensorRT's default."""


@dataclass(frozen=True)
class DeploymentConfig:
    """One served model: an ONNX file on one execution provider behind one batcher."""

    name: str
    model_path: Path
    provider: str = "cpu"
    batcher: BatcherSettings = field(default_factory=BatcherSettings)
    cpu: CpuOptions = field(default_factory=CpuOptions)
    cuda: CudaOptions = field(default_factory=CudaOptions)
    tensorrt: TensorrtOptions = field(default_factory=TensorrtOptions)
    warmup: bool = True
    """Run every batch size the batcher can form once, with zeros, before the deployment reports ready."""
    padding: PaddingSettings = field(default_factory=PaddingSettings)
    model: str = ""
    """The model's name (e.g. 'ffn') as opposed to the deployment's; label for metrics and reports."""
    allow_non_finite: bool = False
    """Whether floating-point inputs may hold NaN or ±Inf. Off by default: a model fed NaN answers NaN
    (or garbage) with a 200, so such a request is refused with 400 naming the input. JSON cannot carry
    them anyway (orjson refuses `NaN` and numbers beyond the datatype's range); this guards binary data."""
    tokenizer: TokenizerSettings | None = None
    """When set, the deployment takes text (a [deployments.tokenizer] table) instead of token tensors."""
    engine: str = ""
    """With [server] frontends >= 2: the engine process that serves it. Deployments of one engine share its
    interpreter; each engine has its own. Empty: one engine per device ("cpu", or "cuda:N" for CUDA and
    TensorRT on GPU N)."""

    @property
    def engine_key(self) -> str:
        if self.engine:
            return self.engine
        return "cpu" if self.provider == "cpu" else f"cuda:{self.cuda.device_id}"


def engine_groups(deployments: tuple[DeploymentConfig, ...]) -> list[str]:
    """The engines of a multi-front-end server, in order of their first deployment (engine 0 also serves the
    observer port)."""
    return list(dict.fromkeys(d.engine_key for d in deployments))


@dataclass(frozen=True)
class ServerConfig:
    """The whole server: where it listens and what it serves."""

    deployments: tuple[DeploymentConfig, ...]
    host: str = "127.0.0.1"
    """Loopback by default; any other address is reachable from other machines (logged as a warning)."""
    port: int = 8000
    metrics_port: int = 0
    """The observer port: /metrics, /v2/health/live and /ready and the other GET routes (metadata, config) on
    threads of their own, so they never wait behind infer requests (the main port answers them too). 0: port
    + 1 (8001 by default), or a free port when that one is taken (logged, and in GET /v2 as metrics_port)."""
    frontends: int = 1
    """HTTP processes. 1: one process reads requests, batches and runs the model. N >= 2: N front-end processes
    read, decode and tokenize requests and encode answers, and hand the tensors to one engine process that owns
    the batchers and sessions (server/processes/engine.py), so batches still form from every request. Admission, routes
    and /metrics are the same either way; docs/performance.md measures when more than one pays."""
    threads: int = 0
    """Request threads (of each front end). 0: one for every infer request the deployments admit (max_queue_size
    + instances x max_batch_size each) plus SPARE_THREADS (4). Set by hand, it must exceed those requests."""
    admission: bool = True
    """Refuse an infer request with 503 + Retry-After, before reading its body, when its deployment already
    holds max_queue_size + instances x max_batch_size requests. false drops that bound and the check of
    threads: requests beyond the threads then wait unseen in the WSGI server's queue (the failure measured
    in docs/overload.md); for such measurements only."""
    max_body_bytes: int = 64 * 1024 * 1024
    """Longest request body; a longer one is answered 413 before it is read whole."""
    auth_token: str = field(default="", repr=False)
    """When set (or LATLAB_AUTH_TOKEN, which wins), infer and .../config need `Authorization: Bearer
    <token>`; health, metadata, /metrics and the OpenAPI description stay open. At least 16 characters
    of RFC 6750's token alphabet. Empty: no authentication."""
    model_dir: Path | None = None
    """When set, every deployment's model_path must resolve (symlinks followed) inside this folder,
    or the config is refused. Relative to the config file's folder, like model paths."""
    on_load_failure: str = "fail"
    """What a deployment that cannot load does. "fail": the server stops at start, naming the file and the
    cause, in one line. "skip": the others are served; the broken one answers 503 with its load error on every route and
    /v2/health/ready says not ready (400). At least one deployment must load either way."""


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> ServerConfig:
    """Read and check a TOML server config; relative paths are resolved against its folder.
    `environ` (default: the process's) may supply the auth token as LATLAB_AUTH_TOKEN."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    token = (os.environ if environ is None else environ).get(AUTH_TOKEN_ENV)
    if token:
        doc["server"] = {**_table(doc.get("server", {}), "[server]"), "auth_token": token}
    return parse_config(doc, base_dir=path.parent)


def served_config(config_path: str | Path, frontends: int | None = None) -> ServerConfig:
    """The config file with `frontends` (the command line's), else LATLAB_FRONTENDS, over [server] frontends: what
    every process of a server serves with."""
    config = load_config(config_path)
    frontends = frontends or int(os.environ.get(FRONTENDS_ENV) or 0) or None
    return config if frontends is None else with_overrides(config, frontends=frontends)


def parse_config(doc: dict, base_dir: Path = Path(".")) -> ServerConfig:
    """Build a ServerConfig from a parsed TOML document."""
    server = _table(doc.get("server", {}), "[server]")
    model_dir = _model_dir(server.pop("model_dir", None), base_dir)
    raw_deployments = doc.get("deployments")
    if not isinstance(raw_deployments, list) or not raw_deployments:
        raise ConfigError("config needs at least one [[deployments]] table")
    if not all(isinstance(raw, dict) for raw in raw_deployments):
        raise ConfigError("each entry of 'deployments' must be a table ([[deployments]])")
    deployments = tuple(_deployment(raw, base_dir) for raw in raw_deployments)
    names = [d.name for d in deployments]
    if len(set(names)) != len(names):
        raise ConfigError(f"deployment names must be unique, got {names}")
    if model_dir is not None:
        for deployment in deployments:
            _check_inside(model_dir, deployment)
    config = _build(ServerConfig, server, "[server]", deployments=deployments, model_dir=model_dir)
    _check_server(config)
    return _with_threads(config)


# The tables a [[deployments]] entry may hold, and the settings each one becomes.
_DEPLOYMENT_TABLES = {
    "batcher": BatcherSettings,
    "cpu": CpuOptions,
    "cuda": CudaOptions,
    "tensorrt": TensorrtOptions,
    "padding": PaddingSettings,
    "tokenizer": TokenizerSettings,
}


def dumps_config(doc: Mapping[str, Any]) -> str:
    """A server config as the TOML text load_config reads back. `doc` has the shape parse_config takes:
    {"server": {...}, "deployments": [{"name": ..., "model_path": ..., "batcher": {...}, "cpu": {...}, ...}]},
    with Path values allowed and None meaning "not set". Unknown settings and values of the wrong type are
    refused here, as the loader would refuse them; ranges, files and threads are checked when it loads."""
    unknown = set(doc) - {"server", "deployments"}
    if unknown:
        raise ConfigError(f"a config holds [server] and [[deployments]] only, got {sorted(unknown)}")
    plain = _plain(doc)
    _check_settings(ServerConfig, _table(plain.get("server", {}), "[server]"), "[server]")
    for deployment in plain.get("deployments", []):
        deployment = _table(deployment, "each entry of 'deployments'")
        where = f"deployment '{deployment.get('name')}'"
        tables = {key: deployment[key] for key in _DEPLOYMENT_TABLES if key in deployment}
        _check_settings(DeploymentConfig, {k: v for k, v in deployment.items() if k not in tables}, where)
        for key, table in tables.items():
            _check_settings(_DEPLOYMENT_TABLES[key], _table(table, f"{where} {key}"), f"{where} [{key}]")
    return tomli_w.dumps(plain)


def save_config(doc: Mapping[str, Any], path: str | Path) -> Path:
    """Write dumps_config(doc) to `path` and return it; the loader reads relative paths in `doc` against its folder."""
    path = Path(path)
    path.write_text(dumps_config(doc))
    return path


def _plain(value: object) -> Any:
    """`value` with what TOML cannot hold made plain: paths as strings, tuples as lists, None keys left out."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value) if isinstance(value, Path) else value


def with_overrides(config: ServerConfig, **server: Any) -> ServerConfig:
    """The config with [server] settings overridden on the command line, checked as if the file said them."""
    replaced = dataclasses.replace(config, **server)
    _check_server(replaced)
    return replaced


# Request threads. Granian hands each request to one of a fixed number of Python threads; a request that finds none
# free waits in Granian's own queue, where no metric, no queue bound and no Retry-After sees it (docs/overload.md).
# So every request a deployment admits (server/batching/admission.py) must have a thread, with threads to spare for
# refusing the rest and for the other routes: the bound is per deployment, and `threads` must exceed their sum.

SPARE_THREADS = 4
"""Request threads beyond the admitted requests: they refuse the excess (tens of µs each, under the GIL) and
answer the other routes on the main port. More only contend for the GIL: under a storm of refusals 16 spares
refused fewer requests per second than 4 and slowed /metrics on the observer port (docs/overload.md)."""


def admitted_bound(batcher: BatcherSettings) -> int:
    """The most infer requests a deployment holds at once: a full queue plus its largest batches in flight
    (a request carries at least one sample, so a batch of max_batch_size samples holds at most that many)."""
    return batcher.max_queue_size + batcher.instances * batcher.max_batch_size


def auto_threads(deployments: Iterable[DeploymentConfig]) -> int:
    """Request threads for every admitted request of every deployment, plus SPARE_THREADS."""
    return sum(admitted_bound(d.batcher) for d in deployments) + SPARE_THREADS


def check_threads(threads: int, deployments: Iterable[DeploymentConfig]) -> None:
    """Refuse a thread count that admitted requests could use up: the excess would then wait unseen."""
    deployments = tuple(deployments)
    admitted = sum(admitted_bound(d.batcher) for d in deployments)
    if threads <= admitted:
        parts = ", ".join(
            f"'{d.name}' {d.batcher.max_queue_size} + {d.batcher.instances} x {d.batcher.max_batch_size}"
            for d in deployments
        )
        raise ConfigError(
            f"[server]: threads = {threads} must exceed the {admitted} infer requests the deployments "
            f"admit (max_queue_size + instances x max_batch_size: {parts}), or requests past the "
            f"threads wait where nothing refuses them; leave threads unset "
            f"({admitted + SPARE_THREADS}) or lower max_queue_size"
        )


def _with_threads(config: ServerConfig) -> ServerConfig:
    """threads resolved (0: enough for every admitted request) and, with admission on, checked against them."""
    if config.threads == 0:
        return dataclasses.replace(config, threads=auto_threads(config.deployments))
    if config.admission:
        check_threads(config.threads, config.deployments)
    return config


def _model_dir(value: object, base_dir: Path) -> Path | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"[server]: model_dir must be a folder path, got {value!r}")
    folder = (base_dir / value).resolve()
    if not folder.is_dir():
        raise ConfigError(f"[server]: model_dir {folder} is not a folder")
    return folder


def _check_inside(model_dir: Path, deployment: DeploymentConfig) -> None:
    """Refuse a model file outside model_dir, however it gets there ('..', absolute path, symlink)."""
    resolved = Path(deployment.model_path).resolve()
    if not resolved.is_relative_to(model_dir):
        raise ConfigError(
            f"deployment '{deployment.name}': model_path {deployment.model_path} resolves to "
            f"{resolved}, outside model_dir {model_dir}"
        )


def _check_server(config: ServerConfig) -> None:
    if config.on_load_failure not in LOAD_FAILURE_POLICIES:
        raise ConfigError(
            f"[server]: on_load_failure must be one of {LOAD_FAILURE_POLICIES}, got {config.on_load_failure!r}"
        )
    if not 1 <= config.frontends <= MAX_FRONTENDS:
        raise ConfigError(
            f"[server]: frontends must be 1..{MAX_FRONTENDS} (1: one process serves), got {config.frontends}"
        )
    if config.max_body_bytes < 1 or config.threads < 0:
        raise ConfigError("[server]: max_body_bytes must be >= 1 and threads >= 0 (0: as many as admission needs)")
    if not 0 <= config.metrics_port <= 65535 or config.metrics_port and config.metrics_port == config.port:
        raise ConfigError(
            f"[server]: metrics_port must be in 0..65535 (0: port + 1) and differ from port, got {config.metrics_port}"
        )
    token = config.auth_token
    if token and (len(token) < MIN_TOKEN_LENGTH or not _TOKEN.fullmatch(token)):
        # The token itself is never part of a message.
        raise ConfigError(
            f"[server]: auth_token (or {AUTH_TOKEN_ENV}) must be at least {MIN_TOKEN_LENGTH} "
            "characters of letters, digits and -._~+/ (then optional '=')"
        )


def _deployment(raw: dict, base_dir: Path) -> DeploymentConfig:
    raw = dict(raw)
    name = raw.get("name")
    if not isinstance(name, str) or not name or "/" in name:
        raise ConfigError(f"every deployment needs a 'name' without '/', got {name!r}")
    if "model_path" not in raw:
        raise ConfigError(f"deployment '{name}' needs a 'model_path'")
    model_path = Path(raw.pop("model_path"))
    if not model_path.is_absolute():
        model_path = (base_dir / model_path).resolve()
    provider = raw.get("provider", "cpu")
    if provider not in PROVIDERS:
        raise ConfigError(f"deployment '{name}': provider must be one of {PROVIDERS}, got {provider!r}")
    batcher_table = _table(raw.pop("batcher", {}), f"deployment '{name}' batcher")
    _tuple_setting(batcher_table, "preferred_batch_sizes", name)
    _tuple_setting(batcher_table, "batch_buckets", name)
    batcher = _build(BatcherSettings, batcher_table, f"deployment '{name}' [batcher]")
    batcher = _with_buckets(batcher, provider, name, explicit="batch_buckets" in batcher_table)
    if batcher.max_batch_size < 1 or batcher.max_queue_size < 1 or batcher.instances < 1:
        raise ConfigError(f"deployment '{name}': max_batch_size, max_queue_size and instances must be >= 1")
    if not all(type(p) is int and 1 <= p <= batcher.max_batch_size for p in batcher.preferred_batch_sizes):
        raise ConfigError(f"deployment '{name}': preferred_batch_sizes must be integers in 1..max_batch_size")
    if batcher.max_queue_delay_ms < 0 or batcher.timeout_ms <= 0:
        raise ConfigError(f"deployment '{name}': max_queue_delay_ms must be >= 0 and timeout_ms > 0")
    if batcher.priority_levels < 1 or not 1 <= batcher.default_priority_level <= batcher.priority_levels:
        raise ConfigError(
            f"deployment '{name}': priority_levels must be >= 1 and default_priority_level in "
            f"1..priority_levels, got {batcher.priority_levels} and {batcher.default_priority_level}"
        )
    padding = _padding(_table(raw.pop("padding", {}), f"deployment '{name}' padding"), name)
    cpu, cuda, tensorrt = _provider_options(raw, name, batcher)
    tokenizer = _tokenizer(raw.pop("tokenizer", None), name, base_dir)
    raw.setdefault("model", model_path.parent.name)
    return _build(
        DeploymentConfig,
        raw,
        f"deployment '{name}'",
        model_path=model_path,
        batcher=batcher,
        cpu=cpu,
        cuda=cuda,
        tensorrt=tensorrt,
        padding=padding,
        tokenizer=tokenizer,
    )


def _tokenizer(value: object, name: str, base_dir: Path) -> TokenizerSettings | None:
    """[deployments.tokenizer]: `file` must name an existing file, `max_length` a sensible token count."""
    if value is None:
        return None
    table = _table(value, f"deployment '{name}' tokenizer")
    where = f"deployment '{name}' [tokenizer]"
    raw_file = table.pop("file", None)
    if not isinstance(raw_file, str) or not raw_file:
        raise ConfigError(f"{where}: file must name the model's tokenizer.json, got {raw_file!r}")
    if "max_length" not in table:
        raise ConfigError(f"{where}: max_length is required (tokens per sentence, e.g. 256 for all-MiniLM-L6-v2)")
    settings = _build(TokenizerSettings, table, where, file=(base_dir / raw_file).resolve())
    if not 2 < settings.max_length <= MAX_TOKENIZER_LENGTH:
        raise ConfigError(f"{where}: max_length must be in 3..{MAX_TOKENIZER_LENGTH}, got {settings.max_length}")
    if not settings.file.is_file():
        raise ConfigError(
            f"{where}: file {settings.file} does not exist (latlab export minilm writes "
            "tokenizer/tokenizer.json beside model.onnx)"
        )
    return settings


def _tuple_setting(table: dict, key: str, name: str) -> None:
    """A list setting of the [batcher] table, as a tuple (frozen settings stay hashable)."""
    if key in table:
        if not isinstance(table[key], list):
            raise ConfigError(f"deployment '{name}': {key} must be a list, got {table[key]!r}")
        table[key] = tuple(table[key])


def default_buckets(provider: str, max_batch_size: int) -> tuple[int, ...]:
    """Powers of two below max_batch_size, then max_batch_size itself, on a device; none on the CPU, whose
    kernels do not depend on the previous run's shape."""
    if provider == "cpu":
        return ()
    sizes = [1 << i for i in range(max_batch_size.bit_length()) if 1 << i < max_batch_size]
    return (*sizes, max_batch_size)


def _with_buckets(batcher: BatcherSettings, provider: str, name: str, explicit: bool) -> BatcherSettings:
    """The batcher settings with batch_buckets resolved (when not `explicit`: the provider's default) and
    checked."""
    if batcher.bucket_sessions not in BUCKET_SESSIONS:
        raise ConfigError(
            f"deployment '{name}': [batcher] bucket_sessions must be one of {BUCKET_SESSIONS}, "
            f"got {batcher.bucket_sessions!r}"
        )
    buckets = batcher.batch_buckets
    if not explicit:
        return dataclasses.replace(batcher, batch_buckets=default_buckets(provider, batcher.max_batch_size))
    if not all(type(b) is int and b >= 1 for b in buckets) or list(buckets) != sorted(set(buckets)):
        raise ConfigError(
            f"deployment '{name}': batch_buckets must be ascending, distinct integers >= 1, got {list(buckets)}"
        )
    if buckets and buckets[-1] != batcher.max_batch_size:
        raise ConfigError(
            f"deployment '{name}': the last of batch_buckets must be max_batch_size "
            f"({batcher.max_batch_size}) so every batch has a bucket, got {list(buckets)}"
        )
    return batcher


def _padding(table: dict, name: str) -> PaddingSettings:
    values = table.get("values", {})
    if not isinstance(values, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in values.values()
    ):
        raise ConfigError(
            f"deployment '{name}' [padding]: values must be a table of input name = number, got {values!r}"
        )
    padding = _build(PaddingSettings, table, f"deployment '{name}' [padding]")
    if padding.axis < 1 or padding.bucket < 0:
        raise ConfigError(
            f"deployment '{name}' [padding]: axis must be >= 1 (0 is the batch axis) and bucket >= 0, "
            f"got axis {padding.axis} and bucket {padding.bucket}"
        )
    return padding


def _provider_options(
    raw: dict, name: str, batcher: BatcherSettings
) -> tuple[CpuOptions, CudaOptions, TensorrtOptions]:
    """The [cpu], [cuda] and [tensorrt] tables of a deployment, each value checked against its choices."""
    tables = {key: _table(raw.pop(key, {}), f"deployment '{name}' {key}") for key in ("cpu", "cuda", "tensorrt")}
    cpu = _build(CpuOptions, tables["cpu"], f"deployment '{name}' [cpu]")
    cuda = _build(CudaOptions, tables["cuda"], f"deployment '{name}' [cuda]")
    tensorrt = _build(TensorrtOptions, tables["tensorrt"], f"deployment '{name}' [tensorrt]")
    for where, value, choices in (
        ("[cpu] graph_optimization_level", cpu.graph_optimization_level, GRAPH_OPTIMIZATION_LEVELS),
        ("[cpu] execution_mode", cpu.execution_mode, EXECUTION_MODES),
        ("[cuda] cudnn_conv_algo_search", cuda.cudnn_conv_algo_search, CONV_ALGO_SEARCHES),
        ("[cuda] arena_extend_strategy", cuda.arena_extend_strategy, ARENA_EXTEND_STRATEGIES),
    ):
        if value not in choices:
            raise ConfigError(f"deployment '{name}': {where} must be one of {choices}, got {value!r}")
    counts = {
        "[cpu] intra_op_threads": cpu.intra_op_threads,
        "[cpu] inter_op_threads": cpu.inter_op_threads,
        "[cuda] device_id": cuda.device_id,
        "[cuda] gpu_mem_limit": cuda.gpu_mem_limit,
        "[tensorrt] max_workspace_bytes": tensorrt.max_workspace_bytes,
    }
    for where, value in counts.items():
        if value < 0:
            raise ConfigError(f"deployment '{name}': {where} must be >= 0, got {value}")
    if cuda.enable_cuda_graph and raw.get("provider") == "tensorrt":
        raise ConfigError(
            f"deployment '{name}': [cuda] enable_cuda_graph is for provider \"cuda\" only (TensorRT "
            "builds its own engines)"
        )
    if cuda.enable_cuda_graph and batcher.max_batch_size != 1 and not batcher.batch_buckets:
        # A CUDA graph replays fixed shapes: one graph per bucket, so batches need buckets.
        raise ConfigError(
            f"deployment '{name}': [cuda] enable_cuda_graph with max_batch_size "
            f"{batcher.max_batch_size} needs batch_buckets (a captured graph has fixed shapes)"
        )
    return cpu, cuda, tensorrt


def _table(value: object, where: str) -> dict:
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a table, got {value!r}")
    return dict(value)


def _build(cls, raw: dict, where: str, **given):
    """Instantiate a settings dataclass, naming unknown keys and wrong types instead of a TypeError."""
    _check_settings(cls, raw, where)
    return cls(**raw, **given)


def _check_settings(cls, raw: Mapping, where: str) -> None:
    """A ConfigError naming the first unknown key or value of the wrong type for settings dataclass `cls`."""
    known = {f.name: f for f in fields(cls)}
    unknown = set(raw) - set(known)
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) {sorted(unknown)}; known: {sorted(known)}")
    for key, value in raw.items():
        default = getattr(cls, key, None)
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"{where}: {key} must be true or false, got {value!r}")
        elif isinstance(default, int) and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{where}: {key} must be an integer, got {value!r}")
        elif isinstance(default, float) and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConfigError(f"{where}: {key} must be a number, got {value!r}")
        elif isinstance(default, str) and not isinstance(value, str):
            raise ConfigError(f"{where}: {key} must be a string, got {type(value).__name__}")
