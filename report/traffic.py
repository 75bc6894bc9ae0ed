"""The verdict under other traffic: where a model was swept under several arrival processes (`latlab lab
--traffic`), its best rate per provider under each SLO and each process side by side, one sentence per process
on how it moved the answer, and a picture of the rate under the headline SLO against the burstiness as sent.
Everything comes from findings.by_traffic; this module only words and draws it."""

from __future__ import annotations

import html
import statistics

from latlab.report.best import Best
from latlab.report.figures import traffic_png
from latlab.report.findings import AtSlo, Findings
from latlab.report.pictures import img

KEPT_UP = 0.9
"""A step kept up when it achieved this share of what it offered (the sweep's own saturation rule)."""
KEPT = 0.05
"""A rate within this fraction of the first process's is said to be kept rather than to fall or rise."""


def sent_cv(found: Findings) -> float | None:
    """The burstiness the server was offered under this process: the median over its steps that kept up (achieved
    at least KEPT_UP of offered, the generator not bound) of the CV of the gaps between requests as sent
    (Step.arrival_cv); past saturation the generator sends in bunches whatever the process. None where no step
    recorded one."""
    steps = [s for c in found.curves for s in c.steps if s.arrival_cv is not None]
    kept_up = [s for s in steps if s.achieved_rps >= KEPT_UP * s.offered_rps and not s.generator_bound]
    cvs = [s.arrival_cv for s in kept_up or steps]
    return statistics.median(cvs) if cvs else None


def traffic_name(found: Findings, cv: float | None) -> str:
    """The process's name, with the CV its steps were sent at (sent_cv)."""
    return f"{found.curves[0].traffic}" + (f" (CV {cv:.1f} as sent)" if cv is not None else "")


def _change(first: Best, other: Best) -> str:
    if first.rate <= 0 and other.rate <= 0:
        return "meets it under neither"
    if other.rate <= 0:
        return f"no longer meets it (from {first.rate:.0f} req/s)"
    if first.rate <= 0:
        return f"now meets it, at {other.rate:.0f} req/s"
    change = other.rate / first.rate - 1
    if abs(change) <= KEPT:
        return f"keeps {other.rate:.0f} req/s ({change:+.0%})"
    return f"{'falls' if change < 0 else 'rises'} from {first.rate:.0f} to {other.rate:.0f} req/s ({change:+.0%})"


def moved(first: AtSlo, other: AtSlo, name: str) -> str:
    """One sentence: how the process `name` moved the best CPU and device rates under one SLO, and the winner."""
    parts = []
    for kind, side in (("cpu", "the CPU"), ("gpu", "the GPU")):
        a, b = getattr(first, kind), getattr(other, kind)
        if a is not None and b is not None:
            label = f" ({b.curve.name})" if b.curve is not None and b.rate > 0 else ""
            parts.append(f"{side}'s best{label} {_change(a, b)}")
    if not parts:
        return ""
    sentence = f"Under {name} arrivals, at p99 ≤ {first.slo_s * 1e3:g} ms: {'; '.join(parts)}."
    was, now = first.winner, other.winner
    if was is not None and now is not None and was.provider != now.provider:
        sentence += f" The cheaper side changes from {was.provider} to {now.provider}."
    return sentence


def traffic_section(per_traffic: list[Findings]) -> tuple[str, bytes | None]:
    """The section of one model swept under several processes (none for one), and its picture's PNG."""
    if len(per_traffic) < 2:
        return "", None
    first = per_traffic[0]
    model = html.escape(first.model)
    headline = (first.headline or first.by_slo[-1]).slo_s if first.by_slo else None
    cvs = [sent_cv(f) for f in per_traffic]
    names = [traffic_name(f, cv) for f, cv in zip(per_traffic, cvs)]
    pairs = list(zip(per_traffic, names))[1:]
    sentences = [moved(first.at(headline), o.at(headline), name) for o, name in pairs] if headline else []
    head = "".join(f"<th>{html.escape(n)}</th>" for n in names)
    rows = []
    for slo_s in first.slos_s:
        for k, row in enumerate(first.at(slo_s).best):
            cells = []
            for found in per_traffic:
                match = next((b for b in found.at(slo_s).best if b.group == row.group), None)
                rate = f"{match.rate:.0f}" if match is not None and match.rate > 0 else "not met"
                cells.append(f"<td>{rate}</td>")
            slo = f"p99 ≤ {slo_s * 1e3:g} ms" if k == 0 else ""
            rows.append(f"<tr><td>{slo}</td><td>{html.escape(row.group)}</td>{''.join(cells)}</tr>")
    png = traffic_png(first.model, headline, _lines(per_traffic, cvs, headline)) if headline else None
    text = (
        f"<h2>{model} under your traffic</h2>"
        f"<p>The verdict above speaks of {html.escape(names[0])} arrivals. "
        + " ".join(html.escape(s) for s in sentences if s)
        + "</p><table><tr><th>SLO</th><th>best of</th>"
        + head
        + "</tr>"
        + "".join(rows)
        + "</table><p class='note'>Highest rate (req/s) each provider's best deployment held under the SLO, per "
        "arrival process; the CV is that of the gaps between requests as the generator sent them (1: Poisson).</p>"
        + (img(png, f"{first.model}: rate under the SLO against burstiness") if png else "")
    )
    return text, png


def _lines(per_traffic: list[Findings], cvs: list[float | None], slo_s: float) -> list[dict]:
    """Per provider group of the first process: its best rate under the SLO against the CV as sent, per process
    (in the order of the CV; a process without a CV recorded is left off the picture)."""
    lines = []
    for row in per_traffic[0].at(slo_s).best:
        points = []
        for found, cv in zip(per_traffic, cvs):
            match = next((b for b in found.at(slo_s).best if b.group == row.group), None)
            if cv is not None and match is not None:
                points.append((cv, match.rate))
        lines.append({"label": row.group, "points": sorted(points)})
    return lines
