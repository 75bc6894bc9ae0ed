"""The report's first screen, rendered from each model's findings (findings.py): per model, the best deployment
per provider under each SLO, its rate and cost, the winner, and one plain sentence; or what is missing for a
CPU-vs-GPU answer and the command that adds it."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from latlab.loadtest.results import Curve
from latlab.report import costs
from latlab.report.best import Best, best_rate_text
from latlab.report.findings import AtSlo, Findings, open_contender
from latlab.report.naming import (
    PROVIDER_HINT,
    UNKNOWN,
    batching_text,
    is_cpu,
    is_gpu,
    provider_of,
    provider_text,
    server_name,
    server_names,
)
from latlab.report.rates import unmet_clause
from latlab.report.sections import p99_interval, samples_text

ADD_SERVED_GPU = (
    "for served GPU curves run the gpu plan on a GPU box, `latlab lab --plan gpu`, and merge: "
    "`latlab report CPU_RUN GPU_RUN`"
)
ADD_GPU = (
    "`latlab report RUN --with-reference` merges the committed GPU data (an H100's in-process bench, cnn and "
    f"minilm served on an H200); {ADD_SERVED_GPU}"
)


def settings(curve: Curve) -> str:
    """The batching settings in a few words."""
    return batching_text(curve, short=False)


def side(curves: Sequence[Curve]) -> str:
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


def compared(curves: Sequence[Curve]) -> str:
    """'16 CPU cores vs 1 NVIDIA H100 80GB HBM3'; the servers first when they are not only latlab's
    ('latlab vs MLServer: 2 CPU cores vs provider unknown')."""
    cpu = [c for c in curves if is_cpu(c)]
    gpu = [c for c in curves if is_gpu(c)]
    unknown = [c for c in curves if provider_of(c) == UNKNOWN]
    sides = " vs ".join(side(group) for group in (cpu, gpu, unknown) if group)
    servers = server_names(curves)
    return f"{' vs '.join(servers)}: {sides}" if servers != ["latlab"] else sides


def _money(value: float | None) -> str:
    if value is None:
        return "no price"
    return f"${value:.2f}" if value >= 0.01 else f"${value:.4f}"


def _cost_text(row: Best) -> str:
    """'$0.52', or '≤ $0.52' where the rate is a lower bound (the sweep ended before the deployment saturated)."""
    return f"≤ {_money(row.cost)}" if row.unsaturated and row.cost is not None else _money(row.cost)


def _who(row: Best) -> str:
    if provider_of(row.curve) == UNKNOWN:
        return server_name(row.curve)
    return "the GPU" if is_gpu(row.curve) else "the CPU"


def _clause(row: Best, first: bool, servers: bool = False) -> str:
    who = _who(row)
    where = f"{server_name(row.curve)}, " if servers and provider_of(row.curve) != UNKNOWN else ""
    what = f"{who} ({where}{side([row.curve])}, {settings(row.curve)})"
    if row.rate <= 0:
        return f"{who} {unmet_clause(row.unmet)}"
    if row.unsaturated:
        rate = f"serves ≥ {row.rate:.0f} req/s (not saturated)"
    else:
        rate = f"serves {row.rate:.0f} req/s" if first else f"tops out at {row.rate:.0f} req/s"
    cost = f" at {_cost_text(row)} per million" if row.cost is not None else ""
    return f"{what} {rate}{cost}"


def crossover_clause(found: dict) -> str:
    """Where the cheaper provider changes (findings.cost_crossover), in words."""
    names = {"cpu": "the CPU", "gpu": "the GPU"}
    low = names[found["cheaper_low"]]
    if found["from_rps"] is None:
        text = f"{low} is cheaper at every rate up to {found['top_rps']:.0f} req/s"
    else:
        bound = "at most " if found.get("at_most") else ""
        text = f"below {bound}{found['from_rps']:.0f} req/s {low} is cheaper, above it {names[found['cheaper_high']]}"
    if "open" in found:
        side = found["open"]
        text += (
            f" as measured, but {names[side['side']]} was not saturated at {side['rate_rps']:.0f} req/s: if it serves "
            f"more than {side['needs_rps']:.0f} req/s it is the cheaper at high rates, so which pays off is open "
            "until a sweep reaches its limit"
        )
    return text


def sentence(findings: Findings) -> str:
    """The model's answer in one plain sentence, at the headline SLO."""
    model, at = findings.model, findings.headline
    if at is None:
        why, loosest = findings.none_met, max(findings.slos_s)
        if why.startswith("never"):
            return f"{model}: no deployment meets p99 ≤ {loosest * 1e3:g} ms, {why}."
        return f"{model}: no deployment meets p99 ≤ {loosest * 1e3:g} ms at any measured load ({why})."
    cpu, gpu, unknown = at.cpu, at.gpu, at.unknown
    ordered = sorted([r for r in (cpu, gpu, unknown) if r is not None], key=lambda r: -r.rate)
    clauses = [_clause(row, i == 0, findings.servers) for i, row in enumerate(ordered)]
    if cpu is not None and gpu is not None:
        if at.crossover:
            clauses.append(crossover_clause(at.crossover))
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
    return f"{model}: at p99 ≤ {at.slo_s * 1e3:g} ms " + "; ".join(clauses) + "."


