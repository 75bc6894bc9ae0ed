"""The report's words and numbers: max rate under each SLO, cost per million inferences, CPU-vs-GPU verdicts."""

from __future__ import annotations

import math
from dataclasses import replace

from latlab.loadtest.floor import only_the_floor_breaks
from latlab.loadtest.results import Deployment, Step
from latlab.loadtest.search import FLAT, NEVER, slo_met

DEFAULT_PRICES = {"cpu": 0.10, "cuda": 2.50}
"""Example hourly prices (USD) per provider, used when the user gives none; the report says so."""
GPU_HINT = (
    "run `latlab bench` and the lab on a GPU box and merge with `latlab report CPU_RUN GPU_RUN` "
    "(or add `--with-reference` when GPU reference data are committed under report/reference/)"
)


class PriceError(ValueError):
    """An unreadable --price argument."""


PRICE_UNITS = {
    "": "machine-hour",
    "machine": "machine-hour",
    "machine-hour": "machine-hour",
    "core": "core-hour",
    "core-hour": "core-hour",
}


def parse_prices(text: str) -> dict[str, float | dict]:
    """'cpu=0.10,cuda=2.50' -> {'cpu': 0.1, 'cuda': 2.5} (USD per machine-hour per provider);
    'cpu=0.04/core' -> {'cpu': {'usd': 0.04, 'per': 'core-hour'}}: charged per core a CPU deployment uses."""
    prices: dict[str, float | dict] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        provider, sep, value = part.partition("=")
        amount, _, unit = value.partition("/")
        try:
            price = float(amount)
        except ValueError:
            price = math.nan
        per = PRICE_UNITS.get(unit.strip().lower())
        if not sep or not provider.strip() or not 0 < price < math.inf or per is None:
            raise PriceError(
                f"--price: cannot read {part!r}; write provider=USD per machine-hour, or USD/core "
                "per core-hour, e.g. cpu=0.10,cuda=2.50 or cpu=0.04/core,cuda=2.50"
            )
        prices[provider.strip().lower()] = price if per == "machine-hour" else {"usd": price, "per": per}
    if not prices:
        raise PriceError("--price needs at least one provider=price, e.g. cpu=0.10,cuda=2.50")
    return prices


def max_rate_under(steps: list[Step], slo_s: float) -> Step | None:
    """The step with the highest achieved throughput that met the SLO (search.slo_met: the sweep's own rule)."""
    return max((s for s in steps if slo_met(s, slo_s)), key=lambda s: s.achieved_rps, default=None)


def bracket_of(curve: Deployment, slo_s: float) -> dict | None:
    """The sweep's bracket of this SLO for the deployment (`latlab loadtest --slos`); None in older results."""
    return next((b for b in curve.slo_brackets or [] if math.isclose(b["slo_p99_s"], slo_s)), None)


def unmet_text(curves: list[Deployment], slo_s: float) -> str:
    """What a table says for deployments none of whose steps met the SLO: "never" only when one request at a
    time broke it for every one of them (with the fastest such p99), else where the search stopped; either with
    what the generator's own floor accounts for, where only the floor breaks the bound (floor_clause)."""
    singles = [c.single_request for c in curves]
    brackets = [bracket_of(c, slo_s) for c in curves]
    if curves and all(b and b["meaning"] == NEVER for b in brackets) and all(singles):
        fastest = min((s["p99_s"] for s in singles if s.get("p99_s") is not None), default=None)
        said = "never" + (f" (p99 {fastest * 1e3:.0f} ms one request at a time)" if fastest is not None else "")
        return said + floor_clause(curves, slo_s, fastest, None)
    flat = [b for b in brackets if b and b["meaning"].startswith(FLAT)]
    if flat:
        lowest = min((s for c in curves for s in c.steps if s.p99_s is not None), key=_target, default=None)
        said = min(flat, key=lambda b: b["broke_rps"] or 0)["meaning"]
        return said + (floor_clause(curves, slo_s, lowest.p99_s, _target(lowest)) if lowest else "")
    below = [b["broke_rps"] for b in brackets if b and b["broke_rps"] and b["meaning"] != NEVER]
    if below:
        return f"< {min(below):.3g} (met only below the lowest rate measured)"
    lowest = min((_target(s) for c in curves for s in c.steps), default=None)
    return f"not met at ≥ {lowest:g}" if lowest else "not measured"


