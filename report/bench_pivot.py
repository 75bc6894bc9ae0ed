"""A bench experiment pivoted so its backends sit side by side: one row per swept value, one column per backend."""

from __future__ import annotations

BACKENDS = ("torch-cpu", "ort-cpu", "torch-cuda", "ort-cuda")


def pivot(experiment: dict) -> tuple[list[str], list[tuple]]:
    """(backends present, rows of (swept value, params, {backend: median ms})), rows in sweep order."""
    vary = experiment.get("vary", "batch_size")
    points = experiment.get("points", [])
    present = [b for b in BACKENDS if any(p.get("backend") == b for p in points)]
    present += sorted({p.get("backend") for p in points} - set(present) - {None})
    rows: dict[tuple, dict[str, float]] = {}
    for p in points:
        key = (p.get(vary), p.get("params"))
        if p.get("median_s") is not None:
            rows.setdefault(key, {})[p.get("backend")] = p["median_s"] * 1e3
    ordered = sorted(rows.items(), key=lambda kv: (kv[0][0] is None, kv[0][0] or 0, kv[0][1] or 0))
    return present, [(value, params, ms) for (value, params), ms in ordered]


def gpu_speedup(ms: dict[str, float]) -> float | None:
    """ORT's CPU time over its CUDA time for one point (> 1: the GPU is faster); None without both."""
    cpu, cuda = ms.get("ort-cpu"), ms.get("ort-cuda")
    return cpu / cuda if cpu and cuda else None
