"""The lab's built-in plans: which models, which deployments, which loads, how long each step lasts."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from latlab.common.settings import BatcherSettings, CpuOptions
from latlab.common.user_input import Slos
from latlab.loadtest.arrivals import Arrivals

if TYPE_CHECKING:
    import numpy as np

MANY_CORES = 8
"""From this many cores the lab starts Locust worker processes (one per core it leaves to the generator)."""
MAX_LOAD_WORKERS = 8


@dataclass(frozen=True)
class CpuShare:
    """How the lab splits a machine's cores: ORT threads of every CPU deployment, and the load generator's."""

    cores: int
    cpu_threads: int
    """ORT intra-op threads of each CPU deployment: what a CPU server of this machine would compute on."""
    load_workers: int
    """Locust worker processes (0: the generator is one local process)."""
    chosen_by: str
    """"fair share" or "--cpu-threads" / "--load-workers": who decided."""
    replicas: int = 1
    """Servers the cores are split between (`latlab lab --replicas`: a fleet behind a proxy); cpu_threads is
    each one's."""

    def describe(self) -> str:
        generator = (
            f"{self.load_workers} Locust worker processes send"
            if self.load_workers
            else "one load-generator process sends"
        )
        each = f" in each of {self.replicas} replicas" if self.replicas > 1 else ""
        return (
            f"CPU deployments compute on {self.cpu_threads} ORT thread{'s' if self.cpu_threads > 1 else ''}{each} "
            f"of this machine's {self.cores} cores; {generator} the load ({self.chosen_by})"
        )