def floor_clause(curves: list[Deployment], slo_s: float, p99_s: float | None, rate: float | None) -> str:
    """'; within the generator's floor: ...' where the p99 that broke the bound, less what the generator itself
    adds at that rate (loadtest/floor.py), would meet it: the instrument, not the deployment, may break it."""
    floors = [c.generator_floor for c in curves if c.generator_floor]
    row = next((r for f in floors if (r := only_the_floor_breaks(p99_s, slo_s, f, rate))), None)
    if row is None:
        return ""
    return (
        f"; within the generator's floor: it adds p99 {row['p99_s'] * 1e3:.2f} ms on its own here "
        f"(GET of a trivial route at {row['target_rps']:.0f} req/s), so the deployment itself may meet the bound"
    )


def unmet_clause(curves: list[Deployment], slo_s: float) -> str:
    """unmet_text as a sentence's clause: 'never meets it (...)' or 'does not meet it at the rates measured'."""
    why = unmet_text(curves, slo_s)
    if why.startswith("never"):
        return f"never meets it{why.removeprefix('never')}"
    return f"does not meet it at the rates measured ({why})"


def bracket_text(curve: Deployment, step: Step, slo_s: float | None) -> str:
    """A met step's rate, with the rate that broke the SLO beside it when the bracket is wider than the
    sweep's resolution: '104–500'."""
    rate = f"{step.achieved_rps:.0f}"
    bracket = bracket_of(curve, slo_s) if slo_s else None
    if bracket and bracket["broke_rps"] and bracket["width"] is not None and bracket["width"] > bracket["resolution"]:
        rate = f"{rate}–{bracket['broke_rps']:.0f}"
    if bracket and bracket.get("broke_verdict") == "undecided" and bracket.get("needed"):
        rate += f" ({undecided_text(bracket['broke_rps'], bracket['needed'])})"
    return rate


DECIDABLE_REQUESTS = 100_000
"""A step that would need more requests than this to decide a bound is said to sit too close to it: at the
rates a lab measures, such a step would take minutes to hours."""


def undecided_text(rate: float, needed: int) -> str:
    """Why a step neither met nor broke a bound, in words a reader can act on."""
    if needed > DECIDABLE_REQUESTS:
        return f"undecided at {rate:.0f} req/s: its p99 is too close to the bound to decide"
    return f"undecided at {rate:.0f} req/s: a step of {needed:,} requests would decide"


def _target(step: Step) -> float:
    """The load a step was asked for (a rate, or users in closed loop), else what was offered."""
    return float(step.target_rps or step.target or step.offered_rps or 0.0)


def is_lower_bound(curve: Deployment, step: Step) -> bool:
    """Whether a step's rate is only a lower bound of the deployment's: the sweep ended (its cap, or its rates
    ran out) before the deployment saturated, and this is its highest load. A curve that does not say
    (results from before the saturation search) counts as saturated."""
    return curve.saturated is False and _target(step) >= max(_target(s) for s in curve.steps)


def rate_text(curve: Deployment, step: Step | None, slo_s: float | None = None) -> str:
    """A step's achieved rate as a table shows it: '≥ N (not saturated)' when it is only a lower bound, the
    bracket when it is wider than the resolution; with no step, why (see unmet_text)."""
    if step is None:
        return unmet_text([curve], slo_s) if slo_s else "–"
    if is_lower_bound(curve, step):
        return f"≥ {step.achieved_rps:.0f} (not saturated)"
    return bracket_text(curve, step, slo_s)


def sustained_rate(curve: Deployment, slo_s: float) -> float:
    """The curve's highest measured rate under the SLO; 0 when it never met it."""
    step = max_rate_under(curve.steps, slo_s)
    return step.achieved_rps if step else 0.0


UNKNOWN = "?"
"""The provider of a deployment whose record does not say: one served by another server (Triton, MLServer) whose
run gave no --provider and whose model config does not tell, or a curve rebuilt from Prometheus. Neither CPU nor
GPU in any verdict: every text says "provider unknown" and how to record it (PROVIDER_HINT)."""
PROVIDER_HINT = "`latlab loadtest --provider cpu|cuda` records it"
SERVER_NAMES = {"latlab": "latlab", "triton": "Triton", "mlserver": "MLServer", "kserve": "KServe"}
"""GET /v2's `name` of known servers -> how the report writes it."""


