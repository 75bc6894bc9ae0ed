"""The report's first screen: per model, the best deployment per provider under each SLO, its rate and cost,
the winner, and one plain sentence; or what is missing for a CPU-vs-GPU answer and the command that adds it."""

from __future__ import annotations

import html
import math
from dataclasses import replace

from latlab.loadtest.results import Deployment
from latlab.report import costs
from latlab.report import verdict
from latlab.report.best import Best, best_per_provider, best_rate_text
from latlab.report.sections import p99_interval, samples_text
from latlab.report.verdict import (
    PROVIDER_HINT,
    UNKNOWN,
    by_server,
    group_name,
    is_cpu,
    is_gpu,
    max_rate_under,
    provider_of,
    server_name,
    server_names,
    unmet_clause,
    unmet_text,
)

ADD_SERVED_GPU = (
    "for served GPU curves run the gpu plan on a GPU box, `latlab lab --plan gpu`, and merge: "
    "`latlab report CPU_RUN GPU_RUN`"
)
ADD_GPU = f"`latlab report RUN --with-reference` merges the committed H100 data (in-process bench); {ADD_SERVED_GPU}"


def winner(rows: list[Best]) -> Best | None:
    """The cheaper per inference when each runs flat out; by rate when a price is missing."""
    met = [r for r in rows if r.rate > 0]
    if all(r.cost is not None for r in met):
        return min(met, key=lambda r: r.cost, default=None)
    return max(met, key=lambda r: r.rate, default=None)


def settings(curve: Deployment) -> str:
    """The batching settings in a few words."""
    return verdict.batching_text(curve, short=False)


def side(curves: list[Deployment]) -> str:
    """What one side of the comparison is: '16 CPU cores', '1 NVIDIA H100 80GB HBM3', 'provider unknown'."""
    if curves and provider_of(curves[0]) == UNKNOWN:
        return "provider unknown"
    if curves and is_gpu(curves[0]):
        names = sorted(
            {
                str((c.environment or {}).get("gpu") or (c.machine or {}).get("gpu") or "GPU of unknown model")
                for c in curves
            }
        )
        return " / ".join(f"1 {n}" for n in names)
    threads = sorted({t for t in (costs.cpu_threads(c) for c in curves) if t})
    if not threads:
        return "CPU, thread count not recorded"
    count = "/".join(str(t) for t in threads)
    return f"{count} CPU core{'s' if threads[-1] > 1 else ''}"


def compared(curves: list[Deployment]) -> str:
    """'16 CPU cores vs 1 NVIDIA H100 80GB HBM3'; the servers first when they are not only latlab's
    ('latlab vs MLServer: 2 CPU cores vs provider unknown')."""
    cpu = [c for c in curves if is_cpu(c)]
    gpu = [c for c in curves if is_gpu(c)]
    unknown = [c for c in curves if provider_of(c) == UNKNOWN]
    sides = " vs ".join(side(group) for group in (cpu, gpu, unknown) if group)
    servers = server_names(curves)
    return f"{' vs '.join(servers)}: {sides}" if servers != ["latlab"] else sides


def headline_slo(curves: list[Deployment], slos_s: list[float]) -> float | None:
    """The SLO the sentence speaks of: the tightest that both CPU and GPU meet, else the tightest any meets."""

    def meets(group: list[Deployment], slo: float) -> bool:
        return any(max_rate_under(c.steps, slo) for c in group)

    cpu = [c for c in curves if is_cpu(c)]
    gpu = [c for c in curves if is_gpu(c)]
    ordered = sorted(slos_s)
    both = [s for s in ordered if meets(cpu, s) and meets(gpu, s)]
    anyone = [s for s in ordered if meets(curves, s)]
    return (both or anyone or [None])[0]


def _money(value: float | None) -> str:
    if value is None:
        return "no price"
    return f"${value:.2f}" if value >= 0.01 else f"${value:.4f}"