def available_cores() -> int:
    """The cores this process may run on (its affinity), which a container may set below the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def cpu_share(
    cores: int, cpu_threads: int | None = None, load_workers: int | None = None, replicas: int = 1
) -> CpuShare:
    """Give the CPU deployments every core the load generator does not need, as a CPU server of this machine
    would have them. The generator keeps one core on a small machine (one process: on 2 cores one ORT
    thread is also what served best, docs/performance.md), and on MANY_CORES or more a core per quarter of
    the machine, each running one Locust worker (up to MAX_LOAD_WORKERS), so that it is not the limit of a
    GPU deployment's sweep. Either figure may be set; the other then follows. With `replicas`, those cores are
    split equally between the fleet's servers (at least one thread each)."""
    if (
        cores < 1
        or replicas < 1
        or (cpu_threads is not None and cpu_threads < 1)
        or (load_workers is not None and load_workers < 0)
    ):
        raise ValueError(
            f"cores, --replicas and --cpu-threads must be >= 1 and --load-workers >= 0, got cores={cores}, "
            f"replicas={replicas}, cpu_threads={cpu_threads}, load_workers={load_workers}"
        )
    chosen = (
        " and ".join(n for n, v in (("--cpu-threads", cpu_threads), ("--load-workers", load_workers)) if v is not None)
        or "fair share"
    )
    if load_workers is None:
        load_workers = min(MAX_LOAD_WORKERS, cores // 4) if cores >= MANY_CORES else 0
    if cpu_threads is None:
        cpu_threads = max(1, (cores - max(1, load_workers)) // replicas)
    return CpuShare(cores, cpu_threads, load_workers, chosen, replicas)


@dataclass(frozen=True)
class ModelPlan:
    """One model in the lab, a zoo model or the user's own: how to build it and how hard to load it."""

    name: str
    settings: dict = field(default_factory=dict)
    """Keyword arguments of the zoo builder (export.zoo.BUILDERS[name])."""
    rates: tuple[float, ...] = (100, 250, 500)
    """Offered loads (req/s) of the sweep; it stops early when a deployment saturates, and past the last one
    goes on raising the rate (up to LabPlan.raise_cap times it) until the deployment does. A step holds at least
    100 requests (its windows lengthen at low rates), so a low first rate costs time: below ~20 req/s a
    step takes 5-10 s per window."""
    batching: BatcherSettings = field(
        default_factory=lambda: BatcherSettings.partial(max_batch_size=64, max_queue_delay_ms=2.0)
    )
    """The batching-on deployment's [batcher] settings (those it names; the rest the server's defaults); the other
    deployment has max_batch_size = 1."""
    binary: bool = False
    """Load with the binary tensor extension (big inputs: JSON text would measure the parser)."""
    seq_len: int = 8
    """Tokens per request for models with a dynamic sequence axis."""
    text: bool = False
    """Also serve the model with sentences in (its export's tokenizer, [deployments.tokenizer]): deployments
    named <model>-text-..., loaded with sentences of seq_len tokens, beside the token-id ones."""
    onnx: Path | None = None
    """The user's own model: this ONNX file is served as it is, instead of exporting a zoo model (see user.py)."""
    tune_slo: float | None = None
    """The p99 bound (seconds) the lab's search (--search-minutes) ranks this model's configurations by (default:
    the middle of the plan's SLOs)."""
    tuned: tuple[dict, ...] = ()
    """Deployments the lab's search found (latlab/tune/lab_search.py), each a [[deployments]] table: swept in full in
    place of its provider's batching-on deployment (see LabPlan.deployments)."""
    samples: dict[str, np.ndarray] | None = field(default=None, compare=False, repr=False)
    """Request inputs sent instead of random ones, rows first, one request per row: the lab writes them to
    <run>/<model>/inputs.npz for `latlab loadtest --inputs` (a user model's declared shapes or sample file)."""


@dataclass(frozen=True)
class LabPlan:
    """What `latlab lab` runs: models, providers, step timing, SLOs, and the in-process bench."""

    models: tuple[ModelPlan, ...]
    providers: tuple[str, ...] = ("cpu",)
    step_seconds: float = 3.0
    """Three windows of a third each; an unstable step gets more, up to max_windows."""
    max_windows: int = 4
    warmup_seconds: float = 1.0
    slos: Slos = Slos.parse("10ms,25ms,50ms,100ms")
    """The report's p99 bounds and the sweep's SLO brackets."""
    raise_cap: float = 4.0
    """Past a model's listed rates the sweep goes on raising, up to this multiple of the last, to find
    saturation; 1 stops at the last listed rate (a deployment that passed it is then "not saturated")."""
    refine_within: float = 0.1
    """Past saturation the sweep bisects until its bracket is this narrow (fraction of the rate met)."""
    decide_windows: int = 4
    """A step whose p99 is undecided for one of the SLOs gets up to this many more windows while they could decide
    it (the cost of confidence: docs/measurement.md): with 4, a 5 req/s step's 10 s windows can reach the 299
    requests a p99 "met" needs at 95%."""
    confidence: float = 0.95
    """The level of every step's p50/p99 intervals and SLO decisions (`latlab loadtest --confidence`)."""
    search_minutes: float = 0.0
    """The budget of the lab's configuration search (latlab/tune/lab_search.py), shared by every model and provider;
    each search's first round (the plan's batching in every variant, side by side) is measured whatever the
    budget. 0: no search, the plan's two deployments per provider."""
    slo_steps: int = 10
    """At most this many extra steps per deployment for the SLO brackets, each spent on the widest bracket left (a
    bracket left wider says so). Four SLOs in brackets of 10x need up to five each alone; shared steps need fewer."""
    slo_seconds: float = 40.0
    """No bracket step starts after this many seconds of them per deployment: enough for about ten steps at a
    fast deployment's rates; a slow one's low-rate steps need far longer each to hold the 299 requests a p99 "met"
    needs, and this bound keeps them from taking the lab's time (docs/performance.md)."""
    resolution: float = 0.1
    """Each SLO's highest rate is found to within this fraction: the sweep measures between the last rate that
    met it and the first that broke it until they are this close (`latlab loadtest --slos`)."""
    traffic: tuple[Arrivals, ...] = (Arrivals(),)
    """Each model's deployments are swept under each of these arrival processes (`latlab lab --traffic`), the
    first into the model's folder, the others beside it; the report's verdict speaks of the first and says what
    each other one changed. The built-in plans sweep Poisson arrivals only: every other profile costs a sweep."""
    sizes: str = ""
    """Each request's size along the dynamic axes of the models that have them (`latlab lab --dim seq=SPEC`:
    loadtest/sizes.py); "" for each model's seq_len."""
    bench: bool = True
    """Run `latlab bench --quick` on the plan's models first (batch-time curves for the prediction)."""
    replicas: int = 1
    """Serve the deployments as a `latlab fleet` of this many replicas behind HAProxy (each on an equal share of
    the CPU threads, CpuShare.replicas) and record the fleet in every step; 1: one `latlab serve`, no proxy
    (docs/fleet.md says why that is the default)."""
    balance: str = "leastconn"
    """The fleet's balance algorithm (latlab/fleet/spec.py BALANCES); unused with one replica."""
    cpu: CpuOptions = field(default_factory=lambda: CpuOptions.partial(allow_spinning=False))
    """[deployments.cpu] settings of every CPU deployment, beside intra_op_threads from the CpuShare (which the plan
    may override). Spinning ORT threads steal the CPU that HTTP handling and the generator need, so the lab turns
    spinning off (what it costs on a small machine: docs/performance.md, "One ORT thread, no spinning")."""

    def only(self, names: list[str] | None) -> LabPlan:
        """The plan for some of its models (e.g. to split a GPU machine's lab over two device calls)."""
        if not names:
            return self
        known = [m.name for m in self.models]
        unknown = sorted(set(names) - set(known))
        if unknown:
            raise ValueError(f"--models: {', '.join(unknown)} not in this plan; it has {', '.join(known)}")
        return replace(self, models=tuple(m for m in self.models if m.name in names))

    def scaled(self, step_seconds: float | None = None, rates: list[float] | None = None) -> LabPlan:
        """The same plan with another step length, or one list of rates for every model (tests)."""
        models = self.models if rates is None else tuple(replace(m, rates=tuple(rates)) for m in self.models)
        return replace(self, models=models, step_seconds=step_seconds or self.step_seconds)

    def deployments(self, model: ModelPlan) -> list[tuple[str, str, BatcherSettings]]:
        """(deployment name, provider, batcher settings) of one model: batching off and on per provider. Where the
        search found a deployment for a provider (model.tuned), it takes the place of that provider's batching-on
        one: the search started from its settings (lab_search.plan_start) and measured them in every variant."""
        off, on = BatcherSettings.partial(max_batch_size=1), model.batching
        names = [model.name, f"{model.name}-text"] if model.text else [model.name]
        searched = {t.get("provider", "cpu") for t in model.tuned}
        return [
            (f"{name}-{mode}" if self.providers == ("cpu",) else f"{name}-{provider}-{mode}", provider, settings)
            for name in names
            for provider in self.providers
            for mode, settings in (("b1", off), ("batch", on))
            if not (mode == "batch" and name == model.name and provider in searched)
        ]

    def deployment_names(self, model: ModelPlan) -> list[str]:
        """Every deployment of the model the lab serves and sweeps: the plan's (less those the search replaced),
        then the search's."""
        return [name for name, _, _ in self.deployments(model)] + [t["name"] for t in model.tuned]

    def tune_slo(self, model: ModelPlan) -> float:
        """The bound (seconds) the search ranks the model's configurations by: its own, else the middle of the
        plan's."""
        return model.tune_slo or self.slos.middle

    @staticmethod
    def is_text(model: ModelPlan, deployment: str) -> bool:
        """Whether one of `model`'s deployments takes sentences (see ModelPlan.text)."""
        return model.text and deployment.startswith(f"{model.name}-text-")


# Listed rates give the curve its shape below saturation; past them the sweep raises and bisects to find it.
# Each SLO's bracket adds the steps that place its rate (LabPlan.resolution), so the lists stay short.
MLP = ModelPlan("mlp", {}, rates=(100, 1000, 3000), tune_slo=0.025)
FFN = ModelPlan("ffn", {"d_model": 128, "n_layers": 128}, rates=(100, 1000, 3000), tune_slo=0.025)
# ResNet-18 at 224x224 takes tens of ms per image on one core: a few requests per second saturate it.
CNN = ModelPlan(
    "cnn",
    {},
    rates=(8, 20, 40),
    binary=True,
    batching=BatcherSettings.partial(max_batch_size=8, max_queue_delay_ms=5.0),
)
MINILM = ModelPlan(
    "minilm",
    {},
    rates=(15, 100, 300),
    seq_len=16,
    text=True,
    batching=BatcherSettings.partial(max_batch_size=32, max_queue_delay_ms=3.0),
)

QUICK_STEPS: dict[str, int | float] = {
    "step_seconds": 1.5,
    "max_windows": 3,
    "warmup_seconds": 0.5,
    "refine_within": 0.3,
    "resolution": 0.3,
}
"""The step timing and bracket widths of the short plans (quick, gpu-quick, gpu-serve): fewer, shorter steps,
wider brackets."""

GPU_SERVE = LabPlan(
    models=(replace(CNN, rates=(20, 100, 400)), replace(MINILM, rates=(50, 300, 1200), text=False)),
    providers=("cpu", "cuda"),
    slos=Slos.parse("25ms,50ms"),
    **QUICK_STEPS,
    slo_steps=3,
    slo_seconds=15.0,
)

PLANS = {
    # The main job: four models on the CPU, batching off (FP32, as exported) and the search's best: it starts at
    # the plan's batching setting in INT8 and FP32 side by side, and the better is swept in full (timing in
    # docs/performance.md; minilm with sentences in is measured by benchmarks/text_serving.py, docs/tokenizer.md).
    "cpu": LabPlan(
        models=(MLP, FFN, CNN, replace(MINILM, text=False)),
        warmup_seconds=0.5,
        search_minutes=2.0,
        slo_seconds=25.0,
    ),
    # Same models, fewer and shorter steps (how long it takes: docs/measurement.md, "The lab's plan").
    "quick": LabPlan(
        models=(
            replace(MLP, rates=(250, 1000, 2000)),
            replace(FFN, rates=(250, 750, 1500, 2500)),
            replace(CNN, rates=(10, 20, 30)),
            replace(MINILM, rates=(25, 100, 250)),
        ),
        **QUICK_STEPS,
        slo_steps=4,
    ),
    # For a GPU box: every model on CUDA and on the CPU, batching off and on; merge its run folder with
    # a CPU box's in `latlab report`.
    # Rates reach further: the sweep stops where each deployment saturates.
    "gpu": LabPlan(
        models=(
            MLP,
            FFN,
            replace(CNN, rates=CNN.rates + (100, 400, 800)),
            replace(MINILM, rates=MINILM.rates + (1000, 2000)),
        ),
        providers=("cpu", "cuda"),
    ),
    # The gpu plan in fewer, shorter steps: fits one call of a borrowed GPU machine (benchmarks/gpu_kit.py).
    "gpu-quick": LabPlan(
        models=(
            replace(MLP, rates=(250, 1000, 2000, 4000)),
            replace(FFN, rates=(250, 1000, 2000, 4000)),
            replace(CNN, rates=(20, 60, 150, 400)),
            replace(MINILM, rates=(50, 250, 600, 1200)),
        ),
        providers=("cpu", "cuda"),
        **QUICK_STEPS,
        slo_steps=4,
    ),
    # A GPU trip's first leg (benchmarks/gpu_kit.py): cnn and minilm on CUDA against the CPU's fair share of cores,
    # under the two bounds the verdict ranks them by, in short steps sized to one device call.
    "gpu-serve": GPU_SERVE,
    # The same on the CPU alone: what the kit's rehearsal runs on a machine without CUDA.
    "gpu-serve-cpu": replace(GPU_SERVE, providers=("cpu",)),
}
