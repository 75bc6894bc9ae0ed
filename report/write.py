"""The report: one self-contained HTML page (plus PNGs) over one or more runs, from one or more machines. It reads
the runs, builds each model's findings once (findings.py) and hands them to the renderers."""

from __future__ import annotations

import base64
import html
import re
import time
from collections import defaultdict
from pathlib import Path

from latlab.loadtest.results import Curve, Run
from latlab.report import answer, pictures, sections
from latlab.report.bench_crossover import size_crossover
from latlab.report.bench_plot import plot_bench
from latlab.report.costs import price_amount_and_unit, price_unit
from latlab.report.figures import curve_png
from latlab.report.findings import Findings, by_traffic
from latlab.report.fleetplan.plan import PlanRequest
from latlab.report.inputs import BENCH_SCHEMA, REFERENCE_DIR, load_inputs, read_bench  # noqa: F401 (also named here)
from latlab.report.naming import PROVIDER_HINT, UNKNOWN, is_gpu, label, machine_name, provider_of, tag_servers
from latlab.report.plan_section import fleet_plan_sections
from latlab.report.predict import bench_fits, request_overheads
from latlab.report.prices import DEFAULT_PRICES
from latlab.report.traffic import traffic_section
from latlab.report.tried import tried_section
from latlab.report.verdict import provider_verdict, verdict

REPORT_FILE = "report.html"
GPU_HINT = (
    "run `latlab bench` and the lab on a GPU box and merge with `latlab report CPU_RUN GPU_RUN` "
    "(or add `--with-reference` when GPU reference data are committed under report/reference/)"
)


def _curves(runs: list[Run]) -> list[Curve]:
    """Every deployment curve of every results file (each knows its run, machine and whether it is reference
    data: results.Run.context)."""
    return [deployment for run in runs for deployment in run.deployments]


def write_report(
    run_dirs: Path | list[Path],
    slos_s: list[float],
    prices: dict[str, float] | None = None,
    out: Path | None = None,
    with_reference: bool = False,
    reference_dir: Path | None = None,
    plan: PlanRequest | None = None,
) -> Path:
    """Write report.html and its PNGs into `out` (default: the first run folder); return the HTML's path.

    With `with_reference`, the measurements under `reference_dir` (default: report/reference/) are merged in; with
    `plan`, the fleet plan of the first run over that day of traffic follows the cost picture.
    """
    reference_dir = Path(reference_dir) if reference_dir else REFERENCE_DIR
    run_dirs = [Path(run_dirs)] if isinstance(run_dirs, (str, Path)) else [Path(d) for d in run_dirs]
    out = Path(out) if out else (run_dirs[0] if run_dirs[0].is_dir() else run_dirs[0].parent)
    out.mkdir(parents=True, exist_ok=True)
    results, bench = load_inputs(run_dirs, reference_dir if with_reference else None)
    example_prices = prices is None
    prices = dict(DEFAULT_PRICES) if prices is None else prices
    curves = _curves(results)
    fits = bench_fits(bench)
    overheads = request_overheads(curves, fits)
    by_model: dict[str, list[Curve]] = defaultdict(list)
    for curve in curves:
        by_model[curve.model or curve.name].append(curve)
    # A model whose curves come from more than one server is compared by server (naming.tag_servers); one swept
    # under several arrival processes is judged under the first, and the others are set beside it.
    per_traffic = [by_traffic(model, tag_servers(group), slos_s, prices) for model, group in by_model.items()]
    models = [found[0] for found in per_traffic]
    # First screen: the answer. Then the pictures, then the details (folded where long).
    bench_gpu = any(
        p.get("backend", "").endswith("cuda")
        for d in bench
        for e in d.get("experiments", [])
        for p in e.get("points", [])
    )
    body = [answer.answer_section(models, _prices_line(prices, example_prices), bench_gpu)]
    searched = tried_section(run_dirs, curves, slos_s)
    body += [searched] if searched else []
    for found in per_traffic:
        text, png = traffic_section(found)
        if png:
            (out / f"traffic-{_slug(found[0].model)}.png").write_bytes(png)
        body += [text] if text else []
    body += _pictures(models, out)
    body += fleet_plan_sections(run_dirs[0], results, bench, prices, out, plan)
    body.append(_gpu_notice([c for found in models for c in found.curves], bench, with_reference, reference_dir))
    for found in models:
        png = curve_png(found.model, list(found.curves), slos_s)
        (out / f"curve-{_slug(found.model)}.png").write_bytes(png)
        body.append(_model_section(found, fits, overheads, png))
    body.append(sections.environment_section(results, bench))
    body.append(f"<details><summary>How the predictions are made</summary>{sections.assumptions_list()}</details>")
    body.append(_bench_section(bench, out))
    events = [(run.run_id, event) for run in results for event in run.events]
    body.append(_events_section(events))
    title = " + ".join(d.name for d in run_dirs)
    page = out / REPORT_FILE
    page.write_text(_page(title, body, slos_s))
    return page


