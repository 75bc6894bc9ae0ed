"""The report's second screen per model, as HTML with inlined PNGs, rendered from its findings (findings.py): the
cost picture (cost per million inferences against sustained rate, crossover marked) and where a request's time
goes inside the server."""

from __future__ import annotations

import base64
import html

from latlab.report import answer, breakdown
from latlab.report.best import best_rate_text
from latlab.report.figures import breakdown_png, cost_png
from latlab.report.findings import AtSlo, Findings


def img(png: bytes, alt: str) -> str:
    return f"<img alt='{html.escape(alt)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"


def cost_lines(at: AtSlo) -> list[dict]:
    """Per provider that met the SLO and has a price, its best deployment's staircase inputs."""
    return [
        {
            "label": f"{r.group}: {answer.side([r.curve])}, {answer.settings(r.curve)} "
            f"({best_rate_text(r)} req/s each, {r.price.basis})",
            "capacity_rps": r.rate,
            "price_per_hour": r.price.per_hour,
            "row": r,
        }
        for r in at.priced
    ]


def cost_section(findings: Findings) -> tuple[str, bytes | None]:
    """The cost picture at the headline SLO (the one the sentence speaks of), crossover marked; (html, png or
    None)."""
    model, at = findings.model, findings.headline
    title = f"<h3>{html.escape(model)}: cost against sustained rate</h3>"
    if at is None:
        return title + "<p>No deployment meets any SLO: nothing to price.</p>", None
    slo, lines, found = at.slo_s, cost_lines(at), at.priced_crossover
    if not lines:
        return title + "<p>No priced deployment meets the SLO: give prices with --price.</p>", None
    top = found["top_rps"] if found else 4 * max(line["capacity_rps"] for line in lines)
    crossing = found["from_rps"] if found else None
    png = cost_png(model, slo, lines, crossing, top)
    if found:
        words = answer.crossover_clause(found)
    elif len(lines) == 1:
        words = "one provider only: no crossover to mark"
    else:
        words = "no CPU-vs-GPU pair priced: no crossover"
    text = (
        f"{title}{img(png, f'cost per million inferences vs rate for {model}')}"
        f"<p>At p99 ≤ {slo * 1e3:g} ms: {html.escape(words)}. Each provider serves a rate with "
        "ceil(rate / its max rate under the SLO) machines kept busy, so its cost falls as a machine fills up "
        "and jumps when one more is needed; load is assumed spread evenly over the machines.</p>"
    )
    return text, png


def time_section(findings: Findings) -> tuple[str, bytes | None]:
    """Where the time goes for every deployment step that has server figures; (html, png or None)."""
    model = findings.model
    title = f"<h3>{html.escape(model)}: where the time goes</h3>"
    found = breakdown.bars(findings)
    client_only = breakdown.client_only(findings.curves)
    if not found and client_only:
        return (
            title + "<p>No server figures in these results: the report shows the client side only (the latency "
            f"curves and tables). {html.escape(client_only)}</p>"
        ), None
    if not found:
        return (
            title + "<p>No server figures in these results (runs before server histograms were recorded "
            "per step, or /metrics unreachable): re-run the sweep to see them.</p>"
        ), None
    for bar in found:
        bar["label"] = breakdown.bar_label(bar)
    png = breakdown_png(model, found, breakdown.PARTS)
    flagged = [breakdown.bar_label(b) for b in found if b["server_bound"]]
    warning = (
        f"<p class='warning'><strong>Server-bound</strong>: {html.escape('; '.join(flagged))}.</p>" if flagged else ""
    )
    triton = [breakdown.bar_label(b) for b in found if (b["step"].server or {}).get("source") == "triton"]
    warning += (
        f"<p>From Triton's nv_inference_* counters ({html.escape('; '.join(triton))}): mean per successful "
        "request of its queue wait, compute input (shown as input transfer), the model's run and compute "
        "output (output transfer); instances busy is estimated as the mean run times the runs counted.</p>"
        if triton
        else ""
    )
    warning += f"<p>{html.escape(client_only)}</p>" if client_only else ""
    return (
        f"{title}{img(png, f'where the time goes for {model}')}{warning}"
        f"<details><summary>the numbers and the server-bound rule</summary>{breakdown.breakdown_table(found)}"
        f"<p>{html.escape(breakdown.RULE)}</p></details>"
    ), png
