"""The one results format, typed: a run (`Run`) holds one curve (`Curve`) per deployment it measured, each its
measured steps (`Step`); written and read here only, as JSON (`latlab.results/2`). Files of `latlab.results/1`
still read: the fields are the same, /1 only lacked the ones added since (they take their defaults). A curve's
batcher, provider and padding settings are common/settings.py's types, read from whatever keys the record has and
written back with exactly those."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from latlab.common.settings import (
    TABLES,
    BatcherSettings,
    CpuOptions,
    CudaOptions,
    PaddingSettings,
    Settings,
    TensorrtOptions,
)

SCHEMA = "latlab.results/2"
OLDER = ("latlab.results/1",)
"""Schemas that still read; their unknown fields are dropped (a /2 file's are an error)."""
RESULTS_FILE = "results.json"

Figures = dict[str, Any]
"""A JSON object of named figures whose keys vary with their source (the server's, Triton's, the overload test)."""

CONTEXT = {"context": True}
"""Metadata of the fields a reader fills from the enclosing record (or the file): never written, never compared."""


@dataclass
class Step:
    """One measured load: what was offered, what came back, and the server's figures over the same windows."""

    target: float
    """The load asked for: a request rate (open loop) or a number of users (closed loop)."""
    achieved_rps: float
    """Answered requests per second, counted by intended send time over the step's measured windows."""
    offered_rps: float
    errors: int
    p50_s: float | None
    p90_s: float | None
    p99_s: float | None
    max_s: float | None
    target_rps: float | None = None
    """The rate asked for (None in a closed loop)."""
    users: int | None = None
    sent: int = 0
    ok: int | None = None
    dropped: int | None = None
    late: int | None = None
    incomplete: int | None = None
    mean_s: float | None = None
    samples: int | None = None
    too_few_samples: bool = False
    send_lateness_p50_s: float | None = None
    """How long after its intended time the generator began sending (median, p99): the instrument's own share of
    every latency, which counts from the intended time (recorder.WindowStats)."""
    send_lateness_p99_s: float | None = None
    arrival_cv: float | None = None
    """The coefficient of variation of the gaps between the step's requests as sent (every process's merged):
    the burstiness the server was offered, to set beside the arrival process asked for."""
    intended_cv: float | None = None
    """The same of the intended send times: the schedule's own CV over this step (recorder.WindowStats)."""
    duration_s: float | None = None
    windows: int | None = None
    extended_windows: int = 0
    window_seconds: float | None = None
    stable: bool = True
    avg_batch_size: float | None = None
    server: Figures | None = None
    """Where a request's time went on the server over the step (scrape.server_step), None where unknown."""
    generator_cpu_percent: float | None = None
    generator_bound: bool = False
    machine_busy_cores: float | None = None
    """The generator's machine's busy cores over the step, every process's (machine_load.MachineLoad)."""
    other_load_cores: float | None = None
    """Of those, the cores neither the server nor the generator used: other work on the machine (None where the
    server is elsewhere or a figure is missing)."""
    sent_by_worker: dict[str, int] | None = None
    by_status: dict[str, Figures] = field(default_factory=dict)
    queue_depth_max: float | None = None
    queue_capacity: float | None = None
    queue_samples: int = 0
    server_interrupted: bool = False
    interruption: str | None = None
    workers_lost: list[str] = field(default_factory=list)
    workers_left: int | None = None
    start_time: float | None = None
    end_time: float | None = None
    timeline: list[Figures] = field(default_factory=list)
    """Every measured window's figures, in order."""
    confidence: Figures | None = None
    """The p50/p99 intervals and each SLO's decision (loadtest/confidence.py)."""
    phase: str | None = None
    """The overload test's phase (before, burst, after)."""
    fleet: Figures | None = None
    """Through a fleet's proxy (--fleet): the requests each replica answered over the step, their imbalance (the
    busiest's over the mean) and the proxy's counters (loadtest/fleet.py's fleet_step); None for one server."""
    recovery_spans: list[Figures] | None = None


@dataclass
class Curve:
    """One deployment's measured curve: its settings as the server described them, its steps, and how the sweep
    ended."""

    name: str
    steps: list[Step] = field(default_factory=list)
    stop_reason: str = ""
    model: str | None = None
    provider: str | None = None
    model_path: str | None = None
    batcher: BatcherSettings | None = None
    """As the server said them: all of latlab's, a few from Triton's model config, none from other servers."""
    cpu: CpuOptions | None = None
    cuda: CudaOptions | None = None
    tensorrt: TensorrtOptions | None = None
    io_binding: bool | None = None
    bucket_runs: Figures | None = None
    warmup: bool | None = None
    allow_non_finite: bool | None = None
    environment: Figures | None = None
    tokenizer: Figures | None = None
    padding: PaddingSettings | None = None
    """[padding]: which inputs are padded to share a batch (values per input name, axis, bucket)."""
    variant: Figures | None = None
    """The model file's variant of its export (name "int8" or "fp16", precision, accuracy against FP32); None for
    the FP32 export itself."""
    frontends: int | None = None
    interface: str | None = None
    """How Granian handed requests to the one process that served it ("wsgi", "rsgi": [server] interface); None
    where the server did not say."""
    platform: str | None = None
    """The model's platform, as a foreign server's metadata names it."""
    server: Figures | None = None
    """The server's name and version."""
    server_config: Figures | None = None
    settings_unknown: str | None = None
    provider_from: str | None = None
    server_metrics: Figures | None = None
    saturated: bool | None = None
    """Whether the sweep reached the capacity (None: the file does not say)."""
    rate_cap_rps: float | None = None
    search: Figures | None = None
    overload: Figures | None = None
    single_request: Figures | None = None
    proxy_added: Figures | None = None
    """Through a fleet's proxy (--fleet): the latency it adds to a lone request, against a replica direct
    (loadtest/fleet.py's proxy_added); None for one server."""
    slo_brackets: list[Figures] = field(default_factory=list)
    slo_steps: int | None = None
    slo_budget_spent: bool | None = None
    machine: Figures | None = None
    """Where this deployment ran: written only where it is not the run's machine; readers fill in the run's."""
    run_id: str = field(default="", compare=False, metadata=CONTEXT)
    reference: bool = field(default=False, compare=False, metadata=CONTEXT)
    """Committed reference data merged into a report, not this run's."""
    by_server: bool = field(default=False, compare=False, metadata=CONTEXT)
    """Compared by server in a report (curves of one model from more than one server)."""
    generator_floor: Figures | None = field(default=None, compare=False, metadata=CONTEXT)
    """The run's generator floor (Run.generator_floor)."""
    traffic: str = field(default="poisson", compare=False, metadata=CONTEXT)
    """The arrival process it was measured under (Run.arrivals: "poisson" where an earlier run did not say)."""


@dataclass
class Run:
    """One `latlab loadtest` (or one lab model): the machine it ran on, how load was generated, its deployments."""

    run_id: str
    machine: Figures
    deployments: list[Curve] = field(default_factory=list)
    created: str | None = None
    host: str | None = None
    mode: str | None = None
    """"open" (arrivals at a rate) or "closed" (users)."""
    arrivals: str | None = None
    payload: Figures | None = None
    slo_p99_s: float | None = None
    events: list[Figures] = field(default_factory=list)
    workers: int | None = None
    generator_floor: Figures | None = None
    """The generator's own round trip to a trivial route of the server before the sweep (loadtest/floor.py)."""
    fleet: Figures | None = None
    """The fleet behind the proxy it loaded (--fleet): its targets file, replicas, proxy and balance."""
    cold_start_s: float | None = None
    """From the start of the `latlab serve` it swept to ready (readiness true on every deployment), as the lab
    measured it; of a fleet, from starting every replica to the proxy seeing them all up. None: not measured (a
    server the load test did not start, or a file from before)."""
    path: str = field(default="", compare=False, metadata=CONTEXT)
    """The file it was read from."""
    reference: bool = field(default=False, compare=False, metadata=CONTEXT)

    def context(self) -> "Run":
        """Each deployment told its run id and, unless it names its own, the run's machine; returns self."""
        for deployment in self.deployments:
            deployment.run_id = self.run_id
            deployment.reference = self.reference
            deployment.generator_floor = self.generator_floor
            deployment.traffic = (self.arrivals or "poisson") + (
                f", sizes {self.payload['sizes']}" if self.payload and self.payload.get("sizes") else ""
            )
            deployment.machine = deployment.machine or self.machine
        return self


def write_results(path: Path, run: Run) -> None:
    doc = {"schema": SCHEMA, **to_dict(run)}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(_finite(doc), indent=2) + "\n")
    tmp.replace(path)  # a reader never sees half a file