def _pictures(models: list[Findings], out: Path) -> list[str]:
    """Per model the cost picture and where the time goes, their PNGs also written beside the page."""
    body = []
    for found in models:
        for kind, (text, png) in (
            ("cost", pictures.cost_section(found)),
            ("time", pictures.time_section(found)),
        ):
            if png:
                (out / f"{kind}-{_slug(found.model)}.png").write_bytes(png)
            body.append(text)
    return body


def _gpu_notice(curves: list[Curve], bench: list[dict], with_reference: bool, reference_dir: Path) -> str:
    machines = sorted({machine_name(c) for c in curves})
    gpu_machines = sorted({machine_name(c) for c in curves if is_gpu(c)})
    bench_gpu = any(
        p.get("backend", "").endswith("cuda")
        for d in bench
        for e in d.get("experiments", [])
        for p in e.get("points", [])
    )
    text = f"<h2>Details</h2><p>Served measurements come from: {html.escape('; '.join(machines))}."
    if gpu_machines:
        text += f" GPU deployments were measured on: {html.escape('; '.join(gpu_machines))}."
    text += "</p>"
    unknown = [f"{label(c)} on {machine_name(c)}" for c in curves if provider_of(c) == UNKNOWN]
    if not gpu_machines and not bench_gpu and unknown:
        text += (
            f"<p class='warning'><strong>No GPU measurements recorded</strong>: whether these ran on a CPU or a "
            f"GPU is not recorded ({html.escape(PROVIDER_HINT)}): {html.escape('; '.join(unknown))}. To "
            f"measure a GPU, {html.escape(GPU_HINT)}.</p>"
        )
    elif not gpu_machines and not bench_gpu:
        text += (
            f"<p class='warning'><strong>No GPU measurements</strong>: every figure in this report comes from the "
            f"CPU of {html.escape('; '.join(machines))}; no number here says how a GPU would do. To answer that, "
            f"{html.escape(GPU_HINT)}.</p>"
        )
    committed = reference_dir.is_dir() and any(reference_dir.glob("**/*.json"))
    if with_reference and not committed:
        text += f"<p>--with-reference: no reference data are committed under {html.escape(str(reference_dir))}.</p>"
    elif not with_reference and committed:
        text += (
            "<p>Reference measurements are committed under report/reference/; add --with-reference to merge them.</p>"
        )
    return text


def _prices_line(prices: dict, example: bool) -> str:
    listed = ", ".join(f"{provider} {_price_text(value)}" for provider, value in sorted(prices.items()))
    origin = (
        "<strong>example prices</strong>, not quotes: give yours with --price cpu=…,cuda=…"
        if example
        else "as given with --price"
    )
    return (
        f"Prices {html.escape(price_unit(prices))}: {html.escape(listed)} ({origin}). Cost per million inferences "
        "= machine price per hour / (max rate under the SLO × 3600) × 10⁶, a machine kept busy at that rate."
    )


def _price_text(value: object) -> str:
    amount, unit = price_amount_and_unit(value)
    return f"${amount:.2f}/h" if unit == "machine-hour" else f"${amount:.3g} per {unit}"


def _model_section(findings: Findings, fits: list[dict], overheads: dict[str, float], png: bytes) -> str:
    model, curves, slos_s = findings.model, findings.curves, findings.slos_s
    verdicts = "".join(f"<li>{html.escape(provider_verdict(findings, s))}</li>" for s in slos_s)
    verdicts += "".join(f"<li>{html.escape(verdict(findings, s))}</li>" for s in slos_s)
    verdicts += "".join(
        f"<li>SLO search, {html.escape(c.name)}: {html.escape(_search_line(c.search))}</li>" for c in curves if c.search
    )
    verdicts += "".join(
        f"<li>{html.escape(c.name)}: {html.escape(c.overload['summary'])}</li>" for c in curves if c.overload
    )
    bound = [
        f"{c.name} on {machine_name(c)} at {s.offered_rps:.0f} req/s offered"
        for c in curves
        for s in c.steps
        if s.generator_bound
    ]
    flagged = (
        f"<p class='warning'>Generator-bound steps (the load generator's CPU was saturated, or its sends were late "
        f"enough to break an SLO the step broke; these numbers describe it as much as the server): "
        f"{html.escape('; '.join(bound))}.</p>"
        if bound
        else ""
    )
    image = base64.b64encode(png).decode()
    return (
        f"<h3>{html.escape(model)}: latency against throughput</h3>"
        f"<img alt='latency vs throughput for {html.escape(model)}' src='data:image/png;base64,{image}'>{flagged}"
        f"<h4>Max throughput under each SLO</h4>{sections.slo_table(findings)}"
        f"<details><summary>{html.escape(model)}: best settings per provider and cost, every verdict</summary>"
        f"{sections.provider_table(findings)}<ul class='verdict'>{verdicts}</ul></details>"
        f"<details><summary>{html.escape(model)}: predicted vs measured</summary>"
        f"{sections.prediction_section(findings, fits, overheads)}</details>"
        f"{''.join(sections.steps_table(c) for c in curves)}"
    )


