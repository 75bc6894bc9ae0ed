"""The report's verdict sentences, per model and SLO, from its findings (findings.py): which deployment sustains
the most load and by how much (verdict), and whether the GPU pays off against the CPU (provider_verdict)."""

from __future__ import annotations

import math

from latlab.loadtest.results import Curve
from latlab.report.best import Best, Measured
from latlab.report.findings import Findings, overtaking_rate
from latlab.report.naming import PROVIDER_HINT, label, machine_name
from latlab.report.rates import is_lower_bound, unmet_clause


def verdict(findings: Findings, slo_s: float) -> str:
    """One sentence: which deployment sustains the most load under the SLO, and by how much."""
    model = findings.model
    best = sorted(findings.at(slo_s).measured, key=lambda m: m.step.achieved_rps if m.step else -1, reverse=True)
    bound = f"p99 ≤ {slo_s * 1e3:g} ms"
    if not best or best[0].step is None:
        return f"{model}: no deployment met {bound} at any measured load."
    merged = len({machine_name(c) for c in findings.curves}) > 1  # same deployment names may come from two machines

    def name(curve: Curve) -> str:
        return f"{label(curve)} on {machine_name(curve)}" if merged else label(curve)

    top, rest = best[0], best[1:]
    sentence = f"{model} at {bound}: {name(top.curve)} sustains {_rate(top)}"
    for found in rest:
        if found.step is None or found.rate <= 0:
            sentence += f"; {name(found.curve)} {unmet_clause(found.unmet)}"
        else:
            less = "at least " if is_lower_bound(top.curve, top.step) else ""
            sentence += f"; {name(found.curve)} {_rate(found)} ({less}{top.rate / found.rate:.1f}× less)"
    return sentence + "."


def _rate(found: Measured | Best) -> str:
    """'240 req/s', or '≥ 1347 req/s (not saturated)' where the sweep ended before the deployment saturated."""
    if found.curve is not None and found.step is not None and is_lower_bound(found.curve, found.step):
        return f"≥ {found.rate:.0f} req/s (not saturated)"
    return f"{found.rate:.0f} req/s"


def provider_verdict(findings: Findings, slo_s: float) -> str:
    """The CPU-vs-GPU verdict in plain words for one model and one SLO. Deployments whose provider is not recorded
    count as neither: what they sustain is said after the verdict over the others."""
    model, bound = findings.model, f"p99 ≤ {slo_s * 1e3:g} ms"
    found = findings.at(slo_s)
    cpu, gpu = _met(found.cpu), _met(found.gpu)
    known = _known_verdict(model, bound, cpu, gpu, findings.has_gpu)
    if not findings.has_unknown:
        return known
    unknown = _met(found.unknown)
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
    if not findings.has_cpu and not findings.has_gpu:
        return f"{model}, {bound}: {said}: no CPU-vs-GPU verdict."
    return f"{known} Provider unknown: {said}."


def _known_verdict(model: str, bound: str, cpu: Best | None, gpu: Best | None, has_gpu: bool) -> str:
    """The verdict over the deployments whose provider is recorded: the best CPU and device rows that met it."""
    if not has_gpu:
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


def _gpu_wins(model: str, bound: str, cpu: Best, gpu: Best) -> str:
    ratio = gpu.rate / cpu.rate
    if cpu.price is None or gpu.price is None:
        cheaper = " (no price for one of them: cost not compared)"
    else:
        lower = "at lower cost" if cpu.price.per_hour < gpu.price.per_hour else "but not at lower cost"
        cheaper = f" {lower} (${cpu.price.per_hour:.2f}/h against ${gpu.price.per_hour:.2f}/h)"
    at_least = "at least " if gpu.unsaturated else ""  # the sweep ended before the GPU saturated
    up_to = f"up to ≥ {gpu.rate:.0f} req/s (not saturated)" if gpu.unsaturated else f"up to {gpu.rate:.0f} req/s"
    sentence = (
        f"{model}, {bound}: below {cpu.rate:.0f} req/s the CPU meets it{cheaper}; above it only the GPU "
        f"does, {up_to}, at {at_least}{ratio:.1f}× the throughput ({_where(gpu)}{_cost(gpu)})."
    )
    if cpu.price is not None and gpu.price is not None:
        replicas = math.ceil(gpu.rate / cpu.rate)
        cpu_bill = replicas * cpu.price.per_hour
        advice = "scale out on CPUs" if cpu_bill < gpu.price.per_hour else "the GPU pays off"
        if gpu.unsaturated and cpu_bill < gpu.price.per_hour:
            needs = overtaking_rate(gpu, cpu)
            advice += f" unless the GPU serves more than {needs:.0f} req/s, which a sweep to its limit would show"
        sentence += (
            f" {at_least}{replicas} CPU machines would match that rate for {at_least}${cpu_bill:.2f}/h against "
            f"the GPU's ${gpu.price.per_hour:.2f}/h: {advice}."
        )
    return sentence


def _met(row: Best | None) -> Best | None:
    """The row where it met the SLO; None where it did not."""
    return row if row is not None and row.rate > 0 else None


def _where(row: Best) -> str:
    return f"{label(row.curve)} on {machine_name(row.curve)}"


def _cost(row: Best) -> str:
    return f", ${row.cost:.3f} per 1M inferences" if row.cost is not None else ""
