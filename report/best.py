"""The best deployment per provider under an SLO, priced one way (costs.machine_price: a machine-hour price, or
a core-hour price times the cores the deployment computes on), and the CPU-vs-GPU verdict in words built from
it. Every table, sentence and picture of the report takes its best rows from here."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from latlab.loadtest.results import Deployment, Step
from latlab.report import costs
from latlab.report.verdict import (
    PROVIDER_HINT,
    UNKNOWN,
    by_server,
    group_name,
    is_gpu,
    is_lower_bound,
    label,
    machine_name,
    max_rate_under,
    provider_of,
    rate_text,
    server_name,
    server_names,
    unmet_text,
)


@dataclass
class Best:
    """One provider's best deployment under one SLO."""

    provider: str
    curve: Deployment | None = None
    step: Step | None = None
    price: costs.Price | None = None
    slo_s: float | None = None
    candidates: list[Deployment] = field(default_factory=list)
    """Every deployment of the provider that was judged: what "never meets it" must hold for."""
    group: str = ""
    """What the row stands for in tables: the provider, or "server, provider" when servers are compared."""

    @property
    def rate(self) -> float:
        return self.step.achieved_rps if self.step else 0.0

    @property
    def unsaturated(self) -> bool:
        """The rate is only a lower bound: the sweep ended (cap or rates ran out) before the deployment
        saturated, and this is its last rate. A curve that does not say counts as saturated."""
        return self.curve is not None and self.step is not None and is_lower_bound(self.curve, self.step)

    @property
    def cost(self) -> float | None:
        """USD per million inferences with one machine kept busy at this rate."""
        if self.price is None or self.rate <= 0:
            return None
        return self.price.per_hour / (self.rate * 3600) * 1e6


def best_per_provider(curves: list[Deployment], slo_s: float, prices: dict) -> list[Best]:
    """Per provider (cpu first, then device providers, then an unknown one), the deployment with the highest rate
    meeting the SLO; per server and provider, servers in order (latlab's first), when servers are compared."""
    best: dict[str, Best] = {}
    servers = by_server(curves)
    order = {name: i for i, name in enumerate(server_names(curves))}
    for curve in curves:
        provider, group = provider_of(curve), group_name(curve, servers)
        step = max_rate_under(curve.steps, slo_s)
        current = best.setdefault(
            group, Best(provider, curve, None, costs.machine_price(prices, curve), slo_s, group=group)
        )
        current.candidates.append(curve)
        if step is not None and step.achieved_rps > current.rate:
            best[group] = Best(
                provider, curve, step, costs.machine_price(prices, curve), slo_s, current.candidates, group
            )
    return sorted(
        best.values(),
        key=lambda r: (
            order[server_name(r.curve)] if servers else 0,
            r.provider == UNKNOWN,
            r.provider != "cpu",
            r.provider,
        ),
    )


def best_rate_text(row: Best) -> str:
    """The best rate as the tables show it (verdict.rate_text); without one, why: "never" with its evidence,
    or where the search stopped."""
    if row.rate <= 0:
        return unmet_text(row.candidates or [row.curve], row.slo_s) if row.slo_s else "–"
    return rate_text(row.curve, row.step, row.slo_s)


