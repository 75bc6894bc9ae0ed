"""A load test in a child process of its own, started from a plan: the plan, with the run folder and run id it
writes, as JSON in that folder (PLAN_FILE), and `python -m latlab.loadtest` of the file (__main__.py). How the lab,
the search and the benchmarks start their load tests: no command line is rebuilt.

Light: the parent does not import Locust (which would monkey-patch its sockets)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from latlab.common import procs
from latlab.loadtest.plan import SweepPlan
from latlab.loadtest.results import RESULTS_FILE

PLAN_FILE = "sweep-plan.json"
"""In the run folder: what the child was asked to run (and a reader of the run finds it there)."""


def start(plan: SweepPlan, out: Path, run_id: str | None = None, log_path: Path | None = None) -> subprocess.Popen:
    """The load test of `plan` into the run folder `out` (a relative one: from this process's folder, which the
    child shares), labelled `run_id` (default: the folder's name), as a child in its own process group (procs.stop
    stops its Locust workers with it); its output into `log_path`, or this process's."""
    out.mkdir(parents=True, exist_ok=True)
    path = write_job(out / PLAN_FILE, plan, out, run_id)
    return procs.start([sys.executable, "-m", "latlab.loadtest", str(path)], log_path=log_path)


def run(plan: SweepPlan, out: Path, run_id: str | None = None, log_path: Path | None = None) -> Path:
    """`start`, then wait for the child (stopped, with its workers, also on Ctrl-C); the results file it wrote.
    RuntimeError when it fails."""
    child = start(plan, out, run_id, log_path)
    try:
        if child.wait() != 0:
            where = f": see {log_path}" if log_path else ""
            raise RuntimeError(f"load test failed with status {child.returncode}{where}")
    finally:
        procs.stop(child)
    return out / RESULTS_FILE


def write_job(path: Path, plan: SweepPlan, out: Path, run_id: str | None) -> Path:
    job = {"out": str(out), "run_id": run_id, "plan": asdict(plan)}
    path.write_text(json.dumps(job, indent=1) + "\n")
    return path


def read_job(path: Path) -> tuple[SweepPlan, Path, str | None]:
    """The plan, run folder and run id `write_job` wrote; the plan checked again as it is read back."""
    job = json.loads(path.read_text())
    return SweepPlan.from_dict(job["plan"]), Path(job["out"]), job["run_id"]
