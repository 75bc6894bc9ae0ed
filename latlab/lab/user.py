"""`latlab lab` on the user's own model: where it comes from (--onnx, --module, a name under --models-dir),
whether the server can serve it on each provider, what the load generator sends (inputs generated from the
declared shapes and types, with --dim for dynamic axes, or --inputs samples.npz), and the plan that runs it.
Every check runs before the lab makes its run folder or starts a process; each failure is one UserError line."""

from __future__ import annotations

import re
import statistics
import time
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from latlab.common.settings import BatcherSettings
from latlab.common.user_input import UserError, parse_rates
from latlab.lab.inputs import InputSpec, check_batch_and_types, generate_samples, row_bytes, row_shapes, sample_dims
from latlab.lab.plan import CpuShare, LabPlan, ModelPlan
from latlab.lab.run import _say as say
from latlab.lab.run import config_text

if TYPE_CHECKING:
    from latlab.server.runtime.model import OnnxModel

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A user model's name: it names its deployments (<name>-b1, <name>-batch) and its folder in the run."""
TAKEN = ("bench", "prometheus")
"""Folders a run holds besides its models'."""
SERVING_OVERHEAD_S = 0.4e-3
"""The server's own work per request (HTTP, decoding, batcher), measured at 0.36 ms on a 2-core VM
(docs/performance.md): added to the model's batch-1 time to guess a first capacity."""
RATE_FRACTIONS = (0.1, 0.3, 0.6, 1.0)
"""The listed rates, as fractions of that guess; past the last the sweep raises the rate until saturation."""
TIMING_BUDGET_S = 0.3
"""How long the batch-1 time is measured (at least 3 runs)."""
SLOW_REQUEST_S = 5e-3
"""Above this batch-1 time the batching-on deployment takes the zoo cnn's settings (<= 8, 5 ms)."""
BINARY_FROM_BYTES = 64 * 1024
"""Requests this large go with the binary tensor extension: as JSON text the run would measure the parser."""


@dataclass(frozen=True)
class UserModel:
    """What the lab's command line says about the user's model."""

    onnx: Path | None = None
    module: str | None = None
    exported: str | None = None
    """A model exported before (`latlab export ... --name NAME`): models_dir/NAME/model.onnx."""
    name: str | None = None
    dims: tuple[str, ...] = ()
    """--dim values, e.g. "seq=128" or "x:1=128" (input x's unnamed axis 1)."""
    inputs: Path | None = None
    """--inputs: an .npz of sample inputs (rows first) sent instead of generated ones."""
    providers: str | None = None
    """--providers, e.g. "cpu,cuda" (default: the plan's with CUDA, else every provider that loads here)."""
    rates: str | None = None

    @property
    def label(self) -> str:
        """How error messages name the model: the option that gave it."""
        return (
            f"--onnx {self.onnx}"
            if self.onnx
            else f"--module {self.module}"
            if self.module
            else f"--model {self.exported}"
        )


def plan_user_model(base: LabPlan, user: UserModel, models_dir: Path, share: CpuShare) -> LabPlan:
    """The lab's plan for the user's model (base's timing and SLOs), after every check passed."""
    dims = parse_dims(user.dims)
    samples = _read_samples(user.inputs)
    providers = _providers(user.providers, base)
    rates = None if user.rates is None else tuple(parse_rates(user.rates))
    name, path = resolve_model(user, models_dir)
    checked = check_serving(path, name, providers, share, dims, samples, user.label)
    rates = rates or default_rates(checked.batch1_s)
    shapes = ", ".join(f"{n} {list(a.shape[1:])} {a.dtype}" for n, a in checked.samples.items())
    say(
        f"your model {name} ({path}) loads and runs on {', '.join(providers)}; a request carries {shapes} "
        f"({'rows of ' + str(user.inputs) if user.inputs else 'generated from the declared shapes'}); batch 1 "
        f"takes {checked.batch1_s * 1e3:.3g} ms in process; rates {', '.join(f'{r:g}' for r in rates)} req/s, "
        f"then raised until each deployment saturates"
    )
    slow = checked.batch1_s > SLOW_REQUEST_S
    model = ModelPlan(
        name,
        onnx=path,
        rates=rates,
        samples=checked.samples,
        binary=row_bytes(checked.samples) >= BINARY_FROM_BYTES,
        batching=BatcherSettings.partial(max_batch_size=8, max_queue_delay_ms=5.0)
        if slow
        else BatcherSettings.partial(max_batch_size=64, max_queue_delay_ms=2.0),
    )
    return replace(base, models=(model,), providers=providers, bench=False)