def new_run_id() -> str:
    """A new run's id, which names its folder under runs/: the time it started, to the second."""
    return time.strftime("%Y%m%d-%H%M%S")


SEARCH_FOLDER = "search"
"""A run folder's configuration search (latlab/tune/lab_search.py) keeps its probe rounds under this folder: short SLO
searches that rank configurations, not curves of the run, so reading the run leaves them out."""


def read_results(run_dir: Path) -> list[Run]:
    """Every results file under a run folder (runs from several machines can be merged in one folder), but for
    a search's probes (SEARCH_FOLDER below it)."""
    run_dir = Path(run_dir)
    files = (
        [run_dir]
        if run_dir.is_file()
        else [f for f in sorted(run_dir.glob("**/results*.json")) if SEARCH_FOLDER not in f.relative_to(run_dir).parts]
    )
    if not files:
        raise FileNotFoundError(f"no results*.json under {run_dir}")
    runs = []
    for file in files:
        try:
            run = from_dict(json.loads(file.read_text()))
        except ValueError as exc:
            raise ValueError(f"{file}: {exc}") from None
        run.path = str(file)
        runs.append(run)
    return runs


def from_dict(doc: dict) -> Run:
    """A run from its JSON document (either schema); ValueError naming the first field that does not fit."""
    schema = doc.get("schema")
    if schema != SCHEMA and schema not in OLDER:
        raise ValueError(f"not a latlab results file (schema {schema!r})")
    strict = schema == SCHEMA
    deployments = [_curve(d, strict, i) for i, d in enumerate(doc.get("deployments") or [])]
    run = _build(Run, {**doc, "deployments": deployments}, strict, "the run")
    return run.context()