def provider_verdict(model: str, curves: list[Deployment], slo_s: float, prices: dict) -> str:
    """The CPU-vs-GPU verdict in plain words for one model and one SLO."""
    bound = f"p99 ≤ {slo_s * 1e3:g} ms"
    rows = best_per_provider(curves, slo_s, prices)
    cpu = _best([r for r in rows if r.provider == "cpu"])
    gpu = _best([r for r in rows if r.provider not in ("cpu", UNKNOWN)])
    unknown = [c for c in curves if provider_of(c) == UNKNOWN]
    if unknown:
        known = [c for c in curves if provider_of(c) != UNKNOWN]
        return _with_unknown(model, bound, known, _best([r for r in rows if r.provider == UNKNOWN]), slo_s, prices)
    if not any(is_gpu(c) for c in curves):
        known = (
            f"the CPU sustains up to {cpu.rate:.0f} req/s ({_where(cpu)}{_cost(cpu)})"
            if cpu
            else "no CPU deployment met it at any measured load"
        )
        return f"{model}, {bound}: {known}. No GPU measurements for {model}: whether a GPU pays off is unknown."
    if cpu is None and gpu is None:
        return f"{model}, {bound}: neither the CPU nor the GPU met it at any measured load."
    if cpu is None:
        return (
            f"{model}, {bound}: only the GPU meets it, up to {gpu.rate:.0f} req/s ({_where(gpu)}{_cost(gpu)}); "
            f"no CPU deployment met it at any measured load."
        )
    if gpu is None:
        return (
            f"{model}, {bound}: only the CPU meets it, up to {cpu.rate:.0f} req/s ({_where(cpu)}{_cost(cpu)}); "
            f"no GPU deployment met it at any measured load."
        )
    if gpu.rate <= cpu.rate:
        return (
            f"{model}, {bound}: the CPU meets it up to {cpu.rate:.0f} req/s ({_where(cpu)}{_cost(cpu)}), "
            f"the GPU only up to {gpu.rate:.0f} req/s ({_where(gpu)}{_cost(gpu)}): "
            "the GPU does not pay off here."
        )
    return _gpu_wins(model, bound, cpu, gpu)


def _with_unknown(
    model: str, bound: str, known: list[Deployment], unknown: Best | None, slo_s: float, prices: dict
) -> str:
    """The verdict where some deployments' provider is not recorded: they count as neither CPU nor GPU; what they
    sustain is said, and the CPU-vs-GPU verdict is given over the others."""
    if unknown is not None:
        said = (
            f"{_where(unknown)} sustains up to {unknown.rate:.0f} req/s{_cost(unknown)}; whether on a CPU "
            f"or a GPU is not recorded ({PROVIDER_HINT})"
        )
    else:
        said = (
            f"no deployment of unknown provider met it at any measured load (whether they ran on a CPU or a "
            f"GPU is not recorded: {PROVIDER_HINT})"
        )
    if not known:
        return f"{model}, {bound}: {said}: no CPU-vs-GPU verdict."
    return f"{provider_verdict(model, known, slo_s, prices)} Provider unknown: {said}."


def _gpu_wins(model: str, bound: str, cpu: Best, gpu: Best) -> str:
    ratio = gpu.rate / cpu.rate
    if cpu.price is None or gpu.price is None:
        cheaper = " (no price for one of them: cost not compared)"
    else:
        lower = "at lower cost" if cpu.price.per_hour < gpu.price.per_hour else "but not at lower cost"
        cheaper = f" {lower} (${cpu.price.per_hour:.2f}/h against ${gpu.price.per_hour:.2f}/h)"
    sentence = (
        f"{model}, {bound}: below {cpu.rate:.0f} req/s the CPU meets it{cheaper}; above it only the GPU "
        f"does, up to {gpu.rate:.0f} req/s, at {ratio:.1f}× the throughput ({_where(gpu)}{_cost(gpu)})."
    )
    if cpu.price is not None and gpu.price is not None:
        replicas = math.ceil(gpu.rate / cpu.rate)
        cpu_bill = replicas * cpu.price.per_hour
        advice = "scale out on CPUs" if cpu_bill < gpu.price.per_hour else "the GPU pays off"
        sentence += (
            f" {replicas} CPU machines would match that rate for ${cpu_bill:.2f}/h against the GPU's "
            f"${gpu.price.per_hour:.2f}/h: {advice}."
        )
    return sentence


def _best(rows: list[Best]) -> Best | None:
    met = [r for r in rows if r.rate > 0]
    return max(met, key=lambda r: r.rate, default=None)


def _where(row: Best) -> str:
    return f"{label(row.curve)} on {machine_name(row.curve)}"


def _cost(row: Best) -> str:
    return f", ${row.cost:.3f} per 1M inferences" if row.cost is not None else ""