def _bench_section(bench: list[dict], out: Path) -> str:
    text = "<h2>Bench (in-process, no server)</h2>"
    if not bench:
        return text + (
            "<p>No bench*.json in the input folders: run `latlab bench` and put its file beside the results.</p>"
        )
    crossovers = size_crossover(bench) or [
        "no bench file holds batch-1 points of both ort-cpu and ort-cuda: no model-size crossover can be given."
    ]
    text += "<ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in crossovers) + "</ul>"
    for doc in bench:
        host = sections.doc_machine_name(doc.get("machine", {}))
        text += f"<h3>bench on {html.escape(host)}{' (reference data)' if doc.get('_reference') else ''}</h3>"
        for name, png in plot_bench(doc).items():
            (out / f"bench-{_slug(host)}-{_slug(name)}").write_bytes(png)
            image = base64.b64encode(png).decode()
            text += f"<img alt='bench {html.escape(name)}' src='data:image/png;base64,{image}'>"
        text += sections.bench_table(doc)
    return text


def event_line(event: dict) -> str:
    """One sentence per fleet event, e.g. a Locust worker lost mid-step and what became of its load."""
    when = time.strftime("%H:%M:%S", time.localtime(event["time"]))
    if event["event"] == "worker_lost":
        pid = f" (pid {event['pid']})" if event.get("pid") else ""
        return (
            f"{when}: Locust worker {event['worker']}{pid} lost during step {event['step']} of "
            f"'{event['deployment']}': {event['reason']}; {event['requests_in_flight_lost']} requests in flight "
            f"unaccounted; {event['load']}"
        )
    return f"{when}: Locust worker {event['worker']} {event['event'].replace('_', ' ')}"


def _events_section(events: list[tuple[str, dict]]) -> str:
    if not events:
        return ""
    items = "".join(f"<li>run {html.escape(run)}: {html.escape(event_line(e))}</li>" for run, e in events)
    return f"<h2>Load generator events</h2><ul>{items}</ul>"


def _search_line(search: dict) -> str:
    rate = f"{search['rate']:.0f} req/s" if search.get("rate") else "no rate"
    why = f" ({'; '.join(search['reasons'])})" if search.get("reasons") else ""
    return (
        f"highest rate with p99 ≤ {search['slo_p99_s'] * 1e3:g} ms: {rate}, "
        f"{'VALID' if search['valid'] else 'INVALID'}{why}; {len(search['probes'])} probes, "
        f"resolution {search['resolution']:.0%}"
    )


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(text)) or "x"


def _page(title: str, body: list[str], slos_s: list[float]) -> str:
    slos = ", ".join(f"{s * 1e3:g} ms" for s in slos_s)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>latlab report {html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:1em auto;color:#222;font-size:15px}}
h1{{font-size:1.3em;margin:.2em 0}}h2.model{{font-size:1.1em;margin:.6em 0 .1em}}p.sentence{{margin:.2em 0}}
table{{border-collapse:collapse;margin:.4em 0 1em}}td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}}
td:first-child{{text-align:left}}table.answer td,table.answer th{{font-size:.9em}}img{{max-width:100%}}
td.text{{text-align:left}}.warning{{background:#fff4e0;padding:.4em}}
p.compared{{margin:.2em 0 .4em}}p.runs{{margin:0;color:#666}}</style></head><body>
<h1>latlab: which deployment serves each model within p99 ≤ {html.escape(slos)}, and at what cost</h1>
<p class='runs'>Runs: {html.escape(title)}</p>
{"".join(body)}
<details><summary>How this was measured</summary><p>Latency is measured by an open-loop load generator from each
request's <em>intended</em> send time (Poisson arrivals), so queueing inside the server and the client both count.
Percentiles are exact; a step with too few requests for its p99 to mean anything is marked and never decides an SLO.
Curves end where the deployment saturated (achieved &lt; 90% of offered) or failed; "≥ N (not saturated)" marks a
maximum the sweep never pushed past (a cap or the plan's last rate). Every row and curve names the machine it was
measured on. docs/report.md explains every part of this page.</p></details>
</body></html>
"""