def _who(row: Best) -> str:
    if provider_of(row.curve) == UNKNOWN:
        return server_name(row.curve)
    return "the GPU" if is_gpu(row.curve) else "the CPU"


def _clause(row: Best, first: bool, servers: bool = False) -> str:
    who = _who(row)
    where = f"{server_name(row.curve)}, " if servers and provider_of(row.curve) != UNKNOWN else ""
    what = f"{who} ({where}{side([row.curve])}, {settings(row.curve)})"
    if row.rate <= 0:
        return f"{who} {unmet_clause(row.candidates or [row.curve], row.slo_s)}"
    if row.unsaturated:
        rate = f"serves ≥ {row.rate:.0f} req/s (not saturated)"
    else:
        rate = f"serves {row.rate:.0f} req/s" if first else f"tops out at {row.rate:.0f} req/s"
    cost = f" at {_money(row.cost)} per million" if row.cost is not None else ""
    return f"{what} {rate}{cost}"


def cost_crossover(cpu: Best, gpu: Best) -> dict | None:
    """costs.crossover for the two rows, over rates up to 4× the larger capacity; None without both."""
    if cpu.rate <= 0 or gpu.rate <= 0 or cpu.price is None or gpu.price is None:
        return None
    top = 4 * max(cpu.rate, gpu.rate)
    return {**costs.crossover((cpu.rate, cpu.price.per_hour), (gpu.rate, gpu.price.per_hour), top), "top_rps": top}


def crossover_clause(found: dict) -> str:
    names = {"cpu": "the CPU", "gpu": "the GPU"}
    low = names[found["cheaper_low"]]
    if found["from_rps"] is None:
        return f"{low} is cheaper at every rate up to {found['top_rps']:.0f} req/s"
    return f"below {found['from_rps']:.0f} req/s {low} is cheaper, above it {names[found['cheaper_high']]}"


def sentence(model: str, curves: list[Deployment], slos_s: list[float], prices: dict) -> str:
    """The model's answer in one plain sentence, at the headline SLO."""
    slo = headline_slo(curves, slos_s)
    if slo is None:
        why = unmet_text(curves, max(slos_s))
        if why.startswith("never"):
            return f"{model}: no deployment meets p99 ≤ {max(slos_s) * 1e3:g} ms, {why}."
        return f"{model}: no deployment meets p99 ≤ {max(slos_s) * 1e3:g} ms at any measured load ({why})."
    rows = best_per_provider(curves, slo, prices)
    servers = by_server(curves)
    cpu = max((r for r in rows if r.provider == "cpu"), key=lambda r: r.rate, default=None)
    gpu = max((r for r in rows if r.provider not in ("cpu", UNKNOWN)), key=lambda r: r.rate, default=None)
    unknown = max((r for r in rows if r.provider == UNKNOWN), key=lambda r: r.rate, default=None)
    ordered = sorted([r for r in (cpu, gpu, unknown) if r is not None], key=lambda r: -r.rate)
    clauses = [_clause(row, i == 0, servers) for i, row in enumerate(ordered)]
    if cpu is not None and gpu is not None:
        found = cost_crossover(cpu, gpu)
        if found:
            clauses.append(crossover_clause(found))
    elif unknown is not None:
        clauses.append(
            f"whether {server_name(unknown.curve)} ran on a CPU or a GPU is not recorded "
            f"({PROVIDER_HINT}), so whether a GPU pays off is unknown"
        )
    else:
        clauses.append(
            "no GPU measurements, so whether a GPU pays off is unknown"
            if gpu is None
            else "no CPU measurements to compare with"
        )
    return f"{model}: at p99 ≤ {slo * 1e3:g} ms " + "; ".join(clauses) + "."