def to_dict(record: Any) -> Any:
    """The JSON form of a run, curve or step: every field but the context ones (and a curve's machine where it is
    its run's); settings as the record they were read from."""
    if isinstance(record, Settings):
        return record.as_dict()
    if isinstance(record, Run):
        doc = _fields(record)
        for deployment in doc["deployments"]:
            if deployment["machine"] == record.machine:
                del deployment["machine"]
        return doc
    if dataclasses.is_dataclass(record):
        return _fields(record)
    if isinstance(record, list):
        return [to_dict(item) for item in record]
    return record


def _fields(record: Any) -> dict:
    written = [f.name for f in dataclasses.fields(record) if not f.metadata.get("context")]
    return {name: to_dict(getattr(record, name)) for name in written}


def _curve(doc: dict, strict: bool, index: int) -> Curve:
    if not isinstance(doc, dict):
        raise ValueError(f"deployment {index} is not a JSON object")
    where = f"deployment {doc.get('name', index)!r}"
    steps = [_step(s, strict, f"step {k} of {where}") for k, s in enumerate(doc.get("steps") or [])]
    settings = {
        key: _settings(cls, doc[key], f"{key} of {where}") for key, cls in TABLES.items() if doc.get(key) is not None
    }
    return _build(Curve, {**doc, "steps": steps, **settings}, strict, where)


def _settings(cls: type[Settings], doc: object, where: str) -> Settings:
    if not isinstance(doc, dict):
        raise ValueError(f"{where} is not a JSON object")
    return cls.from_mapping(doc)


def _step(doc: dict, strict: bool, where: str) -> Step:
    if not strict and isinstance(doc, dict) and "target" not in doc:  # early /1 files named only the rate or users
        doc = {**doc, "target": doc.get("target_rps") if doc.get("target_rps") is not None else doc.get("users")}
    return _build(Step, doc, strict, where)


def _build(cls: type, doc: dict, strict: bool, where: str) -> Any:
    if not isinstance(doc, dict):
        raise ValueError(f"{where} is not a JSON object")
    names = {f.name for f in dataclasses.fields(cls) if not f.metadata.get("context")}
    unknown = sorted(set(doc) - names - {"schema"})
    if strict and unknown:
        raise ValueError(f"{where} has fields this version does not know: {', '.join(unknown)}")
    missing = [f.name for f in dataclasses.fields(cls) if _required(f) and f.name not in doc]
    if missing:
        raise ValueError(f"{where} lacks {', '.join(missing)}")
    return cls(**{k: v for k, v in doc.items() if k in names})


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _finite(value: Any) -> Any:
    """JSON has no NaN: write null for statistics of empty windows."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
