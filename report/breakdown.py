"""Where a request's time goes inside the server (from its own histograms, per step) and when the serving
process, not the device, is what limits a deployment (the server-bound rule)."""

from __future__ import annotations

import html
from collections.abc import Sequence

from latlab.common.settings import BatcherSettings
from latlab.loadtest.results import Curve, Step
from latlab.report.costs import cpu_threads
from latlab.report.findings import Findings
from latlab.report.naming import is_gpu, label, machine_name, server_name

PARTS = ("queue", "preprocess", "input_transfer", "compute", "output_transfer", "rest")
"""The stacked bar's parts, bottom to top."""
SERVER_BOUND_CPU = 0.90
"""The serving process used at least this share of the cores it could use..."""
DEVICE_IDLE_BELOW = 0.70
"""...while the deployment's instances ran batches less than this share of the time."""


def parts(server: dict) -> dict[str, float] | None:
    """Mean seconds per request inside the server: queue wait, preprocess, input transfer, the model run,
    output transfer and the rest of the server's work (decoding, batching, encoding, the front end).
    The compute histogram times a whole batch run including its transfers, so they are taken out of it.
    None when the step has no server figures."""
    if not server or server.get("request_s") is None:
        return None
    figures = {
        key: server.get(f"{key}_s") or 0.0 for key in ("queue", "preprocess", "input_transfer", "output_transfer")
    }
    figures["compute"] = max(
        0.0, (server.get("compute_s") or 0.0) - figures["input_transfer"] - figures["output_transfer"]
    )
    inside = sum(figures.values())
    figures["rest"] = max(0.0, server["request_s"] - inside)
    return {key: figures[key] for key in PARTS}


def busy_share(server: dict, curve: Curve) -> float | None:
    """Share of the step's time the deployment's instances were running batches (all instances together)."""
    busy, seconds = server.get("busy_s"), server.get("seconds")
    if busy is None or not seconds:
        return server.get("busy_share")
    instances = int((curve.batcher or BatcherSettings()).instances or 1)
    share = busy / (seconds * instances)
    # Triton's figure is an upper estimate (loadtest.scrape.triton_step): a share past 1 is that estimate's error
    return min(share, 1.0) if server.get("source") == "triton" else share


def usable_cores(curve: Curve, share: float) -> float:
    """The cores the server could keep busy: one per interpreter (its lock serialises the Python work of
    decoding, batching and encoding): one process, or each front end and the engine of a server with several
    ([server] frontends); plus, on CPU, ORT's threads while a batch runs."""
    frontends = int(curve.frontends or 1)
    interpreters = 1.0 if frontends <= 1 else frontends + 1.0
    if is_gpu(curve):
        return interpreters
    return interpreters + share * (cpu_threads(curve) or 1)


def server_bound(step: Step, curve: Curve) -> bool | None:
    """True when the serving processes were saturated (CPU ≥ 90% of the cores they could use: usable_cores, the
    front ends and engine of a multi-front-end server counted) while its device was not (instances busy < 70%
    of the time); None when the server did not export what the rule needs."""
    server = step.server or {}
    share = busy_share(server, curve) if server else None
    cpu = server.get("process_cpu_cores")
    if share is None or cpu is None:
        return None
    return cpu >= SERVER_BOUND_CPU * usable_cores(curve, share) and share < DEVICE_IDLE_BELOW


def bars(findings: Findings) -> list[dict]:
    """Per deployment and SLO: the step at its highest rate meeting the SLO, with its server-side parts,
    client-measured mean and p99, and the server-bound flag. Steps without server figures are left out."""
    found = []
    by_slo = sorted(findings.by_slo, key=lambda at: at.slo_s)
    for i, curve in enumerate(findings.curves):
        for at in by_slo:
            slo, step = at.slo_s, at.measured[i].step
            split = parts(step.server or {}) if step else None
            if split is None or any(b["step"] is step for b in found):
                continue  # the same step can be the highest under two SLOs: one bar
            found.append(
                {
                    "curve": curve,
                    "slo_s": slo,
                    "step": step,
                    "parts": split,
                    "client_mean_s": step.mean_s,
                    "client_p99_s": step.p99_s,
                    "server_bound": server_bound(step, curve),
                }
            )
    return found


def client_only(curves: Sequence[Curve]) -> str:
    """Which deployments were measured from the client side only because their server exports no figures latlab
    reads (their run recorded why, in `server_metrics`), in one sentence; "" when none was."""
    missing = [c for c in curves if c.server_metrics is not None and not c.server_metrics.get("kind")]
    if not missing:
        return ""
    reasons = sorted({str(c.server_metrics.get("note") or "no metrics") for c in missing})
    names = ", ".join(f"{label(c)} on {machine_name(c)}" for c in missing)
    return (
        f"Client side only for {names}: the server exports no figures latlab reads ({'; '.join(reasons)}). "
        "Where it exports Triton's metrics, give their URL with --server-metrics."
    )


def bar_label(bar: dict) -> str:
    server = f"{server_name(bar['curve'])}: " if bar["curve"].by_server else ""
    return f"{server}{bar['curve'].name} @ {bar['step'].achieved_rps:.0f}/s"


def breakdown_table(found: list[dict]) -> str:
    """The bars as numbers (ms), with the server's CPU and busy share and the server-bound flag."""
    rows = []
    for bar in found:
        server, curve = bar["step"].server, bar["curve"]
        share = busy_share(server, curve)
        cpu = server.get("process_cpu_cores")
        flag = {True: "server-bound", False: "no", None: "unknown (no process CPU figure)"}[bar["server_bound"]]
        if bar["server_bound"] is not None and int(curve.frontends or 1) > 1:
            flag += f" ({processes(curve)})"
        cells = "".join(f"<td>{bar['parts'][k] * 1e3:.2f}</td>" for k in PARTS)
        client = "–" if bar["client_mean_s"] is None else f"{bar['client_mean_s'] * 1e3:.2f}"
        rows.append(
            f"<tr><td>{html.escape(label(curve))} on {html.escape(machine_name(curve))}</td>"
            f"<td>{bar['step'].achieved_rps:.0f} (p99 ≤ {bar['slo_s'] * 1e3:g} ms)</td>{cells}"
            f"<td>{sum(bar['parts'].values()) * 1e3:.2f}</td><td>{client}</td>"
            f"<td>{'–' if cpu is None else f'{cpu:.2f}'}</td>"
            f"<td>{'–' if share is None else f'{share:.0%}'}</td><td>{flag}</td></tr>"
        )
    head = "".join(f"<th>{k.replace('_', ' ')} ms</th>" for k in PARTS)
    return (
        "<table class='breakdown'><tr><th>deployment</th><th>req/s (highest meeting)</th>"
        f"{head}<th>server total ms</th><th>client mean ms</th><th>server CPU, cores</th>"
        f"<th>instances busy</th><th>server-bound</th></tr>{''.join(rows)}</table>"
    )


def processes(curve: Curve) -> str:
    """The server's processes as the server-bound rule counts them: "one process", or "N front ends + engine"."""
    frontends = int(curve.frontends or 1)
    return "one process" if frontends <= 1 else f"{frontends} front ends + engine"


RULE = (
    f"Server-bound: the serving processes used ≥ {SERVER_BOUND_CPU:.0%} of the cores they could use (one per "
    "Python interpreter: the one process, or each front end and the engine of a server with [server] frontends "
    "= N; plus on CPU the ORT threads while a batch ran) while the deployment's instances were running batches "
    f"less than {DEVICE_IDLE_BELOW:.0%} of the time: the front end, not the model, limits it (on one process, "
    "more front ends may lift it)."
)
