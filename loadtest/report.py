"""The report: one self-contained HTML page (plus PNGs) over one or more runs, from one or more machines."""

from __future__ import annotations

import base64
import html
import json
import re
import time
from collections import defaultdict
from pathlib import Path

from latlab.loadtest import sections
from latlab.bench_plot import plot_bench
from latlab.loadtest.figures import curve_png
from latlab.loadtest.predict import bench_fits, request_overheads
from latlab.loadtest.results import read_results
# max_rate_under and verdict are also imported from here by older callers.
from latlab.loadtest.verdict import (DEFAULT_PRICES, GPU_HINT, crossover, is_gpu, max_rate_under,  # noqa: F401
                                     size_crossover, verdict)

REPORT_FILE = "report.html"
BENCH_SCHEMA = "latlab.bench/1"
REFERENCE_DIR = Path(__file__).parent / "reference"
"""Measurements committed with the code (e.g. from a GPU machine), merged in with --with-reference."""


def _curves(docs: list[dict]) -> list[dict]:
    """Every deployment curve of every results file, tagged with its run and machine."""
    return [{**deployment, "run_id": doc["run_id"], "machine": doc["machine"],
             "reference": doc.get("_reference", False)}
            for doc in docs for deployment in doc["deployments"]]


def read_bench(folder: Path) -> list[dict]:
    """Every bench*.json (schema latlab.bench/1) under a folder."""
    docs = []
    for file in sorted(Path(folder).glob("**/bench*.json")):
        doc = json.loads(file.read_text())
        if doc.get("schema") == BENCH_SCHEMA:
            docs.append({**doc, "_path": str(file)})
    return docs


def load_inputs(run_dirs: list[Path], reference_dir: Path | None) -> tuple[list[dict], list[dict]]:
    """Results and bench documents of every folder (and the reference folder, marked as such)."""
    results, bench = [], []
    folders = [(Path(d), False) for d in run_dirs] + ([(Path(reference_dir), True)] if reference_dir else [])
    for folder, reference in folders:
        if not folder.exists():
            raise FileNotFoundError(f"no such run folder: {folder}")
        found = bool(list(folder.glob("**/results*.json"))) if folder.is_dir() else folder.is_file()
        docs = read_results(folder) if found else []
        bench_docs = read_bench(folder) if folder.is_dir() else []
        results += [{**doc, "_reference": reference} for doc in docs]
        bench += [{**doc, "_reference": reference} for doc in bench_docs]
    if not results:
        raise FileNotFoundError(f"no results*.json under {', '.join(str(d) for d in run_dirs)}")
    return results, bench