def server_sentence(model: str, curves: list[Deployment], slos_s: list[float], prices: dict) -> str:
    """Where servers are compared: per SLO, the server whose best deployment sustains the most under it, and what
    each other server's best sustains."""
    parts = []
    for slo in sorted(slos_s):
        rows = best_per_server(curves, slo, prices)
        ranked = sorted(rows, key=lambda r: -r.rate)
        bound = f"at p99 ≤ {slo * 1e3:g} ms"
        top = ranked[0] if ranked and ranked[0].rate > 0 else None
        if top is None:
            parts.append(f"{bound} no server meets it")
            continue
        ties = [r for r in ranked if r.rate > 0 and top.rate / r.rate < 1.05]  # a prefix of ranked
        if len(ties) > 1:
            names = [server_name(r.curve) for r in ties]
            text = f"{bound} {', '.join(names[:-1])} and {names[-1]} serve about as much (within 5%): " + ", ".join(
                f"{server_name(r.curve)} {_rate_words(r)}" for r in ties
            )
        else:
            text = f"{bound} {server_name(top.curve)} serves the most, " + _rate_words(
                top, f"{verdict.provider_text(top.curve)}, {settings(top.curve)}"
            )
        for row in ranked[len(ties) :]:
            if row.rate <= 0:
                text += f", {server_name(row.curve)} {unmet_clause(row.candidates or [row.curve], slo)}"
            else:
                text += f", {server_name(row.curve)} {_rate_words(row)} ({top.rate / row.rate:.1f}× less)"
        parts.append(text)
    return f"{model}, by server: " + "; ".join(parts) + "."


def _rate_words(row: Best, extra: str = "") -> str:
    """'240 req/s', '≥ 1347 req/s (not saturated)', '104–500 req/s'; with `extra`, in the parenthesis first."""
    number, _, why = best_rate_text(row).partition(" (")
    inside = "; ".join(part for part in (extra, why.removesuffix(")")) if part)
    return f"{number} req/s ({inside})" if inside else f"{number} req/s"


def best_per_server(curves: list[Deployment], slo_s: float, prices: dict) -> list[Best]:
    """Per server, its best row under the SLO (any provider), servers in order (latlab's first)."""
    best: dict[str, Best] = {}
    for row in best_per_provider(curves, slo_s, prices):
        server = server_name(row.curve)
        if server not in best:
            best[server] = row
        elif row.rate > best[server].rate:
            best[server] = replace(row, candidates=best[server].candidates + row.candidates)
        else:
            best[server].candidates = best[server].candidates + row.candidates
    return list(best.values())


def _winner_cell(rows: list[Best]) -> str:
    best = winner(rows)
    if best is None:
        return "none meets it"
    met = [r for r in rows if r.rate > 0]
    if len(rows) == 1:
        return f"{best.group} (only provider measured)"
    priced = all(r.cost is not None for r in met)  # winner() compares cost only when every one has a price
    why = (
        "only one meeting it"
        if len(met) == 1
        else ("cheaper per inference" if priced else "higher rate (no price to compare)")
    )
    return f"{best.group} ({why})"


def _of_group(curves: list[Deployment], group: str) -> list[Deployment]:
    servers = by_server(curves)
    return [c for c in curves if group_name(c, servers) == group]


def _heading(curves: list[Deployment], group: str) -> str:
    """A column group's heading: 'cpu (16 CPU cores)', 'latlab, cpu (2 CPU cores)', 'MLServer, provider unknown'."""
    what = side(_of_group(curves, group))
    return group if what == "provider unknown" else f"{group} ({what})"


