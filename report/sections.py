"""HTML pieces of the report: environment, SLO and cost tables (rendered from a model's findings, findings.py),
prediction vs measurement, step details."""

from __future__ import annotations

import html

from latlab.loadtest.proxy_hop import proxy_line
from latlab.loadtest.floor import floor_line, near_floor
from latlab.loadtest.machine_load import other_load_text
from latlab.loadtest.results import Curve, Run, Step
from latlab.report.bench_pivot import gpu_speedup, pivot
from latlab.common.machine import key as machine_key
from latlab.report.breakdown import server_bound
from latlab.report.costs import intra_op_threads
from latlab.report.findings import Findings
from latlab.report.naming import label, machine_name, server_name
from latlab.report.predict import ASSUMPTIONS, predict_deployment
from latlab.report.rates import rate_text

MACHINE_KEYS = ("cpu", "cores", "memory_gib", "os", "gpu", "ort_version", "torch_version", "threads", "python")


def esc(value: object) -> str:
    return html.escape(str(value))


CLOSED_SENDERS = {
    "native": "native (one C thread drives every connection, as wrk does)",
    "python": "Python (the event loop's callbacks)",
    "greenlet": "Python (a greenlet per user, Locust's own way)",
}
"""What drove a closed loop's connections (loadtest/native_loop.py), as the environment's details say it."""


def environment_section(runs: list[Run], bench_docs: list[dict]) -> str:
    """Where every number came from: each run's load generator and server, each bench's machine."""
    rows = []
    for run in runs:
        servers = []
        for deployment in run.deployments:
            server = _details(deployment.environment or {})
            if deployment.environment and server not in servers:
                servers.append(server)
        details = f"load generator: {_details(run.machine or {})}"
        details += "".join(f" | server: {server}" for server in servers) or " | server: environment not recorded"
        if run.generator_floor:
            details += f" | {floor_line(run.generator_floor)}"
        if (run.payload or {}).get("closed_sender"):
            details += f" | closed-loop sender: {CLOSED_SENDERS.get(run.payload['closed_sender'], 'unknown')}"
        row = _machine_row(f"run {run.run_id}", run.reference, run.machine or {}, details)
        if row not in rows:  # a lab run writes one results file per model, all from the same machines
            rows.append(row)
    for doc in bench_docs:
        machine = doc.get("machine", {})
        rows.append(_machine_row("bench", bool(doc.get("_reference")), machine, _details(machine)))
    return (
        "<details><summary>Environment: every machine a number came from</summary>"
        "<table><tr><th>source</th><th>machine</th><th>details</th></tr>"
        f"{''.join(rows)}</table></details>"
    )


def _machine_row(kind: str, reference: bool, machine: dict, details: str) -> str:
    origin = " (reference data)" if reference else ""
    return f"<tr><td>{esc(kind + origin)}</td><td>{esc(doc_machine_name(machine))}</td><td>{esc(details)}</td></tr>"


def doc_machine_name(machine: dict) -> str:
    """A run's or bench's machine by what it is (`name`, GPU, CPU model), not by its hostname."""
    return str(machine.get("name") or machine.get("gpu") or machine.get("cpu") or "unnamed machine")


def _details(machine: dict) -> str:
    keys = [k for k in MACHINE_KEYS if machine.get(k) not in (None, "")]
    keys += sorted(k for k in machine if k not in MACHINE_KEYS and k != "hostname" and machine[k] not in (None, ""))
    return "; ".join(f"{k}: {machine[k]}" for k in keys) or "not recorded"


def slo_table(findings: Findings) -> str:
    """Highest measured rate under each SLO per deployment, labelled with its run and machine."""
    head = "".join(f"<th>max req/s at p99 ≤ {s * 1e3:g} ms</th>" for s in findings.slos_s)
    rows = []
    for i, curve in enumerate(findings.curves):
        cells = [f"<td>{esc(at.measured[i].text)}</td>" for at in findings.by_slo]
        rows.append(
            f"<tr><td>{esc(label(curve))}</td><td>{esc(curve.run_id)} on {esc(machine_name(curve))}</td>"
            f"{''.join(cells)}</tr>"
        )
    return f"<table><tr><th>deployment</th><th>run on machine</th>{head}</tr>{''.join(rows)}</table>"