def write_report(run_dirs: Path | list[Path], slos_s: list[float], prices: dict[str, float] | None = None,
                 out: Path | None = None, with_reference: bool = False, reference_dir: Path | None = None) -> Path:
    """Write report.html and its PNGs into `out` (default: the first run folder); return the HTML's path.

    With `with_reference`, the measurements under `reference_dir` (default: loadtest/reference/) are merged in.
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
    by_model: dict[str, list[dict]] = defaultdict(list)
    for curve in curves:
        by_model[curve.get("model") or curve["name"]].append(curve)
    body = [sections.environment_section(results, bench), _gpu_notice(curves, bench, with_reference, reference_dir),
            _prices_line(prices, example_prices)]
    for model, model_curves in by_model.items():
        png = curve_png(model, model_curves, slos_s)
        (out / f"curve-{_slug(model)}.png").write_bytes(png)
        body.append(_model_section(model, model_curves, slos_s, prices, fits, overheads, png))
    body.append(f"<h2>How the predictions are made</h2>{sections.assumptions_list()}")
    body.append(_bench_section(bench, out))
    events = [(doc["run_id"], event) for doc in results for event in doc.get("events", [])]
    body.append(_events_section(events))
    title = " + ".join(d.name for d in run_dirs)
    page = out / REPORT_FILE
    page.write_text(_page(title, body, slos_s))
    return page


def _gpu_notice(curves: list[dict], bench: list[dict], with_reference: bool, reference_dir: Path) -> str:
    hosts = sorted({str(c["machine"].get("hostname", "?")) for c in curves})
    gpu_hosts = sorted({str(c["machine"].get("hostname", "?")) for c in curves if is_gpu(c)})
    bench_gpu = any(p.get("backend", "").endswith("cuda") for d in bench for e in d.get("experiments", [])
                    for p in e.get("points", []))
    text = f"<p>Served measurements come from: {html.escape(', '.join(hosts))}."
    if gpu_hosts:
        text += f" GPU deployments were measured on: {html.escape(', '.join(gpu_hosts))}."
    text += "</p>"
    if not gpu_hosts and not bench_gpu:
        text += (f"<p class='warning'><strong>No GPU measurements</strong>: every figure in this report comes from the "
                 f"CPU of {html.escape(', '.join(hosts))}; no number here says how a GPU would do. To answer that, "
                 f"{html.escape(GPU_HINT)}.</p>")
    committed = reference_dir.is_dir() and any(reference_dir.glob("*.json"))
    if with_reference and not committed:
        text += f"<p>--with-reference: no reference data are committed under {html.escape(str(reference_dir))}.</p>"
    elif not with_reference and committed:
        text += ("<p>Reference measurements are committed under loadtest/reference/; "
                 "add --with-reference to merge them.</p>")
    return text


def _prices_line(prices: dict[str, float], example: bool) -> str:
    listed = ", ".join(f"{provider} ${price:.2f}/h" for provider, price in sorted(prices.items()))
    origin = ("<strong>example prices</strong>, not quotes: give yours with --price cpu=…,cuda=…" if example
              else "as given with --price")
    return (f"<p>Hourly prices per machine: {html.escape(listed)} ({origin}). Cost per million inferences = "
            "price per hour / (max rate under the SLO × 3600) × 10⁶, for a machine kept busy at that rate.</p>")


def _model_section(model: str, curves: list[dict], slos_s: list[float], prices: dict[str, float],
                   fits: list[dict], overheads: dict[str, float], png: bytes) -> str:
    verdicts = "".join(f"<li>{html.escape(crossover(model, curves, s, prices))}</li>" for s in slos_s)
    verdicts += "".join(f"<li>{html.escape(verdict(model, curves, s))}</li>" for s in slos_s)
    verdicts += "".join(f"<li>SLO search, {html.escape(c['name'])}: {html.escape(_search_line(c['search']))}</li>"
                        for c in curves if c.get("search"))
    verdicts += "".join(f"<li>{html.escape(c['name'])}: {html.escape(c['overload']['summary'])}</li>"
                        for c in curves if c.get("overload"))
    bound = [f"{c['name']} on {sections.machine_name(c)} at {s['offered_rps']:.0f} req/s offered"
             for c in curves for s in c["steps"] if s.get("generator_bound")]
    flagged = (f"<p class='warning'>Generator-bound steps (the load generator's CPU was saturated; these numbers "
               f"describe it as much as the server): {html.escape('; '.join(bound))}.</p>" if bound else "")
    image = base64.b64encode(png).decode()
    return (f"<h2>{html.escape(model)}</h2><img alt='latency vs throughput for {html.escape(model)}' "
            f"src='data:image/png;base64,{image}'>{flagged}"
            f"<h3>Max throughput under each SLO</h3>{sections.slo_table(curves, slos_s)}"
            f"<h3>Best settings per provider and cost</h3>{sections.provider_table(curves, slos_s, prices)}"
            f"<h3>Verdict</h3><ul class='verdict'>{verdicts}</ul>"
            f"{sections.prediction_section(model, curves, slos_s, fits, overheads)}"
            f"{''.join(sections.steps_table(c) for c in curves)}")


def _bench_section(bench: list[dict], out: Path) -> str:
    text = "<h2>Bench (in-process, no server)</h2>"
    if not bench:
        return text + ("<p>No bench*.json in the input folders: run `latlab bench` and put its file beside "
                       "the results.</p>")
    crossovers = size_crossover(bench) or ["no bench file holds batch-1 points of both ort-cpu and ort-cuda: "
                                           "no model-size crossover can be given."]
    text += "<ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in crossovers) + "</ul>"
    for doc in bench:
        host = str(doc.get("machine", {}).get("hostname", "?"))
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
        return (f"{when}: Locust worker {event['worker']}{pid} lost during step {event['step']} of "
                f"'{event['deployment']}': {event['reason']}; {event['requests_in_flight_lost']} requests in flight "
                f"unaccounted; {event['load']}")
    return f"{when}: Locust worker {event['worker']} {event['event'].replace('_', ' ')}"


def _events_section(events: list[tuple[str, dict]]) -> str:
    if not events:
        return ""
    items = "".join(f"<li>run {html.escape(run)}: {html.escape(event_line(e))}</li>" for run, e in events)
    return f"<h2>Load generator events</h2><ul>{items}</ul>"


def _search_line(search: dict) -> str:
    rate = f"{search['rate']:.0f} req/s" if search.get("rate") else "no rate"
    why = f" ({'; '.join(search['reasons'])})" if search.get("reasons") else ""
    return (f"highest rate with p99 ≤ {search['slo_p99_s'] * 1e3:g} ms: {rate}, "
            f"{'VALID' if search['valid'] else 'INVALID'}{why}; {len(search['probes'])} probes, "
            f"resolution {search['resolution']:.0%}")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(text)) or "x"


def _page(title: str, body: list[str], slos_s: list[float]) -> str:
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>latlab report {html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}}
table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}
td:first-child{{text-align:left}}img{{max-width:100%}}.warning{{background:#fff4e0;padding:.5em}}</style></head><body>
<h1>latlab report: {html.escape(title)}</h1>
<p>Latency is measured by an open-loop load generator from each request's <em>intended</em> send time
(Poisson arrivals), so queueing inside the server and the client both count. Percentiles are exact.
Curves end where the deployment saturated (achieved &lt; 90% of offered) or failed.
SLOs: p99 ≤ {", ".join(f"{s * 1e3:g} ms" for s in slos_s)}.
Every row and curve names the machine it was measured on.</p>
{"".join(body)}
</body></html>
"""
