"""What a sweep is asked to do (`SweepPlan`), made of parts: what is sent where and how each request is built
(`Workload`, `PayloadOptions`), how the load is stepped (`Schedule`), which SLOs are searched (`SloSearch`), which
processes send (`Workers`), what the results record about the run (`Provenance`), and an overload test instead of
a sweep (`OverloadPlan`, run by overload.py).

Each part checks itself (one UserError line the user can act on) and owns its `latlab loadtest` options
(`add_cli_args`, `from_cli_args`); the timing parts live in schedule.py. A part's defaults are its options'
defaults, so a plan built in code runs as the command would. A plan travels to a child process as JSON (`to_json`,
`from_json`; child.py), never as a command line. Light (no numpy, no Locust): every `latlab` command imports it to
build its options.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from latlab.common.user_input import Slos, UserError
from latlab.loadtest.arrivals import load_trace
from latlab.loadtest.fleet import read_targets
from latlab.loadtest.schedule import Schedule, SloSearch
from latlab.loadtest.sizes import AXIS, SPEC_HELP, Sizes


@dataclass(frozen=True)
class PayloadOptions:
    """How requests are built and sent: the encoding, the size of dynamic non-batch dimensions
    (e.g. a token sequence's length) and the HTTP client; what every load-generator user sends (payloads.py builds
    the bodies)."""

    binary: bool = False
    """Send inputs with the binary tensor extension and ask for binary outputs."""
    seq_len: int = 8
    """Length given to every dynamic dimension after the batch one."""
    client: str = "lean"
    """How infer requests are sent: "lean" (loadtest/lean_http.py, for http:// hosts) or "locust"
    (Locust's FastHttpSession: https, or to compare the two generators' costs)."""
    text: bool = False
    """The deployment must take text (a BYTES input of sentences); refused with a clear error otherwise.
    A BYTES input gets sentences of `seq_len` tokens either way."""
    seq_len_max: int = 0
    """When above seq_len: each sentence's length in tokens is drawn uniformly from seq_len..seq_len_max."""
    inputs: str = ""
    """An .npz file of sample inputs sent instead of random ones, one request per row (payloads.sample_bodies);
    "" for random inputs. It must exist where each load-generator process runs."""
    sizes: str = ""
    """Each request's size along the dynamic axes (`--dim seq=SPEC`, sizes.py): "" for seq_len (up to seq_len_max)."""

    @property
    def size_spec(self) -> Sizes:
        """The sizes requests are sent at (sizes.py)."""
        return Sizes.of(self.seq_len, self.seq_len_max, self.sizes)


@dataclass(frozen=True)
class Workload:
    """What is sent where: the server, its deployments (swept in turn) and how each request is built."""

    host: str = ""
    """The server's URL, e.g. http://127.0.0.1:8000."""
    deployments: tuple[str, ...] = ()
    """Empty only for a calibration of the generator alone (Schedule.calibrate_only)."""
    payload: PayloadOptions = field(default_factory=PayloadOptions)

    def __post_init__(self) -> None:
        payload = self.payload
        if payload.seq_len < 1:
            raise UserError(f"--seq-len must be >= 1, got {payload.seq_len}")
        if payload.text and payload.seq_len < 3:
            raise UserError(
                f"--text: a sentence needs at least 3 tokens ([CLS], a word, [SEP]), got --seq-len {payload.seq_len}"
            )
        if payload.seq_len_max and payload.seq_len_max < payload.seq_len:
            raise UserError(f"--seq-len-max ({payload.seq_len_max}) must be at least --seq-len ({payload.seq_len})")
        if payload.inputs and payload.text:
            raise UserError("--inputs and --text do not combine: a sample file holds tensors, --text sends sentences")
        if payload.sizes:
            sizes = payload.size_spec
            if payload.seq_len_max:
                raise UserError(f"--dim {AXIS}={sizes.spec} and --seq-len-max both size the requests: give one")
            if payload.inputs:
                raise UserError(f"--dim {AXIS}={sizes.spec} sizes generated requests; --inputs sends the file's own")
            if payload.text and sizes.kind != "trace" and sizes.low < 3:
                raise UserError(
                    f"--text: a sentence needs at least 3 tokens, but --dim {AXIS}={sizes.spec} starts lower"
                )

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--host", help="server URL, e.g. http://127.0.0.1:8000")
        parser.add_argument("--deployment", action="append", help="repeat (or comma-separate) for several")
        parser.add_argument(
            "--binary",
            action="store_true",
            help="send tensors with the binary tensor extension (and ask for binary outputs)",
        )
        parser.add_argument(
            "--seq-len",
            type=int,
            default=8,
            help="length of the model's dynamic non-batch dimensions, e.g. tokens per sequence",
        )
        parser.add_argument(
            "--text",
            action="store_true",
            help="the deployments take text (a [deployments.tokenizer]): send real-looking sentences of "
            "--seq-len tokens, refuse a deployment without a text input",
        )
        parser.add_argument(
            "--seq-len-max",
            type=int,
            default=0,
            help="above --seq-len: each sentence's length drawn uniformly from --seq-len..this many tokens",
        )
        parser.add_argument(
            "--dim",
            action="append",
            default=[],
            metavar=f"{AXIS}=SPEC",
            help=f"each request's size along the dynamic axes after the batch (a text request's tokens), drawn per "
            f"request: {SPEC_HELP}; sizes above a text deployment's max_length are sent at it, and the run says how "
            f"many",
        )
        parser.add_argument(
            "--inputs",
            type=Path,
            metavar="FILE.npz",
            help="send these sample inputs instead of random ones: an .npz (numpy.savez) of arrays named "
            "after the model's inputs, rows on the first axis, one request per row",
        )
        parser.add_argument(
            "--client",
            choices=("lean", "locust"),
            default="lean",
            help="infer requests through latlab's lean HTTP client (http:// only, about half the CPU "
            "per request) or Locust's FastHttpSession (https, or to compare)",
        )

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> Workload:
        payload = PayloadOptions(
            binary=args.binary,
            seq_len=args.seq_len,
            client=args.client,
            text=args.text,
            seq_len_max=args.seq_len_max,
            inputs=str(args.inputs) if args.inputs is not None else "",
            sizes=sizes_option(args.dim),
        )
        deployments = tuple(d for item in args.deployment or [] for d in item.split(",") if d)
        return cls(host=args.host or "", deployments=deployments, payload=payload)


def sizes_option(values: list[str]) -> str:
    """The spec of `--dim seq=SPEC` ("" when not given); a load test sizes every dynamic axis as one."""
    if not values:
        return ""
    if len(values) > 1:
        raise UserError(
            f"--dim is given {len(values)} times; a load test sizes every dynamic axis as one: --dim {AXIS}=SPEC"
        )
    key, sep, spec = values[0].partition("=")
    if not sep or key.strip() != AXIS:
        raise UserError(
            f"--dim {values[0]!r}: write --dim {AXIS}=SPEC ({SPEC_HELP}); the server's metadata names no axes, so a "
            f"load test sizes every dynamic axis after the batch as one"
        )
    return Sizes.parse(spec).spec


DEFAULT_MASTER_PORT = 5557
"""Locust's master port; with local workers (Workers.local) it stands for a free port, chosen at the start."""


@dataclass(frozen=True)
class Workers:
    """The generator's processes: one local process, or a Locust master with local or remote workers; where the
    generator's own Prometheus metrics are served."""

    local: int = 0
    """Worker processes started here (0: the generator is this one process)."""
    remote: int = 0
    """Workers started elsewhere that the master waits for."""
    users_per_process: int = 1
    master_bind_host: str = "127.0.0.1"
    master_port: int = DEFAULT_MASTER_PORT
    metrics_port: int | None = None

    @property
    def distributed(self) -> bool:
        return bool(self.local or self.remote)

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        add = parser.add_argument
        add("--workers", type=int, default=0, help="Locust distributed: local worker processes")
        add("--expect-workers", type=int, default=0, help="Locust distributed: wait for remote workers")
        add("--master-bind-host", default="127.0.0.1", help="where remote workers connect")
        add("--master-port", type=int, default=DEFAULT_MASTER_PORT)
        add("--metrics-port", type=int, help="expose the generator's Prometheus /metrics here")

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> Workers:
        return cls(
            local=args.workers,
            remote=args.expect_workers,
            master_bind_host=args.master_bind_host,
            master_port=args.master_port,
            metrics_port=args.metrics_port,
        )


@dataclass(frozen=True)
class Provenance:
    """What the results record about the run beyond what the server says: the machine's name, what the
    deployments compute on, where the server's own figures are read, the fleet behind a proxy."""

    machine_name: str | None = None
    """What reports call the machine (default: its CPU model, or the GPU of a GPU deployment)."""
    provider: str = ""
    """What the deployments compute on ("cpu", "cuda"), recorded where the server does not say (any server other
    than latlab's, unless its Triton model config tells); empty: the record has no provider (the report says
    unknown). Kept stripped and in lower case."""
    server_metrics: str = ""
    """Where the server's own figures are read: a Prometheus text URL (latlab's series or Triton's nv_inference_*
    counters); empty: the server's /metrics (on latlab's observer port when it has one), if it answers."""
    fleet: str = ""
    """The file_sd targets of the fleet behind the host (`latlab fleet --targets FILE`): every step then also
    records the requests each replica answered and the proxy's counters (loadtest/fleet.py); empty: one server."""
    cold_start_s: float | None = None
    """The server's start to ready where whoever started it measured it (the lab): recorded in the run as is."""

    def __post_init__(self) -> None:
        if self.fleet:
            read_targets(self.fleet)  # a missing or garbled file stops here, before any load
        if self.server_metrics and not self.server_metrics.startswith(("http://", "https://")):
            raise UserError(f"--server-metrics must be an http:// or https:// URL, got {self.server_metrics!r}")
        if self.provider and not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", self.provider.strip()):
            raise UserError(
                f"--provider names what the deployments compute on, e.g. cpu or cuda, got {self.provider!r}"
            )
        object.__setattr__(self, "provider", self.provider.strip().lower())

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--server-metrics",
            metavar="URL",
            default="",
            help="where the server exports its own figures, e.g. Triton's http://HOST:8002/metrics: its "
            "nv_inference_* counters (queue, compute, batch sizes) feed the report's 'where the time "
            "goes' (default: the server's /metrics, latlab's observer port when it has one; none "
            "there: the report shows the client side only)",
        )
        parser.add_argument(
            "--provider",
            metavar="NAME",
            default="",
            help="what the deployments compute on (cpu, cuda, ...), recorded for a server that does not say "
            "(Triton without a model config telling, MLServer, KServe): the report then counts them as "
            "CPU or GPU deployments (default: provider unknown, neither); latlab's own server says",
        )
        parser.add_argument(
            "--fleet",
            metavar="FILE",
            type=Path,
            help="--host is a `latlab fleet`'s proxy and FILE its Prometheus targets (`latlab fleet --targets "
            "FILE`): each step also records the requests every replica answered, their imbalance and the proxy's "
            "requests, retries, queue and 5xx",
        )
        parser.add_argument(
            "--machine-name", help="what reports call this machine (default: its CPU model, or the GPU)"
        )

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> Provenance:
        return cls(
            machine_name=args.machine_name,
            provider=args.provider or "",
            server_metrics=args.server_metrics or "",
            fleet=str(args.fleet) if args.fleet is not None else "",
        )