def provider_table(findings: Findings) -> str:
    """Per SLO and provider: the best batcher settings found, their rate and cost per million inferences."""
    rows = []
    for at in findings.by_slo:
        slo = at.slo_s
        for row in at.best:
            # Without a rate: why, for the row's own deployment (the answer table says it for the whole group).
            rate = esc(rate_text(row.curve, row.step, slo) if row.step else at.of(row.curve).unmet)
            best = label(row.curve) if row.rate > 0 else "none meets it"
            price = f"${row.price.per_hour:.2f}" if row.price is not None else "no price"
            cost = f"${row.cost:.3f}" if row.cost is not None else "–"
            rows.append(
                f"<tr><td>p99 ≤ {slo * 1e3:g} ms</td><td>{esc(row.group)}</td><td>{esc(best)}</td>"
                f"<td>{esc(machine_name(row.curve))}</td><td>{rate}</td><td>{price}</td>"
                f"<td>{cost}</td></tr>"
            )
    return (
        "<table class='cost'><tr><th>SLO</th><th>provider</th><th>best settings found</th><th>machine</th>"
        "<th>max req/s</th><th>price per hour</th><th>cost per 1M inferences</th></tr>"
        f"{''.join(rows)}</table>"
    )


def prediction_section(findings: Findings, fits: list[dict], overheads: dict[str, float] | None = None) -> str:
    """Predicted beside measured SLO-bounded max rate, with the relative error, where a bench fit exists.
    `overheads`: serving work per request by machine (machine.key; predict.request_overheads)."""
    rows, missing = [], []
    for i, curve in enumerate(findings.curves):
        overhead = (overheads or {}).get(machine_key(curve.machine or {}), 0.0)
        for at in findings.by_slo:
            slo = at.slo_s
            predicted = predict_deployment(curve, fits, slo, overhead)
            if predicted is None:
                missing.append(curve)
                break
            measured = at.measured[i].rate
            error = f"{(predicted['rate'] - measured) / measured:+.0%}" if measured > 0 else "–"
            fit = predicted["fit"]
            rows.append(
                f"<tr><td>{esc(label(curve))}</td><td>{esc(machine_name(curve))}</td>"
                f"<td>p99 ≤ {slo * 1e3:g} ms</td>"
                f"<td>{fit.a_s * 1e3:.3f} + ({(fit.b_s - overhead) * 1e3:.4f} + c {overhead * 1e3:.3f})·n"
                f"{esc(_fixed(predicted))}</td>"
                f"<td>{predicted['rate']:.0f}</td><td>{measured:.0f}</td><td>{error}</td>"
                f"<td>{esc(_prediction_caveats(curve, predicted))}</td></tr>"
            )
    text = f"<h3>{esc(findings.model)}: predicted vs measured</h3>"
    if rows:
        text += (
            "<table class='prediction'><tr><th>deployment</th><th>machine</th><th>SLO</th>"
            "<th>batch time t(n) + c·n, ms</th><th>predicted max req/s</th><th>measured max req/s</th>"
            f"<th>relative error</th><th>caveats</th></tr>{''.join(rows)}</table>"
        )
    for curve in missing:
        text += (
            f"<p>No prediction for {esc(label(curve))} on {esc(machine_name(curve))}: no bench batch-size sweep "
            f"of model '{esc(curve.model)}' on the {esc(curve.provider or '?')} backend from that "
            "machine (run `latlab bench` there and put its bench.json beside the results).</p>"
        )
    return text


def _fixed(predicted: dict) -> str:
    fixed = predicted.get("fixed") or {}
    return f" (bench {', '.join(f'{k}={v}' for k, v in sorted(fixed.items()))})" if fixed else ""


