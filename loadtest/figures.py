"""The report's charts as PNG bytes: latency-vs-throughput curves with SLO lines (bench figures: latlab.bench_plot)."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402

def curve_png(model: str, curves: list[dict], slos_s: list[float]) -> bytes:
    """p99 (solid) and p50 (dashed) against achieved throughput, one colour per deployment and machine."""
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=110)
    for i, curve in enumerate(curves):
        # A step the server's restart interrupted says nothing about the load: left off the curve.
        steps = [s for s in curve["steps"] if s.get("p99_s") is not None and not s.get("server_interrupted")]
        x = [s["achieved_rps"] for s in steps]
        name = f"{curve['name']} @ {(curve.get('machine') or {}).get('hostname', '?')}"
        color = f"C{i % 10}"
        ax.plot(x, [s["p99_s"] * 1e3 for s in steps], "o-", color=color, label=f"{name} p99")
        ax.plot(x, [s["p50_s"] * 1e3 for s in steps], "s--", color=color, alpha=0.6, label=f"{name} p50")
        bound = [s for s in steps if s.get("generator_bound")]
        if bound:  # the generator, not the server, may be what these points measure
            ax.plot([s["achieved_rps"] for s in bound], [s["p99_s"] * 1e3 for s in bound], "x", color="red",
                    markersize=10, label="generator-bound step" if i == 0 else None)
    for slo in slos_s:
        ax.axhline(slo * 1e3, color="grey", linestyle=":", linewidth=1)
        ax.annotate(f"SLO {slo * 1e3:g} ms", (0, slo * 1e3), xycoords=("axes fraction", "data"),
                    fontsize=8, color="grey", va="bottom")
    ax.set_yscale("log")
    ax.set_xlabel("achieved throughput (requests/s)")
    ax.set_ylabel("latency from intended send (ms)")
    ax.set_title(f"{model}: latency vs throughput")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return _png(fig)


def _png(fig: plt.Figure) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()
