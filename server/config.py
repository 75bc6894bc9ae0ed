"""Typed server settings in one TOML file: the server block and its deployments, read and written here. A
deployment's batcher, provider and padding settings are the types every stage shares (common/settings.py); their
tables are read and checked in server/config_tables.py."""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import tomli_w

from latlab.common.settings import TABLES, BatcherSettings, CpuOptions, CudaOptions, PaddingSettings, Settings
from latlab.common.settings import TensorrtOptions, admitted_bound
from latlab.server.config_tables import as_table, batcher_table, build, check_settings, padding_table, provider_tables
from latlab.server.errors import ConfigError

PROVIDERS = ("cpu", "cuda", "tensorrt")
LOAD_FAILURE_POLICIES = ("fail", "skip")
AUTH_TOKEN_ENV = "LATLAB_AUTH_TOKEN"
FRONTENDS_ENV = "LATLAB_FRONTENDS"
"""Overrides [server] frontends (as `latlab serve --frontends` does, which wins): a container's setting, and how
the suite runs every test of the real server with several front ends."""
INTERFACE_ENV = "LATLAB_INTERFACE"
"""Overrides [server] interface (a container's setting): how the suite runs every test of the real
server under the RSGI interface."""
INTERFACES = ("wsgi", "rsgi", "native")
MAX_FRONTENDS = 64
"""Front-end processes a server may run (the [server] frontends bound): each owns one row of the admission counts
the processes share (server/processes/shared.py)."""
MIN_TOKEN_LENGTH = 16
# RFC 6750's b64token: what may follow "Bearer " in an Authorization header.
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


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
    interface: str = "wsgi"
    """How Granian hands requests to one process (frontends = 1). "wsgi": a thread per request; an infer request's
    thread waits on its batch. "rsgi": Granian's asynchronous interface: infer requests wait as coroutines on one
    event loop and a batch's answers reach it with one wake-up (server/http/rsgi.py); the other routes run on the
    loop (bodiless GETs) or a few threads, and `threads` does not apply. "native": no Granian: one native thread owns
    the connections and one Python thread takes every request that arrived in one call; a batch's worker writes its
    answers itself (server/http/native.py; needs a C compiler on first start). With frontends >= 2 each front end
    serves "wsgi" or "native" (server/processes/native_frontend.py); "rsgi" front ends serve WSGI (logged at start).
    docs/performance.md measures them."""
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
        doc["server"] = {**as_table(doc.get("server", {}), "[server]"), "auth_token": token}
    return parse_config(doc, base_dir=path.parent)


def served_config(config_path: str | Path, frontends: int | None = None) -> ServerConfig:
    """The config file with `frontends` (the command line's), else LATLAB_FRONTENDS, over [server] frontends, and
    LATLAB_INTERFACE over [server] interface: what every process of a server serves with."""
    config = load_config(config_path)
    frontends = frontends or int(os.environ.get(FRONTENDS_ENV) or 0) or None
    if os.environ.get(INTERFACE_ENV):
        config = with_overrides(config, interface=os.environ[INTERFACE_ENV])
    return config if frontends is None else with_overrides(config, frontends=frontends)


def served_interface(config: ServerConfig, separate_engine: bool = False) -> str:
    """The interface served: [server] interface in one process; native or WSGI for front ends, which forward to
    an engine (RSGI's front ends would serve WSGI: it only pays where a batcher is waited on)."""
    if config.interface == "rsgi" and (config.frontends > 1 or separate_engine):
        return "wsgi"
    return config.interface


def parse_config(doc: dict, base_dir: Path = Path(".")) -> ServerConfig:
    """Build a ServerConfig from a parsed TOML document."""
    server = as_table(doc.get("server", {}), "[server]")
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
    config = build(ServerConfig, server, "[server]", deployments=deployments, model_dir=model_dir)
    _check_server(config)
    return _with_threads(config)


# The tables a [[deployments]] entry may hold, and the settings each one becomes.
_DEPLOYMENT_TABLES = {**TABLES, "tokenizer": TokenizerSettings}


def dumps_config(doc: Mapping[str, Any]) -> str:
    """A server config as the TOML text load_config reads back. `doc` has the shape parse_config takes:
    {"server": {...}, "deployments": [{"name": ..., "model_path": ..., "batcher": {...}, "cpu": {...}, ...}]},
    with Path values allowed, a settings table given as Settings too (written as the settings it names) and None
    meaning "not set". Unknown settings and values of the wrong type are refused here, as the loader would refuse
    them; ranges, files and threads are checked when it loads."""
    unknown = set(doc) - {"server", "deployments"}
    if unknown:
        raise ConfigError(f"a config holds [server] and [[deployments]] only, got {sorted(unknown)}")
    plain = _plain(doc)
    check_settings(ServerConfig, as_table(plain.get("server", {}), "[server]"), "[server]")
    for deployment in plain.get("deployments", []):
        deployment = as_table(deployment, "each entry of 'deployments'")
        where = f"deployment '{deployment.get('name')}'"
        tables = {key: deployment[key] for key in _DEPLOYMENT_TABLES if key in deployment}
        check_settings(DeploymentConfig, {k: v for k, v in deployment.items() if k not in tables}, where)
        for key, value in tables.items():
            check_settings(_DEPLOYMENT_TABLES[key], as_table(value, f"{where} {key}"), f"{where} [{key}]")
    return tomli_w.dumps(plain)


def save_config(doc: Mapping[str, Any], path: str | Path) -> Path:
    """Write dumps_config(doc) to `path` and return it; the loader reads relative paths in `doc` against its folder."""
    path = Path(path)
    path.write_text(dumps_config(doc))
    return path


def _plain(value: object) -> Any:
    """`value` with what TOML cannot hold made plain: paths as strings, tuples as lists, settings as the tables
    they name, None keys left out."""
    if isinstance(value, Settings):
        return _plain(value.as_dict())
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
    if config.interface not in INTERFACES:
        raise ConfigError(f"[server]: interface must be one of {INTERFACES}, got {config.interface!r}")
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
    batcher = batcher_table(raw.pop("batcher", {}), name, provider)
    padding = padding_table(raw.pop("padding", {}), name)
    cpu, cuda, tensorrt = provider_tables(raw, name, batcher)
    tokenizer = _tokenizer(raw.pop("tokenizer", None), name, base_dir)
    raw.setdefault("model", model_path.parent.name)
    return build(
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
    table = as_table(value, f"deployment '{name}' tokenizer")
    where = f"deployment '{name}' [tokenizer]"
    raw_file = table.pop("file", None)
    if not isinstance(raw_file, str) or not raw_file:
        raise ConfigError(f"{where}: file must name the model's tokenizer.json, got {raw_file!r}")
    if "max_length" not in table:
        raise ConfigError(f"{where}: max_length is required (tokens per sentence, e.g. 256 for all-MiniLM-L6-v2)")
    settings = build(TokenizerSettings, table, where, file=(base_dir / raw_file).resolve())
    if not 2 < settings.max_length <= MAX_TOKENIZER_LENGTH:
        raise ConfigError(f"{where}: max_length must be in 3..{MAX_TOKENIZER_LENGTH}, got {settings.max_length}")
    if not settings.file.is_file():
        raise ConfigError(
            f"{where}: file {settings.file} does not exist (latlab export minilm writes "
            "tokenizer/tokenizer.json beside model.onnx)"
        )
    return settings
