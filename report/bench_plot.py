"""Figures of a bench.json shaped like seed 003's: time vs batch size, d_model, n_layers, fixed parameters."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers and CI

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

TITLES = {
    "batch_size": "Inference time vs batch size",
    "d_model": "Inference time vs d_model",
    "n_layers": "Inference time vs n_layers",
    "fixed_params": "Fixed parameter count: width traded for depth",
    "zoo_batch": "Zoo models: inference time vs batch size",
}
LOG_X = {"batch_size", "d_model", "fixed_params", "zoo_batch"}


def plot_bench(doc: dict) -> dict[str, bytes]:
    """One PNG per seed experiment present ('batch_size.png', ...) plus 'zoo_batch.png' with a panel per model."""
    figures: dict[str, bytes] = {}
    zoo = [e for e in doc.get("experiments", []) if e["name"] == "zoo_batch" and e["points"]]
    for experiment in doc.get("experiments", []):
        if experiment["name"] == "zoo_batch" or not experiment["points"]:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        _draw(ax, experiment)
        ax.set_title(f"{TITLES[experiment['name']]}  ({_fixed_text(experiment)})", fontsize=10)
        figures[f"{experiment['name']}.png"] = _png(fig, doc)
    if zoo:
        fig, axes = plt.subplots(1, len(zoo), figsize=(5 * len(zoo), 4.2), squeeze=False)
        for ax, experiment in zip(axes[0], zoo):
            _draw(ax, experiment)
            ax.set_title(experiment["model"], fontsize=10)
        fig.suptitle(TITLES["zoo_batch"], fontsize=11)
        figures["zoo_batch.png"] = _png(fig, doc)
    return figures


def _draw(ax: Axes, experiment: dict) -> None:
    vary = experiment["vary"]
    top = 0.0
    for backend in sorted({p["backend"] for p in experiment["points"]}):
        points = sorted((p for p in experiment["points"] if p["backend"] == backend), key=lambda p: p[vary])
        x = [p[vary] for p in points]
        median = [p["median_s"] * 1e3 for p in points]
        low = [(p["median_s"] - p["min_s"]) * 1e3 for p in points]
        high = [(p["max_s"] - p["median_s"]) * 1e3 for p in points]
        ax.errorbar(x, median, yerr=[low, high], marker="o", markersize=3, capsize=2, label=backend)
        top = max([top, *median])
    if experiment["name"] in LOG_X:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        # Times span decades here; a log axis also keeps a noisy run's max bar from flattening the lines.
        ax.set_yscale("log")
    else:
        # Linear like the seed, so "linear in depth" reads as a straight line; outlier bars are clipped.
        ax.set_ylim(0, top * 1.3 if top > 0 else None)
    if experiment["name"] == "fixed_params":
        # The seed labels each depth with the width it implies.
        ticks = sorted({(p["n_layers"], p["d_model"]) for p in experiment["points"]})
        ax.set_xticks([t[0] for t in ticks], [f"{n}\nd={d}" for n, d in ticks], fontsize=7)
    ax.set_xlabel(vary)
    ax.set_ylabel("median time per run (ms; bars: min-max)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def _fixed_text(experiment: dict) -> str:
    return ", ".join(f"{k}={v:,}" if isinstance(v, int) else f"{k}={v}" for k, v in experiment["fixed"].items())


def _png(fig: plt.Figure, doc: dict) -> bytes:
    machine = doc.get("machine", {})
    fig.text(
        0.01,
        0.005,
        f"{machine.get('cpu', '?')} | GPU: {machine.get('gpu') or 'none'} | "
        f"ORT {machine.get('ort_version', '?')} | torch {machine.get('torch_version', '?')}",
        fontsize=6,
        color="gray",
    )
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()