def parse_dims(values: tuple[str, ...]) -> dict[str, int]:
    """("seq=128", "x:1=16") -> {"seq": 128, "x:1": 16}."""
    dims: dict[str, int] = {}
    for value in values:
        key, sep, size = value.rpartition("=")
        if not sep or not key.strip() or not size.strip().isdigit() or int(size) < 1:
            raise UserError(f"--dim {value!r}: write NAME=SIZE with a positive size, e.g. --dim seq=128")
        dims[key.strip()] = int(size)
    return dims


def resolve_model(user: UserModel, models_dir: Path) -> tuple[str, Path]:
    """The model's name and ONNX file; --module is exported first (into models_dir/NAME, as `latlab export`)."""
    if sum(x is not None for x in (user.onnx, user.module, user.exported)) != 1:
        raise UserError("name one model: --onnx FILE, --module PKG.MOD:FACTORY or --model NAME (exported before)")
    if user.module is not None and not user.name:
        raise UserError("--module needs --name: the folder under --models-dir it is exported to")
    if user.onnx is not None:
        name = user.name or (user.onnx.parent.name if user.onnx.stem == "model" else user.onnx.stem)
    else:
        name = user.name or user.exported
    if not NAME.fullmatch(name):
        raise UserError(
            f"{user.label}: the model's name {name!r} must be letters, digits, '.', '_' or '-' "
            f"(it names the deployments); give one with --name"
        )
    if name in TAKEN:
        raise UserError(
            f"{user.label}: the name {name!r} is taken by the run folder's own {name}/; give another with --name"
        )
    if user.onnx is not None:
        if not user.onnx.is_file():
            raise UserError(f"--onnx: {user.onnx} does not exist")
        return name, user.onnx.resolve()
    if user.exported is not None:
        path = models_dir / user.exported / "model.onnx"
        if not path.is_file():
            raise UserError(
                f"--model {user.exported}: {path} does not exist; export it first with "
                f"`latlab export --onnx FILE --name {user.exported}` (or --module)"
            )
        return name, path.resolve()
    return name, _export_module(user.module, name, models_dir).resolve()


def _export_module(spec: str, name: str, models_dir: Path) -> Path:
    from latlab.export.command import run_export
    from latlab.export.onnx_export import ExportError, ParityError
    from latlab.export.options import ExportOptions

    try:
        run_export(ExportOptions(module=spec, name=name, models_dir=models_dir))
    except (ExportError, ParityError) as exc:
        raise UserError(str(exc)) from None
    return models_dir / name / "model.onnx"


def _read_samples(path: Path | None) -> dict[str, np.ndarray] | None:
    from latlab.loadtest.payloads import load_samples

    if path is None:
        return None
    try:
        return load_samples(path)
    except ValueError as exc:
        raise UserError(f"--inputs: {exc}") from None


def _providers(text: str | None, base: LabPlan) -> tuple[str, ...]:
    """--providers, checked; by default the plan's when it names CUDA (the gpu plans), else what loads here."""
    from latlab.server.config import PROVIDERS

    if text is None:
        return base.providers if base.providers != ("cpu",) else ("cpu", *(("cuda",) if _cuda_loads() else ()))
    providers = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    unknown = [p for p in providers if p not in PROVIDERS]
    if not providers or unknown:
        raise UserError(f"--providers: write some of {', '.join(PROVIDERS)}, e.g. cpu,cuda; got {text!r}")
    return providers


def _cuda_loads() -> bool:
    import onnxruntime as ort

    from latlab.server.runtime.providers import provider_load_error

    name = "CUDAExecutionProvider"
    return name in ort.get_available_providers() and provider_load_error(name) is None