@dataclass(frozen=True)
class OverloadPlan:
    """An overload test of each deployment instead of a sweep (overload.py): how hard and how long to overload,
    and how the recovery is measured."""

    factor: float = 3.0
    """Offered load during the burst, as a multiple of the capacity."""
    burst_seconds: float = 60.0
    capacity_rps: float | None = None
    """The deployment's capacity; None: measured, as the rate served while saturated (from --rates[0] up)."""
    recovery_load: float = 0.6
    """Load before and after the burst, as a fraction of the capacity."""
    baseline_seconds: float = 3.0
    recovery_seconds: float = 8.0
    recovery_window_seconds: float = 0.5

    def __post_init__(self) -> None:
        capacity_ok = self.capacity_rps is None or self.capacity_rps > 0
        if self.factor <= 0 or self.burst_seconds <= 0 or not capacity_ok or not 0 < self.recovery_load < 1:
            raise UserError(OVERLOAD_NEEDS)

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--overload",
            type=float,
            metavar="FACTOR",
            help="overload test instead of a sweep: offer FACTOR x the capacity for --burst-seconds, "
            "then report the 503s, queue depth, timeouts and the time to recover",
        )
        parser.add_argument("--burst-seconds", type=float, default=60.0, help="--overload: how long the burst lasts")
        parser.add_argument(
            "--capacity",
            type=float,
            metavar="RPS",
            help="--overload: the capacity (default: measured, doubling from --rates' first value "
            "until the server saturates)",
        )
        parser.add_argument(
            "--recovery-load",
            type=float,
            default=0.6,
            metavar="FRACTION",
            help="--overload: the load before and after the burst, as a fraction of the capacity",
        )

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> OverloadPlan | None:
        """The overload test --overload asks for; None without it (a sweep)."""
        if args.overload is None:
            return None
        return cls(
            factor=args.overload,
            burst_seconds=args.burst_seconds,
            capacity_rps=args.capacity,
            recovery_load=args.recovery_load,
        )


