"""The one results format: a JSON file per run with every deployment's steps."""

from __future__ import annotations

import json
import math
from pathlib import Path

SCHEMA = "latlab.results/1"
RESULTS_FILE = "results.json"


def write_results(path: Path, doc: dict) -> None:
    doc = {"schema": SCHEMA, **doc}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(_finite(doc), indent=2) + "\n")
    tmp.replace(path)  # a reader never sees half a file


def read_results(run_dir: Path) -> list[dict]:
    """Every results file under a run folder (runs from several machines can be merged in one folder)."""
    run_dir = Path(run_dir)
    if run_dir.is_file():
        files = [run_dir]
    else:
        files = sorted(run_dir.glob("**/results*.json"))
    if not files:
        raise FileNotFoundError(f"no results*.json under {run_dir}")
    docs = []
    for file in files:
        doc = json.loads(file.read_text())
        if doc.get("schema") != SCHEMA:
            raise ValueError(f"{file} is not a latlab results file (schema {doc.get('schema')!r})")
        doc["_path"] = str(file)
        docs.append(doc)
    return docs


def _finite(value):
    """JSON has no NaN: write null for statistics of empty windows."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
