"""The report's "Configurations tried" section: what the lab's search (`latlab lab --search-minutes`) measured per
model and provider, from the run folder's search/ records: every configuration with its variant and that
variant's accuracy against FP32, the rate it held under the bound the search ranked by (screened, and side by
side for the finalists), how it was measured, the best marked with its rates under every SLO from its full
sweep; and each variant that was refused or not made, with why."""

from __future__ import annotations

import json
from pathlib import Path

from latlab.loadtest.results import SEARCH_FOLDER, Curve
from latlab.report.sections import esc
from latlab.report.rates import max_rate_under, rate_text


def read_searches(run_dirs: list[Path]) -> tuple[list[dict], dict[str, dict]]:
    """Every search record (tune.json) under the run folders, and the variants' notes per model."""
    records, notes = [], {}
    for folder in run_dirs:
        base = Path(folder) / SEARCH_FOLDER
        records += [json.loads(p.read_text()) for p in sorted(base.glob("*/tune.json"))]
        if (base / "variants.json").is_file():
            notes.update(json.loads((base / "variants.json").read_text()))
    return records, notes


def tried_section(run_dirs: list[Path], curves: list[Curve], slos_s: list[float]) -> str:
    """The section, or "" when no run searched."""
    records, notes = read_searches(run_dirs)
    if not records:
        return ""
    by_name = {c.name: c for c in curves}
    parts = [
        "<h2>Configurations tried</h2>"
        "<p>Before the sweep the lab searched each model's configurations per provider (docs/tuning.md), starting "
        "at the plan's batching setting in every variant side by side: short SLO searches rank them (screened), "
        "the best few are measured again side by side, finer, and the best is swept in full in place of the plan's "
        "batching-on deployment, so the answer above chooses between it and batching off. Rates here are under "
        "the bound the search ranked by.</p>"
    ]
    for record in records:
        parts.append(_search_table(record, notes.get(record["model"], {}), by_name, slos_s))
    return "".join(parts)


def _search_table(record: dict, notes: dict, by_name: dict[str, Curve], slos_s: list[float]) -> str:
    bound_ms = record["slo_p99_s"] * 1e3
    swept = record.get("swept_as")
    accuracy = {v: n.get("accuracy") for v, n in notes.items() if n.get("accuracy")}
    rows = []
    for k, tried in enumerate(record["configurations"]):
        variant = tried["candidate"]["variant"]
        screened = f"{tried['rate']:.0f}" if tried.get("rate") else "none met it"
        side = f"{tried['confirmed']:.0f}" if tried.get("confirmed") else "–"
        how = "probed, then side by side" if tried.get("confirmed") else "probed"
        mark = ""
        if k == 0 and swept:
            how += f"; swept in full as {swept}"
            mark = "★ "
        rows.append(
            f"<tr><td>{esc(mark + tried['label'])}</td><td>{esc(_accuracy_text(variant, accuracy.get(variant)))}</td>"
            f"<td>{esc(screened)}</td><td>{esc(side)}</td><td>{esc(how)}</td></tr>"
        )
    curve = by_name.get(swept) if swept else None
    full = ""
    if curve is not None:
        rates = "; ".join(
            f"p99 ≤ {s * 1e3:g} ms: {rate_text(curve, max_rate_under(curve.steps, s), s)}" for s in slos_s
        )
        full = f"<p>{esc(swept)}, swept in full: {esc(rates)}.</p>"
    refused = "".join(
        f"<li>{esc(variant.upper())} {esc(note['status'])}: {esc(note.get('why', ''))}</li>"
        for variant, note in notes.items()
        if note.get("status") in ("refused", "not made")
    )
    resolutions = sorted({r["resolution"] for r in record.get("rounds", []) if r.get("resolution")}, reverse=True)
    finer = " and ".join(f"{r:.0%}" for r in resolutions)
    return (
        f"<h3>{esc(record['model'])} on {esc(record['provider'])}, ranked by p99 ≤ {bound_ms:g} ms</h3>"
        f"<p>{len(record['configurations'])} configurations measured in {record['seconds']:.0f} s"
        + (f" (SLO searches to {finer})" if finer else "")
        + f"; {esc(record['stopped'])}.</p>"
        "<table><tr><th>configuration</th><th>variant's accuracy against FP32</th>"
        f"<th>req/s under p99 ≤ {bound_ms:g} ms, screened</th><th>side by side</th><th>how measured</th></tr>"
        f"{''.join(rows)}</table>{full}" + (f"<ul>{refused}</ul>" if refused else "")
    )


def _accuracy_text(variant: str, accuracy: dict | None) -> str:
    if variant == "fp32":
        return "the export itself"
    if not accuracy or not isinstance(accuracy.get("figure"), (int, float)):
        return (accuracy or {}).get("status") or "not recorded"
    return f"{accuracy.get('label')} {accuracy['figure']:.4f} (at least {accuracy.get('min_accuracy')})"
