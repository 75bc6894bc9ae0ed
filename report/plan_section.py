"""The fleet plan in the report: each deployment's replica model against what the run measured, and, when asked
(--plan-traffic), the fleets over a day of traffic. It words and draws what report/fleetplan hands it."""

from __future__ import annotations

import html
import math
from pathlib import Path

from latlab.common.user_input import UserError
from latlab.loadtest.results import Run
from latlab.report.figures import fleet_png
from latlab.report.fleetplan.plan import Plan, PlanRequest
from latlab.report.fleetplan.validate import OFF_BY, validation_rows
from latlab.report.pictures import img

PLAN_FIGURE = "fleet-plan.png"


def fleet_plan_sections(
    run_dir: Path, runs: list[Run], bench: list[dict], prices: dict, out: Path, request: PlanRequest | None = None
) -> list[str]:
    """The replica model's check (measured runs only, not reference data) and, with a request, the plan's section
    after it; the plan's figure is also written into `out`. A plan that cannot be made says why in its section."""
    own = [r for r in runs if not r.reference]
    rows = validation_rows((own, [d for d in bench if not d.get("_reference")]))
    body = [validation_section(rows)] if rows else []
    if request is None:
        return body
    try:
        plan = request.make(run_dir, prices, rows)
    except UserError as exc:  # the rest of the report stands; the section says what the plan lacked
        said = str(exc).replace("--use-off", "--plan-use-off")
        return body + [f"<h2>Fleet plan</h2><p class='warning'>No plan: {html.escape(said)}</p>"]
    text, png = plan_section(plan)
    (out / PLAN_FIGURE).write_bytes(png)
    return body + [text]


def validation_section(rows: list[dict]) -> str:
    """Per arrival process the run swept: each deployment's predicted rate under each SLO against the measured one,
    the error, "off" past OFF_BY, and one sentence counting the SLOs within it."""
    text = (
        "<h2>The replica model against this run</h2><p>The fleet plan models one replica of each deployment "
        "(docs/fleet-plan.md) and simulates it at the rates the run measured, on the lab's machine: the load "
        "generator's own round trip (its floor, measured before the sweep) drawn per request and added, and the "
        "replica slowed where it and the generator together ask more CPU than the machine has. Other work on the "
        "machine is not in the run's record, so on a shared machine the check also measures that work. A model "
        f"whose predicted rate under an SLO is more than {OFF_BY:.0%} from the measured one is "
        "<strong>off</strong> there, and the plan does not use it.</p>"
    )
    for traffic in dict.fromkeys(r["traffic"] for r in rows):
        group = [r for r in rows if r["traffic"] == traffic]
        text += f"<p class='check'>{html.escape(validation_summary(group))}</p>" + _validation_table(group)
    return text


def validation_summary(rows: list[dict]) -> str:
    """One sentence: for how many of the SLOs checked the model is within OFF_BY, under these rows' process."""
    slos = [s for r in rows for s in r["slos"]]
    within = sum(1 for s in slos if not s["off"])
    off = [r["deployment"] for r in rows if r["off"]]
    said = f"Under {rows[0]['traffic'] or 'poisson'} arrivals the replica model is within {OFF_BY:.0%} for {within} "
    said += f"of {len(slos)} SLOs ({len(rows) - len(off)} of {len(rows)} deployments within it under every SLO)"
    said += f"; off, so not planned with: {', '.join(off)}." if off else "."
    bound = sum(r.get("generator_bound", 0) for r in rows)
    if bound:
        steps = sum(len(r["steps"]) for r in rows)
        said += (
            f" On {bound} of {steps} steps the load generator sent late enough to decide an SLO: there the machine's "
            "load, which the model does not see, set the measured p99."
        )
    return said