def answer_table(curves: list[Deployment], slos_s: list[float], prices: dict) -> str:
    """One row per SLO; per provider (per server and provider when servers are compared) its best settings, max
    rate (≥ when unsaturated), cost; the winner."""
    providers = [r.group for r in best_per_provider(curves, slos_s[0], prices)]
    head = "".join(f"<th colspan='3'>{html.escape(_heading(curves, p))}</th>" for p in providers)
    sub = "<th>best settings</th><th>max req/s</th><th>$ per 1M</th>" * len(providers)
    rows = []
    for slo in slos_s:
        found = {r.group: r for r in best_per_provider(curves, slo, prices)}
        cells = ""
        for provider in providers:
            row = found[provider]
            best = settings(row.curve) if row.rate > 0 else "–"
            cells += (
                f"<td class='text'>{html.escape(best)}</td><td>{html.escape(best_rate_text(row))}</td>"
                f"<td>{_money(row.cost) if row.rate > 0 else '–'}</td>"
            )
        winner_text = html.escape(_winner_cell(list(found.values())))
        rows.append(f"<tr><td>p99 ≤ {slo * 1e3:g} ms</td>{cells}<td class='text'>{winner_text}</td></tr>")
    return (
        f"<table class='answer'><tr><th rowspan='2'>SLO</th>{head}<th rowspan='2'>winner at full load</th></tr>"
        f"<tr>{sub}</tr>{''.join(rows)}</table>"
    )


def evidence(curves: list[Deployment], slos_s: list[float], prices: dict) -> str:
    """The p99 of every step behind the answer table, with its interval and SLO decision (loadtest/confidence.py),
    folded: a reader can check how well each rate's p99 was measured."""
    items = []
    for slo in slos_s:
        for row in best_per_provider(curves, slo, prices):
            if row.step is None:
                continue
            ci = row.step.confidence or {}
            decision = next((d for d in ci.get("slos", []) if math.isclose(d["slo_p99_s"], slo)), None)
            said = f", {decision['verdict']} at {ci['level']:.0%}" if decision else ""
            needed = f" (a decision needs {decision['needed']} requests)" if decision and decision.get("needed") else ""
            items.append(
                f"<li>p99 ≤ {slo * 1e3:g} ms, {html.escape(row.group)} at {row.rate:.0f} req/s: p99 "
                f"{row.step.p99_s * 1e3:.2f} ms (interval {html.escape(p99_interval(row.step))} ms, "
                f"{samples_text(row.step)} requests{said}){needed}</li>"
            )
    if not items:
        return ""
    return (
        "<details class='evidence'><summary>p99 intervals behind this table</summary>"
        f"<ul>{''.join(items)}</ul></details>"
    )


def answer_section(
    by_model: dict[str, list[Deployment]], slos_s: list[float], prices: dict, prices_note: str, bench_gpu: bool = False
) -> str:
    """The first screen: what is compared, then per model its sentence and table; what is missing, if anything.
    `bench_gpu`: an in-process bench with GPU points is merged in (it answers per model size, not served)."""
    every = [c for group in by_model.values() for c in group]
    parts = [
        f"<section id='answer'><p class='compared'><strong>Compared: {html.escape(compared(every))}.</strong> "
        f"{prices_note}</p>"
    ]
    if not any(is_gpu(c) for c in every):
        what = (
            "No served GPU data</strong>: the bench below compares CPU and GPU in process, per model size; "
            "served under load, this report cannot say whether a GPU pays off. "
            f"{html.escape(ADD_SERVED_GPU[0].upper() + ADD_SERVED_GPU[1:])}"
            if bench_gpu
            else f"No GPU data</strong>: this report cannot say whether a GPU pays off. {html.escape(ADD_GPU)}"
        )
        parts.append(f"<p class='warning'><strong>{what}.</p>")
    for model, curves in by_model.items():
        said = [sentence(model, curves, slos_s, prices)]
        if by_server(curves):  # the best server per SLO first; the CPU-vs-GPU answer where both were measured
            both = any(is_cpu(c) for c in curves) and any(is_gpu(c) for c in curves)
            said = [server_sentence(model, curves, slos_s, prices)] + (said if both else [])
        parts.append(
            f"<h2 class='model'>{html.escape(model)}</h2>"
            + "".join(f"<p class='sentence'>{html.escape(s)}</p>" for s in said)
            + f"{answer_table(curves, slos_s, prices)}{evidence(curves, slos_s, prices)}"
        )
    return "".join(parts) + "</section>"
