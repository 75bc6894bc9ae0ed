"""The report's charts as PNG bytes: latency-vs-throughput curves with SLO lines, the cost picture and where
a request's time goes (bench figures: latlab.report.bench_plot)."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402

from latlab.loadtest.results import Curve  # noqa: E402
from latlab.report.costs import fleet_cost_per_million, rate_grid  # noqa: E402
from latlab.report.naming import machine_name, server_name  # noqa: E402


def curve_png(model: str, curves: list[Curve], slos_s: list[float]) -> bytes:
    """p99 (solid) and p50 (dashed) against achieved throughput, one colour per deployment and machine."""
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=110)
    for i, curve in enumerate(curves):
        # A step the server's restart interrupted says nothing about the load: left off the curve.
        steps = [s for s in curve.steps if s.p99_s is not None and not s.server_interrupted]
        x = [s.achieved_rps for s in steps]
        name = f"{curve.name} @ {machine_name(curve)}"
        if curve.by_server:  # servers compared: the same deployment name may be on each
            name = f"{server_name(curve)}: {name}"
        color = f"C{i % 10}"
        ax.plot(x, [s.p99_s * 1e3 for s in steps], "o-", color=color, label=f"{name} p99")
        ax.plot(x, [s.p50_s * 1e3 for s in steps], "s--", color=color, alpha=0.6, label=f"{name} p50")
        few = [s for s in steps if s.too_few_samples]
        if few:  # their p99 is the maximum of a handful of requests: shown, hollow, never deciding an SLO
            ax.plot(
                [s.achieved_rps for s in few],
                [s.p99_s * 1e3 for s in few],
                "o",
                markersize=11,
                markerfacecolor="none",
                color="black",
                label="too few samples" if i == 0 else None,
            )
        bound = [s for s in steps if s.generator_bound]
        if bound:  # the generator, not the server, may be what these points measure
            ax.plot(
                [s.achieved_rps for s in bound],
                [s.p99_s * 1e3 for s in bound],
                "x",
                color="red",
                markersize=10,
                label="generator-bound step" if i == 0 else None,
            )
    for slo in slos_s:
        ax.axhline(slo * 1e3, color="grey", linestyle=":", linewidth=1)
        ax.annotate(
            f"SLO {slo * 1e3:g} ms",
            (0, slo * 1e3),
            xycoords=("axes fraction", "data"),
            fontsize=8,
            color="grey",
            va="bottom",
        )
    ax.set_yscale("log")
    ax.set_xlabel("achieved throughput (requests/s)")
    ax.set_ylabel("latency from intended send (ms)")
    ax.set_title(f"{model}: latency vs throughput")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return _png(fig)


def cost_png(model: str, slo_s: float, lines: list[dict], crossover_rps: float | None, top_rps: float) -> bytes:
    """Cost per million inferences against sustained rate, one staircase per provider's best deployment
    (`lines`: {"label", "capacity_rps", "price_per_hour"}), the crossover as a vertical line."""
    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=110)
    grid = rate_grid(top_rps)
    for i, line in enumerate(lines):
        costs = [fleet_cost_per_million(r, line["capacity_rps"], line["price_per_hour"]) for r in grid]
        ax.plot(grid, costs, color=f"C{i % 10}", label=line["label"])
        ax.axvline(line["capacity_rps"], color=f"C{i % 10}", linestyle=":", linewidth=1)
    if crossover_rps:
        ax.axvline(crossover_rps, color="black", linewidth=1.5)
        ax.annotate(
            f" crossover {crossover_rps:.0f} req/s",
            (crossover_rps, 0.03),
            xycoords=("data", "axes fraction"),
            fontsize=8,
            ha="left",
            va="bottom",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("sustained rate (requests/s); dotted: one machine's max rate under the SLO")
    ax.set_ylabel("USD per million inferences")
    ax.set_title(f"{model}: cost at p99 ≤ {slo_s * 1e3:g} ms, machines added as the rate grows")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")  # costs fall with the rate: the top right stays empty
    return _png(fig)


def breakdown_png(model: str, bars: list[dict], parts: tuple[str, ...]) -> bytes:
    """Per deployment (at its highest rate meeting an SLO): the server's time per request stacked by part,
    and beside it the client-measured mean latency."""
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.45 * max(1, len(bars))), dpi=110)
    names = [f"{b['label']}{' [server-bound]' if b.get('server_bound') else ''}" for b in bars]
    y = list(range(len(bars)))
    left = [0.0] * len(bars)
    for i, part in enumerate(parts):
        widths = [b["parts"][part] * 1e3 for b in bars]
        ax.barh([v + 0.2 for v in y], widths, height=0.4, left=left, color=f"C{i}", label=part.replace("_", " "))
        left = [a + w for a, w in zip(left, widths)]
    client = [(b["client_mean_s"] or 0.0) * 1e3 for b in bars]
    ax.barh([v - 0.2 for v in y], client, height=0.4, color="grey", label="client mean (from intended send)")
    ax.set_yticks(y, names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms per request (server: its own histograms; grey: client-measured)")
    ax.set_title(f"{model}: where the time goes")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: the bars fill the axes
    return _png(fig)


def traffic_png(model: str, slo_s: float, lines: list[dict]) -> bytes:
    """Rate under the SLO against the arrivals' burstiness as sent, one line per provider's best deployment
    (`lines`: {"label", "points": [(cv, rate), ...]})."""
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for i, line in enumerate(lines):
        x, y = [p[0] for p in line["points"]], [p[1] for p in line["points"]]
        ax.plot(x, y, "o-", color=f"C{i % 10}", label=line["label"])
    ax.axvline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("coefficient of variation of the gaps between requests as sent (1: Poisson)")
    ax.set_ylabel("highest rate under the SLO (requests/s)")
    ax.set_title(f"{model}: rate at p99 ≤ {slo_s * 1e3:g} ms against burstiness")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return _png(fig)


def fleet_png(title: str, fleets: list[dict], tick_s: float) -> bytes:
    """Replicas over the day, one panel per fleet, one line per kind of replica (`fleets`: {"name", "kinds":
    {kind: (ready per tick, billed per tick)}}); billed and not ready is a replica still starting."""
    fig, axes = plt.subplots(len(fleets), 1, figsize=(8, 1.0 + 1.3 * len(fleets)), dpi=110, sharex=True, squeeze=False)
    colors = {kind: f"C{i}" for i, kind in enumerate(dict.fromkeys(k for f in fleets for k in f["kinds"]))}
    for ax, fleet in zip(axes[:, 0], fleets):
        for kind, (ready, billed) in fleet["kinds"].items():
            hours = [k * tick_s / 3600 for k in range(len(ready))]
            ax.step(hours, ready, where="post", color=colors[kind], label=f"{kind} ready")
            ax.step(hours, billed, where="post", color=colors[kind], linestyle=":", linewidth=1, label=f"{kind} billed")
        ax.yaxis.get_major_locator().set_params(integer=True)  # replicas come whole
        ax.set_title(fleet["name"], fontsize=8, loc="left")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6, loc="upper right")
    axes[-1, 0].set_xlabel("hour of the day")
    axes[len(fleets) // 2, 0].set_ylabel("replicas")
    fig.suptitle(title, fontsize=9)
    return _png(fig)


def _png(fig: plt.Figure) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()