def _prediction_caveats(curve: Curve, predicted: dict) -> str:
    """Why a prediction and a measurement may not be comparable."""
    caveats = []
    top = max((s.achieved_rps for s in curve.steps), default=0.0)
    if predicted["rate"] > top:
        caveats.append(f"beyond the highest rate measured ({top:.0f} req/s)")
    if predicted["batch"] > predicted["fit"].max_batch:
        caveats.append(f"batch {predicted['batch']:.0f} extrapolates the fit past batch {predicted['fit'].max_batch}")
    server_threads = intra_op_threads(curve)
    bench_threads = predicted.get("bench_threads")
    if (
        predicted["backend"] == "ort-cpu"
        and None not in (server_threads, bench_threads)
        and server_threads != bench_threads
    ):
        caveats.append(
            f"bench ran ORT with threads={bench_threads}, the server with "
            f"intra_op_threads={server_threads} (0 = every core)"
        )
    return "; ".join(caveats) or "–"


def assumptions_list() -> str:
    return (
        "<p>The predictive model's assumptions:</p><ul>" + "".join(f"<li>{esc(a)}</li>" for a in ASSUMPTIONS) + "</ul>"
    )


def bench_table(doc: dict) -> str:
    """Every bench point as numbers, backends side by side per experiment, folded (the figures show the same)."""
    tables = []
    for experiment in doc.get("experiments", []):
        backends, rows = pivot(experiment)
        ratio = {"ort-cpu", "ort-cuda"} <= set(backends)
        head = "".join(f"<th>{esc(b)} ms</th>" for b in backends) + ("<th>ORT cpu/cuda</th>" if ratio else "")
        body = []
        for value, params, ms in rows:
            cells = "".join(f"<td>{ms[b]:.3f}</td>" if b in ms else "<td>–</td>" for b in backends)
            if ratio:
                speedup = gpu_speedup(ms)
                cells += f"<td>{speedup:.2f}x</td>" if speedup else "<td>–</td>"
            body.append(
                f"<tr><td>{esc(value if value is not None else '–')}</td>"
                f"<td>{esc(params if params is not None else '–')}</td>{cells}</tr>"
            )
        tables.append(
            f"<p>{esc(experiment.get('name', '?'))}</p><table><tr><th>{esc(experiment.get('vary', 'value'))}"
            f"</th><th>params</th>{head}</tr>{''.join(body)}</table>"
        )
    return f"<details><summary>bench numbers</summary>{''.join(tables)}</details>"


def _cores(curve: Curve) -> int | None:
    return (curve.machine or {}).get("cores")


def steps_table(curve: Curve) -> str:
    rows = []
    for s in curve.steps:
        p = {
            k: (f"{getattr(s, k) * 1e3:.2f}" if getattr(s, k) is not None else "–")
            for k in ("p50_s", "p90_s", "p99_s", "max_s")
        }
        batch = f"{s.avg_batch_size:.1f}" if s.avg_batch_size else "–"
        padded = (s.server or {}).get("padded_position_share")
        batch += f", {padded:.0%} pad tokens" if padded is not None else ""
        flags = (
            (" (generator-bound)" if s.generator_bound else "")
            + (f" (too few samples: {samples_text(s)})" if s.too_few_samples else "")
            + (" (server-bound)" if server_bound(s, curve) else "")
            + ("" if s.stable else " (unstable)")
            + (" (near the generator's floor)" if near_floor(s, curve.generator_floor) else "")
            + (f" ({other})" if (other := other_load_text(s.other_load_cores, _cores(curve))) else "")
        )
        if s.server_interrupted:
            flags += f" (server interrupted: {s.interruption})"
        if s.workers_lost:
            flags += f" (workers lost: {', '.join(s.workers_lost)})"
        flags += fleet_flag(s)
        cpu = f"{s.generator_cpu_percent:.0f}%" if s.generator_cpu_percent is not None else "–"
        dropped = s.dropped if s.dropped is not None else "–"
        rows.append(
            f"<tr><td>{s.offered_rps:.0f}</td><td>{s.achieved_rps:.0f}</td><td>{p['p50_s']}</td>"
            f"<td>{p['p90_s']}</td><td>{p['p99_s']}</td><td>{esc(p99_interval(s))}</td><td>{p['max_s']}</td>"
            f"<td>{s.errors}</td><td>{dropped}</td><td>{batch}</td><td>{esc(lateness_text(s))}</td>"
            f"<td>{cpu}{esc(flags)}</td></tr>"
        )
    server = f" ({server_name(curve)})" if curve.by_server else ""
    return (
        f"<details><summary>{esc(curve.name)}{esc(server)} on {esc(machine_name(curve))}: "
        f"{len(curve.steps)} steps — "
        f"{esc(curve.stop_reason)}{esc(_saturation(curve))}</summary>"
        "<table><tr><th>offered/s</th><th>achieved/s</th>"
        f"<th>p50 ms</th><th>p90 ms</th><th>p99 ms</th><th>p99 {_level(curve)} interval ms</th><th>max ms</th>"
        "<th>errors</th><th>dropped</th>"
        f"<th>avg batch</th><th>sent late p50 / p99 ms</th><th>generator CPU, flags</th></tr>{''.join(rows)}"
        f"</table><p>{esc(floor_line(curve.generator_floor))}</p>{_proxy_paragraph(curve)}</details>"
    )