def default_rates(batch1_s: float) -> tuple[float, ...]:
    """Listed rates from the model's batch-1 time: fractions of a first guess of one deployment's capacity, two
    significant digits, at least 1 req/s. The sweep finds the real capacity past the last one."""
    guess = 1.0 / (batch1_s + SERVING_OVERHEAD_S)
    return tuple(sorted({max(1.0, float(f"{guess * f:.2g}")) for f in RATE_FRACTIONS}))


@dataclass(frozen=True)
class Checked:
    """What the checks found: the request inputs to send and the fastest provider's batch-1 time."""

    samples: dict[str, np.ndarray]
    batch1_s: float


def check_serving(
    path: Path,
    name: str,
    providers: tuple[str, ...],
    share: CpuShare,
    dims: dict[str, int],
    samples: dict[str, np.ndarray] | None,
    label: str,
) -> Checked:
    """Load the model as the lab's server will (its batching deployment on each provider), check the
    signature, make or check the inputs, run batch 1 and 2 on each provider and time batch 1."""
    from latlab.server.config import parse_config
    from latlab.server.errors import ConfigError
    from latlab.server.runtime.model import OnnxModel

    plan = LabPlan(models=(ModelPlan(name, onnx=path),), providers=providers, bench=False)
    config = parse_config(tomllib.loads(config_text({name: path}, 8000, plan, share)))
    batching = {d.provider: d for d in config.deployments if d.batcher.max_batch_size > 1}
    inputs, times = None, []
    for provider in providers:
        try:
            model = OnnxModel(batching[provider])
        except ConfigError as exc:
            raise UserError(f"{label}: cannot serve it on {provider}: {exc}") from None
        if inputs is None:
            specs = [InputSpec(i.name, i.type, tuple(i.shape)) for i in model.session.get_inputs()]
            inputs = _inputs_for(specs, model.metadata(), dims, samples, label)
        times.append(_try_runs(model, inputs, provider, label, generated=samples is None))
    return Checked(inputs, min(times))


def _inputs_for(
    specs: list[InputSpec], metadata: dict, dims: dict[str, int], given: dict[str, np.ndarray] | None, label: str
) -> dict[str, np.ndarray]:
    """The samples given, checked against the model, or inputs generated from its declared shapes."""
    from latlab.loadtest.payloads import MAX_BODIES, check_samples

    try:
        check_batch_and_types(specs)
        if given is None:
            return generate_samples(specs, row_shapes(specs, dims))
        check_samples(metadata, given)
        row_shapes(specs, sample_dims(specs, given, dims))  # a --dim naming no axis is still a mistake
    except ValueError as exc:
        raise UserError(f"{label}: {exc}") from None
    return {n: a[:MAX_BODIES] for n, a in given.items()}


def _try_runs(model: OnnxModel, samples: dict[str, np.ndarray], provider: str, label: str, generated: bool) -> float:
    """Batch 1 and 2 pass the server's input checks and run, each output following the batch axis; returns
    the median batch-1 time."""
    from latlab.server.errors import BadRequest, one_line

    for batch in (1, 2):
        feeds = {n: np.resize(a, (batch, *a.shape[1:])) for n, a in samples.items()}
        try:
            model.validate(feeds)
            outputs = model.run(feeds)
        except BadRequest as exc:
            raise UserError(f"{label}: the server would refuse these inputs: {exc}") from None
        except Exception as exc:  # ORT's own exception types: a model that cannot run these inputs
            hint = "; these inputs were generated from its declared shapes: give real ones with --inputs samples.npz"
            raise UserError(
                f"{label}: the model fails on {provider} at batch {batch}: {one_line(exc)[:300]}"
                f"{hint if generated else ''}"
            ) from None
        strays = [n for n, out in outputs.items() if getattr(out, "ndim", 0) == 0 or out.shape[0] != batch]
        if strays:
            raise UserError(
                f"{label}: output(s) {', '.join(strays)} do not follow the batch axis (at batch {batch}: "
                f"{[list(outputs[n].shape) for n in strays]}), so a batch cannot be split between its "
                f"requests"
            )
    feeds = {n: a[:1] for n, a in samples.items()}
    times, started = [], time.perf_counter()
    while len(times) < 3 or time.perf_counter() - started < TIMING_BUDGET_S:
        run_started = time.perf_counter()
        model.run(feeds)
        times.append(time.perf_counter() - run_started)
    return statistics.median(times)
