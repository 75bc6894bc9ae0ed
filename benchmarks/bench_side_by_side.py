"""Seed 003's in-process bench as markdown tables, backends side by side (the tables of docs/bench.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from latlab.report.bench_pivot import gpu_speedup, pivot


def experiment_table(experiment: dict) -> list[str]:
    """One markdown table: a row per swept value, a column per backend's median ms, and ORT's GPU speed-up."""
    backends, rows = pivot(experiment)
    ratio = {"ort-cpu", "ort-cuda"} <= set(backends)
    head = [experiment["vary"], "params", *(f"{b} ms" for b in backends)] + (["ORT cpu/cuda"] if ratio else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for value, params, ms in rows:
        cells = [str(value), f"{params / 1e6:.1f}M", *(f"{ms[b]:.3f}" if b in ms else "" for b in backends)]
        if ratio:
            speedup = gpu_speedup(ms)
            cells.append(f"{speedup:.2f}x" if speedup else "")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def document(paths: list[Path]) -> str:
    """Every experiment of every bench file, headed by its machine."""
    out = []
    for path in paths:
        bench = json.loads(path.read_text())
        machine = bench["machine"]
        where = (
            f"{machine.get('gpu') or 'no GPU'} + {machine['cpu']} ({machine['cores']} cores), "
            f"ORT {machine['ort_version']}"
        )
        for experiment in bench["experiments"]:
            fixed = ", ".join(f"{k}={v}" for k, v in experiment["fixed"].items())
            out += [
                f"### {experiment['name']} ({fixed}): {where}",
                f"From `{path.name}`, created {bench['created']}.",
                "",
            ]
            out += experiment_table(experiment) + [""]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("bench", nargs="+", type=Path, help="bench*.json files (schema latlab.bench/1)")
    print(document(parser.parse_args().bench))


if __name__ == "__main__":
    main()