def _proxy_paragraph(curve: Curve) -> str:
    """What the fleet's proxy added to a lone request, measured before the steps (--fleet); '' for one server."""
    line = proxy_line(curve.name, curve.proxy_added)
    return f"<p>{esc(line)}</p>" if line else ""


def fleet_flag(step: Step) -> str:
    """' (fleet: imbalance 1.04, proxy retries 0, 5xx 0)' for a step measured through a fleet's proxy (--fleet): the
    busiest replica's requests over the mean, and what the proxy retried or failed; '' for one server."""
    if not step.fleet:
        return ""
    imbalance, proxy = step.fleet.get("imbalance"), step.fleet.get("proxy") or {}
    parts = [f"imbalance {imbalance:.2f}" if imbalance is not None else "imbalance unknown"]
    parts += [f"proxy {key} {proxy[key]:.0f}" for key in ("retries", "5xx") if key in proxy]
    return f" (fleet: {', '.join(parts)})"


def lateness_text(step: Step) -> str:
    """The generator's send lateness of a step (actual minus intended send time, which every latency includes),
    '–' for steps that did not record it (closed loop sends at once; results from before it was recorded)."""
    if step.send_lateness_p50_s is None or step.send_lateness_p99_s is None:
        return "–"
    return f"{step.send_lateness_p50_s * 1e3:.2f} / {step.send_lateness_p99_s * 1e3:.2f}"


def samples_text(step: Step) -> object:
    """The step's request count, '?' in results from before it was recorded."""
    return "?" if step.samples is None else step.samples


def p99_interval(step: Step) -> str:
    """'8.1–9.6': the step's p99 interval in ms (loadtest/confidence.py); '≥ 8.1' with too few samples for an
    upper bound; '–' in results from before intervals were recorded."""
    ci = step.confidence
    if not ci or ci.get("p99_low_s") is None:
        return "–"
    if ci.get("p99_high_s") is None:
        return f"≥ {ci['p99_low_s'] * 1e3:.2f}"
    return f"{ci['p99_low_s'] * 1e3:.2f}–{ci['p99_high_s'] * 1e3:.2f}"


def _level(curve: Curve) -> str:
    levels = {s.confidence["level"] for s in curve.steps if s.confidence}
    return f"{levels.pop():.0%}" if len(levels) == 1 else "confidence"


def _saturation(curve: Curve) -> str:
    """Whether the sweep found the deployment's limit (saturated, rate_cap_rps; absent in results from
    before the saturation search)."""
    cap = f", rate cap {curve.rate_cap_rps:g} req/s" if curve.rate_cap_rps else ""
    if curve.saturated is False:
        return f" (not saturated{cap})"
    return f" (saturated{cap})" if curve.saturated else ""
