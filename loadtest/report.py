"""The run report: latency-vs-throughput curves, SLO table and verdict, as one self-contained HTML file."""

from __future__ import annotations

import base64
import html
import io
import time
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402

from latlab.loadtest.results import read_results  # noqa: E402

REPORT_FILE = "report.html"


def max_rate_under(steps: list[dict], slo_s: float) -> dict | None:
    """The step with the highest achieved throughput whose p99 meets the SLO without errors."""
    good = [s for s in steps if s.get("p99_s") is not None and s["p99_s"] <= slo_s and not s["errors"]]
    return max(good, key=lambda s: s["achieved_rps"], default=None)


def collect(run_dir: Path) -> list[dict]:
    """Every deployment curve of every results file, tagged with its run and machine."""
    curves = []
    for doc in read_results(run_dir):
        for deployment in doc["deployments"]:
            curves.append({**deployment, "run_id": doc["run_id"], "machine": doc["machine"]})
    return curves


def write_report(run_dir: Path, slos_s: list[float]) -> Path:
    """Write report.html (and one PNG per model) into the run folder; return the HTML's path."""
    run_dir = Path(run_dir)
    curves = collect(run_dir)
    by_model: dict[str, list[dict]] = defaultdict(list)
    for curve in curves:
        by_model[curve.get("model") or curve["name"]].append(curve)
    sections = []
    for model, model_curves in by_model.items():
        png = _plot(model, model_curves, slos_s)
        (run_dir / f"curve-{model}.png").write_bytes(png)
        sections.append(_model_section(model, model_curves, slos_s, png))
    machines = {c["machine"].get("hostname", "?"): c["machine"] for c in curves}
    events = [(doc["run_id"], event) for doc in read_results(run_dir) for event in doc.get("events", [])]
    out = run_dir / REPORT_FILE
    out.write_text(_page(run_dir.name, sections, machines, slos_s, _events_section(events)))
    return out


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


def verdict(model: str, curves: list[dict], slo_s: float) -> str:
    """One sentence: which deployment sustains the most load under the SLO, and by how much."""
    best = sorted(((max_rate_under(c["steps"], slo_s), c) for c in curves),
                  key=lambda pair: pair[0]["achieved_rps"] if pair[0] else -1, reverse=True)
    bound = f"p99 ≤ {slo_s * 1e3:g} ms"
    if not best or best[0][0] is None:
        return f"{model}: no deployment met {bound} at any measured load."
    (top_step, top), rest = best[0], best[1:]
    sentence = f"{model} at {bound}: {_label(top)} sustains {top_step['achieved_rps']:.0f} req/s"
    for step, curve in rest:
        if step is None or step["achieved_rps"] <= 0:
            sentence += f"; {_label(curve)} never meets it"
        else:
            sentence += (f"; {_label(curve)} {step['achieved_rps']:.0f} req/s "
                         f"({top_step['achieved_rps'] / step['achieved_rps']:.1f}× less)")
    return sentence + "."


def _label(curve: dict) -> str:
    batcher = curve.get("batcher") or {}
    size = batcher.get("max_batch_size")
    if size is None:
        mode = "batcher settings unknown"
    else:
        mode = "batching off" if size == 1 else f"batch ≤ {size}, wait ≤ {batcher.get('max_queue_delay_ms', 0):g} ms"
    return f"{curve['name']} ({curve.get('provider', '?')}, {mode})"


def _search_line(search: dict) -> str:
    rate = f"{search['rate']:.0f} req/s" if search.get("rate") else "no rate"
    why = f" ({'; '.join(search['reasons'])})" if search.get("reasons") else ""
    return (f"highest rate with p99 ≤ {search['slo_p99_s'] * 1e3:g} ms: {rate}, "
            f"{'VALID' if search['valid'] else 'INVALID'}{why}; {len(search['probes'])} probes, "
            f"resolution {search['resolution']:.0%}")