def provider_of(curve: Deployment) -> str:
    """The deployment's execution provider, lower case ("cpu", "cuda", "tensorrt"); UNKNOWN when not recorded."""
    return str(curve.provider or UNKNOWN).lower()


def is_gpu(curve: Deployment) -> bool:
    """A device deployment (a recorded provider other than the CPU's); an unknown provider is not one."""
    return provider_of(curve) not in ("cpu", UNKNOWN)


def is_cpu(curve: Deployment) -> bool:
    return provider_of(curve) == "cpu"


def server_name(curve: Deployment) -> str:
    """The server that served the curve, by GET /v2's name ("latlab", "Triton", "MLServer"); results from before
    the server was recorded come from latlab's own."""
    name = str((curve.server or {}).get("name") or "latlab")
    return SERVER_NAMES.get(name.lower(), name)


def server_names(curves: list[Deployment]) -> list[str]:
    """The servers of these curves, latlab's first, then alphabetically."""
    return sorted({server_name(c) for c in curves}, key=lambda name: (name != "latlab", name.lower()))


def tag_servers(curves: list[Deployment]) -> list[Deployment]:
    """The curves, each a copy with `by_server` set, when they come from more than one server: labels, tables,
    curves and the answer then name each curve's server. A one-server set is left as it is (its report renders
    without the server dimension)."""
    if len(server_names(curves)) < 2:
        return curves
    return [replace(c, by_server=True) for c in curves]


def by_server(curves: list[Deployment]) -> bool:
    """Whether these curves are compared by server (tagged by tag_servers, or from more than one server)."""
    return any(c.by_server for c in curves) or len(server_names(curves)) > 1


def provider_text(curve: Deployment) -> str:
    provider = curve.provider
    return "provider unknown" if provider_of(curve) == UNKNOWN else str(provider)


def batching_text(curve: Deployment, short: bool = True) -> str:
    """The batcher settings in a few words: latlab's batcher ("batch ≤ 64, wait ≤ 2 ms", short; "batching ≤ 64,
    wait ≤ 2 ms"), Triton's dynamic batcher from its model config, or "batcher settings unknown"."""
    batcher = curve.batcher or {}
    size = batcher.get("max_batch_size")
    if size is None:
        return "batcher settings unknown" if short else "batching unknown"
    delay = batcher.get("max_queue_delay_ms", 0)
    if curve.server_config is not None:  # Triton's model config: its dynamic batcher
        return "no dynamic batcher" if size == 1 else f"dynamic batcher ≤ {size}, wait ≤ {delay:g} ms"
    text = "batching off" if size == 1 else f"{'batch' if short else 'batching'} ≤ {size}, wait ≤ {delay:g} ms"
    return f"{variant_text(curve)}, {text}" if curve.variant else text


def variant_text(curve: Deployment) -> str:
    """A variant's name and its accuracy against FP32 ("INT8 (min embedding cosine similarity to FP32 0.988)");
    "FP32" for the export itself."""
    if not curve.variant:
        return "FP32"
    accuracy = curve.variant.get("accuracy") or {}
    figure = accuracy.get("figure")
    kept = f" ({accuracy.get('label')} {figure:.3f})" if isinstance(figure, (int, float)) else ""
    return f"{str(curve.variant.get('name', 'variant')).upper()}{kept}"


def label(curve: Deployment) -> str:
    """A deployment in words: name, provider and batcher settings; its server first when the report compares
    servers (`by_server`)."""
    server = f"{server_name(curve)}, " if curve.by_server else ""
    return f"{curve.name} ({server}{provider_text(curve)}, {batching_text(curve)})"


def machine_name(curve: Deployment) -> str:
    """What the machine is: its recorded `name` (server environment, then run), else its GPU (for a device
    deployment) or CPU model. Never the hostname: every lab VM is called `vm`."""
    environment, run = curve.environment or {}, curve.machine or {}
    gpu = environment.get("gpu") or run.get("gpu")
    for name in (
        environment.get("name"),
        run.get("name"),
        gpu if is_gpu(curve) else None,
        environment.get("cpu"),
        run.get("cpu"),
    ):
        if name:
            return str(name)
    return "unnamed machine"