def server_sentence(findings: Findings) -> str:
    """Where servers are compared: per SLO, the server whose best deployment sustains the most under it, and what
    each other server's best sustains."""
    parts = []
    for at in sorted(findings.by_slo, key=lambda found: found.slo_s):
        ranked = sorted(at.per_server, key=lambda r: -r.rate)
        bound = f"at p99 ≤ {at.slo_s * 1e3:g} ms"
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
                top, f"{provider_text(top.curve)}, {settings(top.curve)}"
            )
        for row in ranked[len(ties) :]:
            if row.rate <= 0:
                text += f", {server_name(row.curve)} {unmet_clause(row.unmet)}"
            else:
                text += f", {server_name(row.curve)} {_rate_words(row)} ({top.rate / row.rate:.1f}× less)"
        parts.append(text)
    return f"{findings.model}, by server: " + "; ".join(parts) + "."


def _rate_words(row: Best, extra: str = "") -> str:
    """'240 req/s', '≥ 1347 req/s (not saturated)', '104–500 req/s'; with `extra`, in the parenthesis first."""
    number, _, why = best_rate_text(row).partition(" (")
    inside = "; ".join(part for part in (extra, why.removesuffix(")")) if part)
    return f"{number} req/s ({inside})" if inside else f"{number} req/s"


def _winner_cell(at: AtSlo) -> str:
    rows, best = at.best, at.winner
    if best is None:
        return "none meets it"
    met = [r for r in rows if r.rate > 0]
    if len(rows) == 1:
        return f"{best.group} (only provider measured)"
    priced = all(r.cost is not None for r in met)  # the winner is by cost only when every one has a price
    why = (
        "only one meeting it"
        if len(met) == 1
        else ("cheaper per inference" if priced else "higher rate (no price to compare)")
    )
    rival = open_contender(at) if priced else None
    if rival is not None:
        row, needs = rival
        why += f" at the rates measured; {row.group}, not saturated at {row.rate:.0f}, wins above {needs:.0f} req/s"
    return f"{best.group} ({why})"


def _heading(row: Best) -> str:
    """A column group's heading: 'cpu (16 CPU cores)', 'latlab, cpu (2 CPU cores)', 'MLServer, provider unknown'.
    `row`: the group's best, whose candidates are every deployment of the group."""
    what = side(row.candidates)
    return row.group if what == "provider unknown" else f"{row.group} ({what})"


def answer_table(findings: Findings) -> str:
    """One row per SLO; per provider (per server and provider when servers are compared) its best settings, max
    rate (≥ when unsaturated), cost; the winner."""
    columns = findings.by_slo[0].best
    providers = [r.group for r in columns]
    head = "".join(f"<th colspan='3'>{html.escape(_heading(r))}</th>" for r in columns)
    sub = "<th>best settings</th><th>max req/s</th><th>$ per 1M</th>" * len(providers)
    rows = []
    for at in findings.by_slo:
        found = {r.group: r for r in at.best}
        cells = ""
        for provider in providers:
            row = found[provider]
            best = settings(row.curve) if row.rate > 0 else "–"
            cells += (
                f"<td class='text'>{html.escape(best)}</td><td>{html.escape(best_rate_text(row))}</td>"
                f"<td>{_cost_text(row) if row.rate > 0 else '–'}</td>"
            )
        winner_text = html.escape(_winner_cell(at))
        rows.append(f"<tr><td>p99 ≤ {at.slo_s * 1e3:g} ms</td>{cells}<td class='text'>{winner_text}</td></tr>")
    return (
        f"<table class='answer'><tr><th rowspan='2'>SLO</th>{head}<th rowspan='2'>winner at full load</th></tr>"
        f"<tr>{sub}</tr>{''.join(rows)}</table>"
    )


def evidence(findings: Findings) -> str:
    """The p99 of every step behind the answer table, with its interval and SLO decision (loadtest/confidence.py),
    folded: a reader can check how well each rate's p99 was measured."""
    items = []
    for at in findings.by_slo:
        slo = at.slo_s
        for row in at.best:
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


def answer_section(models: Sequence[Findings], prices_note: str, bench_gpu: bool = False) -> str:
    """The first screen: what is compared, then per model its sentence and table; what is missing, if anything.
    `bench_gpu`: an in-process bench with GPU points is merged in (it answers per model size, not served)."""
    every = [c for findings in models for c in findings.curves]
    parts = [
        f"<section id='answer'><p class='compared'><strong>Compared: {html.escape(compared(every))}.</strong> "
        f"{prices_note}</p>"
    ]
    if not any(findings.has_gpu for findings in models):
        what = (
            "No served GPU data</strong>: the bench below compares CPU and GPU in process, per model size; "
            "served under load, this report cannot say whether a GPU pays off. "
            f"{html.escape(ADD_SERVED_GPU[0].upper() + ADD_SERVED_GPU[1:])}"
            if bench_gpu
            else f"No GPU data</strong>: this report cannot say whether a GPU pays off. {html.escape(ADD_GPU)}"
        )
        parts.append(f"<p class='warning'><strong>{what}.</p>")
    for findings in models:
        said = [sentence(findings)]
        if findings.servers:  # the best server per SLO first; the CPU-vs-GPU answer where both were measured
            both = findings.has_cpu and findings.has_gpu
            said = [server_sentence(findings)] + (said if both else [])
        parts.append(
            f"<h2 class='model'>{html.escape(findings.model)}</h2>"
            + "".join(f"<p class='sentence'>{html.escape(s)}</p>" for s in said)
            + f"{answer_table(findings)}{evidence(findings)}"
        )
    return "".join(parts) + "</section>"