def _plot(model: str, curves: list[dict], slos_s: list[float]) -> bytes:
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=110)
    for i, curve in enumerate(curves):
        # A step the server's restart interrupted says nothing about the load: left off the curve.
        steps = [s for s in curve["steps"] if s.get("p99_s") is not None and not s.get("server_interrupted")]
        x = [s["achieved_rps"] for s in steps]
        color = f"C{i}"
        ax.plot(x, [s["p99_s"] * 1e3 for s in steps], "o-", color=color, label=f"{curve['name']} p99")
        ax.plot(x, [s["p50_s"] * 1e3 for s in steps], "s--", color=color, alpha=0.6, label=f"{curve['name']} p50")
    for slo in slos_s:
        ax.axhline(slo * 1e3, color="grey", linestyle=":", linewidth=1)
        ax.annotate(f"SLO {slo * 1e3:g} ms", (0, slo * 1e3), xycoords=("axes fraction", "data"),
                    fontsize=8, color="grey", va="bottom")
    ax.set_yscale("log")
    ax.set_xlabel("achieved throughput (requests/s)")
    ax.set_ylabel("latency from intended send (ms)")
    ax.set_title(f"{model}: latency vs throughput")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def _model_section(model: str, curves: list[dict], slos_s: list[float], png: bytes) -> str:
    head = "".join(f"<th>max req/s at p99 ≤ {s * 1e3:g} ms</th>" for s in slos_s)
    rows = []
    for curve in curves:
        cells = []
        for slo in slos_s:
            step = max_rate_under(curve["steps"], slo)
            cells.append(f"<td>{step['achieved_rps']:.0f}</td>" if step else "<td>–</td>")
        rows.append(f"<tr><td>{html.escape(_label(curve))}</td><td>{html.escape(curve['run_id'])}</td>"
                    f"{''.join(cells)}</tr>")
    verdicts = "".join(f"<li>{html.escape(verdict(model, curves, s))}</li>" for s in slos_s)
    verdicts += "".join(f"<li>SLO search, {html.escape(c['name'])}: {html.escape(_search_line(c['search']))}</li>"
                        for c in curves if c.get("search"))
    verdicts += "".join(f"<li>{html.escape(c['name'])}: {html.escape(c['overload']['summary'])}</li>"
                        for c in curves if c.get("overload"))
    image = base64.b64encode(png).decode()
    details = "".join(_steps_table(c) for c in curves)
    return (f"<h2>{html.escape(model)}</h2><img alt='latency vs throughput for {html.escape(model)}' "
            f"src='data:image/png;base64,{image}'>"
            f"<table><tr><th>deployment</th><th>run</th>{head}</tr>{''.join(rows)}</table>"
            f"<ul>{verdicts}</ul>{details}")


def _steps_table(curve: dict) -> str:
    rows = []
    for s in curve["steps"]:
        p = {k: (f"{s[k] * 1e3:.2f}" if s.get(k) is not None else "–") for k in ("p50_s", "p90_s", "p99_s", "max_s")}
        batch = f"{s['avg_batch_size']:.1f}" if s.get("avg_batch_size") else "–"
        flags = (" (generator-bound)" if s.get("generator_bound") else "") + \
                ("" if s.get("stable", True) else " (unstable)")
        if s.get("server_interrupted"):
            flags += f" (server interrupted: {s.get('interruption')})"
        if s.get("workers_lost"):
            flags += f" (workers lost: {', '.join(s['workers_lost'])})"
        cpu = f"{s['generator_cpu_percent']:.0f}%" if s.get("generator_cpu_percent") is not None else "–"
        dropped = s.get("dropped") if s.get("dropped") is not None else "–"
        rows.append(f"<tr><td>{s['offered_rps']:.0f}</td><td>{s['achieved_rps']:.0f}</td><td>{p['p50_s']}</td>"
                    f"<td>{p['p90_s']}</td><td>{p['p99_s']}</td><td>{p['max_s']}</td><td>{s['errors']}</td>"
                    f"<td>{dropped}</td><td>{batch}</td><td>{cpu}{html.escape(flags)}</td></tr>")
    return (f"<details><summary>{html.escape(curve['name'])}: {len(curve['steps'])} steps — "
            f"{html.escape(curve.get('stop_reason', ''))}</summary><table><tr><th>offered/s</th><th>achieved/s</th>"
            f"<th>p50 ms</th><th>p90 ms</th><th>p99 ms</th><th>max ms</th><th>errors</th><th>dropped</th>"
            f"<th>avg batch</th><th>generator CPU, flags</th></tr>{''.join(rows)}</table></details>")


def _page(title: str, sections: list[str], machines: dict[str, dict], slos_s: list[float], events: str = "") -> str:
    machine_rows = "".join(
        f"<li>{html.escape(name)}: {html.escape(str(m.get('cpu')))}, {m.get('cores')} cores, "
        f"{m.get('memory_gib')} GiB</li>" for name, m in machines.items())
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>latlab report {html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}}
table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}
td:first-child{{text-align:left}}img{{max-width:100%}}</style></head><body>
<h1>latlab report: {html.escape(title)}</h1>
<p>Latency is measured by an open-loop load generator from each request's <em>intended</em> send time
(Poisson arrivals), so queueing inside the server and the client both count. Percentiles are exact.
Curves end where the deployment saturated (achieved &lt; 90% of offered) or failed.
SLOs: p99 ≤ {", ".join(f"{s * 1e3:g} ms" for s in slos_s)}.</p>
<p>Machines:</p><ul>{machine_rows}</ul>
{"".join(sections)}
{events}
</body></html>
"""