OVERLOAD_NEEDS = (
    "--overload needs a positive factor, open-loop mode, no --slo, positive --burst-seconds "
    "and --capacity, and --recovery-load between 0 and 1"
)


PARTS = (Workload, Schedule, SloSearch, Workers, Provenance, OverloadPlan)
"""Every part that owns `latlab loadtest` options, in the order they are added."""


@dataclass(frozen=True)
class SweepPlan:
    """What to load and how: the parts, and what only the whole can check (the parts' options together)."""

    workload: Workload
    schedule: Schedule = Schedule()
    slo: SloSearch = SloSearch()
    workers: Workers = Workers()
    provenance: Provenance = Provenance()
    overload: OverloadPlan | None = None
    """An overload test of each deployment instead of a sweep."""

    def __post_init__(self) -> None:
        if not self.workload.host or not (self.workload.deployments or self.schedule.calibrate_only):
            raise UserError("loadtest needs --host and at least one --deployment")
        if self.overload is not None and (self.schedule.mode != "open" or self.slo.p99_s):
            raise UserError(OVERLOAD_NEEDS)
        if self.slo.slos and self.schedule.mode != "open":
            raise UserError("--slos brackets offered rates: it needs --mode open")
        sizes, arrivals = self.workload.payload.size_spec, self.schedule.arrivals
        if sizes.kind == "trace":
            if self.schedule.mode != "open" or arrivals.kind != "trace":
                raise UserError(
                    f"--dim {AXIS}={sizes.spec} takes each request's size from the trace it replays: name it with "
                    f"--trace FILE"
                )
            sizes.column_values(load_trace(arrivals.trace).columns, arrivals.trace)  # a bad column stops here

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        """Every part's options (`latlab loadtest`, or a benchmark reading the same options)."""
        for part in PARTS:
            part.add_cli_args(parser)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> SweepPlan:
        return cls(
            workload=Workload.from_cli_args(args),
            schedule=Schedule.from_cli_args(args),
            slo=SloSearch.from_cli_args(args),
            workers=Workers.from_cli_args(args),
            provenance=Provenance.from_cli_args(args),
            overload=OverloadPlan.from_cli_args(args),
        )

    @classmethod
    def from_options(cls, options: list[str]) -> SweepPlan:
        """The plan `latlab loadtest` options describe, read by the parts' own parser (no environment, no
        config file): how a benchmark writes a plan in the command's words. UserError on a mistake."""
        parser = _OptionsParser(prog="loadtest plan", allow_abbrev=False)
        cls.add_cli_args(parser)
        return cls.from_cli_args(parser.parse_args(options))

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> SweepPlan:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, data: dict) -> SweepPlan:
        """The plan `dataclasses.asdict` made a JSON object of, with its parts' types back (and checked again)."""
        workload, schedule, slo = data["workload"], dict(data["schedule"]), data["slo"]
        if "poisson" in schedule:  # a plan kept by an earlier latlab: Poisson or constant gaps only
            schedule["arrivals"] = {"kind": "poisson" if schedule.pop("poisson") else "constant"}
        return cls(
            workload=Workload(
                host=workload["host"],
                deployments=tuple(workload["deployments"]),
                payload=PayloadOptions(**workload["payload"]),
            ),
            schedule=Schedule(**{**schedule, "loads": tuple(schedule["loads"])}),
            slo=SloSearch(**{**slo, "slos": Slos(tuple(slo["slos"]["seconds"]))}),
            workers=Workers(**data["workers"]),
            provenance=Provenance(**data["provenance"]),
            overload=OverloadPlan(**data["overload"]) if data["overload"] is not None else None,
        )


class _OptionsParser(argparse.ArgumentParser):
    """An option the parts do not know is a UserError, not an exit."""

    def error(self, message: str) -> None:
        raise UserError(message)