def verdict(model: str, curves: list[Deployment], slo_s: float) -> str:
    """One sentence: which deployment sustains the most load under the SLO, and by how much."""
    best = sorted(
        ((max_rate_under(c.steps, slo_s), c) for c in curves),
        key=lambda pair: pair[0].achieved_rps if pair[0] else -1,
        reverse=True,
    )
    bound = f"p99 ≤ {slo_s * 1e3:g} ms"
    if not best or best[0][0] is None:
        return f"{model}: no deployment met {bound} at any measured load."
    merged = len({machine_name(c) for c in curves}) > 1  # same deployment names may come from two machines

    def name(curve: Deployment) -> str:
        return f"{label(curve)} on {machine_name(curve)}" if merged else label(curve)

    (top_step, top), rest = best[0], best[1:]
    sentence = f"{model} at {bound}: {name(top)} sustains {top_step.achieved_rps:.0f} req/s"
    for step, curve in rest:
        if step is None or step.achieved_rps <= 0:
            sentence += f"; {name(curve)} {unmet_clause([curve], slo_s)}"
        else:
            sentence += (
                f"; {name(curve)} {step.achieved_rps:.0f} req/s ({top_step.achieved_rps / step.achieved_rps:.1f}× less)"
            )
    return sentence + "."


def group_name(curve: Deployment, servers: bool) -> str:
    """What a table's row or column of best deployments stands for: the provider ("cpu", "provider unknown"),
    after the server when servers are compared ("MLServer, provider unknown")."""
    provider = provider_of(curve) if provider_of(curve) != UNKNOWN else "provider unknown"
    return f"{server_name(curve)}, {provider}" if servers else provider


def size_crossover(bench_docs: list[dict]) -> list[str]:
    """Per bench machine with both ort-cpu and ort-cuda batch-1 points: from what size the GPU wins."""
    sentences = []
    for doc in bench_docs:
        pairs = _batch1_pairs(doc)
        if not pairs:
            continue
        host = (doc.get("machine") or {}).get("name") or (doc.get("machine") or {}).get("gpu") or "?"
        wins = [params for params, cpu_s, gpu_s in pairs if gpu_s < cpu_s]
        sizes = f"{len(pairs)} sizes, {human(pairs[0][0])} to {human(pairs[-1][0])} parameters"
        if not wins:
            sentences.append(
                f"bench on {host}: at batch 1 the CPU was as fast or faster at every measured size ({sizes})."
            )
            continue
        threshold = None
        for params, cpu_s, gpu_s in reversed(pairs):  # the GPU must win at this size and every larger one
            if gpu_s >= cpu_s:
                break
            threshold = params
        if threshold is None:
            sentences.append(
                f"bench on {host}: at batch 1 the GPU won at {len(wins)} of {sizes}, but not at the "
                f"largest: no size crossover."
            )
        else:
            sentences.append(
                f"bench on {host}: from about {human(threshold)} parameters the GPU wins at batch 1 "
                f"({len(wins)} of {sizes})."
            )
    return sentences


def _batch1_pairs(doc: dict) -> list[tuple[float, float, float]]:
    """(params, CPU seconds, GPU seconds) for every batch-1 point measured on both ORT backends."""
    cells: dict[tuple, dict[str, float]] = {}
    for experiment in doc.get("experiments", []):
        for point in experiment.get("points", []):
            if point.get("batch_size") != 1 or not point.get("params") or point.get("median_s") is None:
                continue
            if point.get("backend") in ("ort-cpu", "ort-cuda"):
                varied = point.get(experiment.get("vary"))
                key = (experiment.get("name"), experiment.get("model"), point["params"], varied)
                cells.setdefault(key, {})[point["backend"]] = point["median_s"]
    pairs = [(key[2], c["ort-cpu"], c["ort-cuda"]) for key, c in cells.items() if len(c) == 2]
    return sorted(pairs)


def human(count: float) -> str:
    """2100000 -> '2.1M'."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if count >= scale:
            return f"{count / scale:.3g}{suffix}"
    return f"{count:.3g}"
