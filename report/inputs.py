"""What the report and the fleet plan read from run folders: the results of every run and the bench documents,
reference measurements marked as such."""

from __future__ import annotations

import json
from pathlib import Path

from latlab.loadtest.results import Run, read_results

BENCH_SCHEMA = "latlab.bench/1"
REFERENCE_DIR = Path(__file__).parent / "reference"
"""Measurements committed with the code (e.g. from a GPU machine), merged in with --with-reference."""


def read_bench(folder: Path) -> list[dict]:
    """Every bench*.json (schema latlab.bench/1) under a folder."""
    docs = []
    for file in sorted(Path(folder).glob("**/bench*.json")):
        doc = json.loads(file.read_text())
        if doc.get("schema") == BENCH_SCHEMA:
            docs.append({**doc, "_path": str(file)})
    return docs


def load_inputs(run_dirs: list[Path], reference_dir: Path | None) -> tuple[list[Run], list[dict]]:
    """The runs and bench documents of every folder (and the reference folder's, marked as such)."""
    results, bench = [], []
    folders = [(Path(d), False) for d in run_dirs] + ([(Path(reference_dir), True)] if reference_dir else [])
    for folder, reference in folders:
        if not folder.exists():
            raise FileNotFoundError(f"no such run folder: {folder}")
        found = bool(list(folder.glob("**/results*.json"))) if folder.is_dir() else folder.is_file()
        runs = read_results(folder) if found else []
        bench_docs = read_bench(folder) if folder.is_dir() else []
        for run in runs:
            run.reference = reference
            run.context()  # its deployments are marked too
        results += runs
        bench += [{**doc, "_reference": reference} for doc in bench_docs]
    if not results:
        raise FileNotFoundError(f"no results*.json under {', '.join(str(d) for d in run_dirs)}")
    return results, bench
