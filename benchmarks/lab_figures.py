"""What a lab run measured, as the docs record it: the rate under each SLO per deployment (with its bracket),
how many steps were decided, undecided and extended, and how often the stability mark fired.

    .venv/bin/python benchmarks/lab_figures.py runs/<id>            # markdown tables on stdout
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from latlab.common.user_input import parse_slos
from latlab.loadtest.results import RESULTS_FILE, Curve, read_results
from latlab.loadtest.search import slo_verdict
from latlab.report.naming import label
from latlab.report.rates import max_rate_under, rate_text


def curves(run_dir: Path) -> list[Curve]:
    """Every deployment of the run's results files, in the order the lab swept them."""
    found = []
    for path in sorted(run_dir.glob(f"*/{RESULTS_FILE}"), key=lambda p: p.stat().st_mtime):
        found += read_results(path)[0].deployments
    return found


def slo_table(deployments: list[Curve], slos: list[float]) -> list[str]:
    head = "| deployment | " + " | ".join(f"p99 ≤ {s * 1e3:g} ms" for s in slos) + " | steps (of them for brackets) |"
    lines = [head, "|---|" + "---:|" * (len(slos) + 1)]
    for curve in deployments:
        cells = [rate_text(curve, max_rate_under(curve.steps, s), s) for s in slos]
        lines.append(f"| {label(curve)} | " + " | ".join(cells) + f" | {len(curve.steps)} ({curve.slo_steps or 0}) |")
    return lines


def decision_counts(deployments: list[Curve], slos: list[float]) -> list[str]:
    steps = [s for c in deployments for s in c.steps]
    verdicts = Counter(slo_verdict(s, slo) for s in steps for slo in slos)
    fully = sum(all(slo_verdict(s, slo) != "undecided" for slo in slos) for s in steps)
    extended = sum(1 for s in steps if s.extended_windows)
    unstable = sum(1 for s in steps if not s.stable)
    brackets = Counter(b["meaning"].split(":")[0].split(" (")[0] for c in deployments for b in c.slo_brackets)
    return [
        f"- steps: {len(steps)}; decided for every SLO: {fully}; extended while undecided: {extended}",
        "- step-SLO decisions: " + ", ".join(f"{k} {v}" for k, v in sorted(verdicts.items())),
        f"- marked unstable: {unstable} of {len(steps)} ({unstable / max(len(steps), 1):.0%})",
        "- brackets: " + ", ".join(f"{k} {v}" for k, v in sorted(brackets.items())),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--slo", default="10ms,25ms,50ms,100ms")
    args = parser.parse_args()
    slos = parse_slos(args.slo)
    deployments = curves(args.run_dir)
    print("\n".join(slo_table(deployments, slos) + [""] + decision_counts(deployments, slos)))


if __name__ == "__main__":
    main()