def _validation_table(rows: list[dict]) -> str:
    head = "".join(f"<th>p99 ≤ {s['slo_s'] * 1e3:g} ms</th>" for s in rows[0]["slos"])
    body = ""
    for row in rows:
        cells = "".join(_slo_cell(s) for s in row["slos"])
        spread = getattr(row["replica"], "spread", 0.0)
        source = row["source"] + (f"; service spread σ {spread:.2f}" if spread else "")
        if row.get("stretch", 1.0) > 1.0:
            source += f"; slowed ×{row['stretch']:.2f} at its busiest step (cores shared with the generator)"
        body += f"<tr><td>{html.escape(row['deployment'])}</td><td class='text'>{html.escape(source)}</td>{cells}</tr>"
    return (
        f"<table class='validation'><tr><th>deployment</th><th>model from</th>{head}</tr>{body}</table>"
        "<p class='note'>Predicted vs measured req/s under each SLO (error relative to the highest step that met "
        'it; where a faster step broke it, its rate: the truth lies between; "the generator late enough to decide '
        "it\": that step's send lateness alone could have broken the bound, so the measured rate is the "
        "generator's as much as the server's). σ: how much a batch's time varies, fitted from the run's "
        "one-at-a-time probe (docs/fleet-plan.md).</p>"
    )


def _slo_cell(slo: dict) -> str:
    if not slo["measured_rps"]:
        said = f"none measured, {slo['predicted_rps']:.0f} predicted"
    else:
        said = f"{slo['predicted_rps']:.0f} vs {slo['measured_rps']:.0f} ({slo['error'] * 100:+.0f}%)"
    if slo.get("broke_rps", math.inf) < math.inf:
        said += f", broke at {slo['broke_rps']:.0f}"
        said += " (the generator late enough to decide it)" if slo.get("broke_by_generator") else ""
    if slo["off"]:
        return f"<td class='off'>{html.escape(said)} <strong>off</strong></td>"
    return f"<td>{html.escape(said)}</td>"


def plan_section(plan: Plan) -> tuple[str, bytes]:
    """The plan's verdict, a row per fleet, replicas over the day per fleet, and its notes; and the figure's PNG."""
    rows = ""
    for day in plan.days:
        replicas = ", ".join(f"{k} {t.ready.min()}–{t.ready.max()}" for k, t in day.timelines.items())
        rows += (
            f"<tr><td>{html.escape(day.spec.name)}</td><td>{day.attainment * 100:.3f}%</td>"
            f"<td>{day.worst_minute * 100:.2f}%</td><td>{html.escape(replicas)}</td>"
            f"<td>{sum(day.machine_hours.values()):.1f}</td><td>{day.usd_per_day:.2f}</td>"
            f"<td>{day.usd_per_million:.3f}</td></tr>"
        )
    tick_s = next(iter(plan.days[0].timelines.values())).tick_s if plan.days else 10.0
    fleets = [
        {"name": d.spec.name, "kinds": {k: (t.ready, t.billed) for k, t in d.timelines.items()}} for d in plan.days
    ]
    png = fleet_png("replicas over the day, per fleet", fleets, tick_s)
    notes = [n.replace("--use-off", "--plan-use-off") for n in plan.notes]  # the report's name of the option
    if plan.stride > 1:
        notes.append(f"one minute in {plan.stride} simulated (--plan-sim-seconds per fleet)")
    kinds = "".join(
        f"<li>{html.escape(k.name)} replica: {html.escape(k.source)}, ${k.usd_per_hour:g}/h, within the SLO up to "
        f"{plan.sizing[k.name].slo_rps:.0f} req/s, autoscaled at {plan.sizing[k.name].target_rps:.0f} req/s</li>"
        for k in plan.kinds
    )
    text = (
        f"<h2>Fleet plan: a day of {html.escape(plan.traffic.name)}</h2>"
        f"<p class='check'><strong>{html.escape(plan.verdict)}</strong></p>"
        f"<p>{plan.traffic.requests / 1e6:.1f} M requests a day (mean {plan.traffic.rates_rps.mean():.0f} req/s, "
        f"peak {plan.traffic.rates_rps.max():.0f} req/s); SLO: {html.escape(plan.slo.text)}.</p>"
        "<table class='fleets'><tr><th>fleet</th><th>within the SLO</th><th>worst minute</th><th>replicas ready "
        "(min–max)</th><th>machine-hours</th><th>$/day</th><th>$/million</th></tr>"
        f"{rows}</table>"
        + img(png, "replicas over the day per fleet")
        + f"<ul>{kinds}{''.join(f'<li>{html.escape(n)}</li>' for n in notes)}</ul>"
    )
    return text, png
