"""A sweep plan run in this process: what it asks of the server checked before any load is sent, then the sweep
(or the overload test) into its run folder. What `latlab loadtest` and a child load test (__main__.py) both run.

Import this module before anything that uses sockets or threads: Locust monkey-patches them for gevent.
"""

from __future__ import annotations

from latlab.loadtest.sweep import run_sweep  # first: Locust patches sockets

from dataclasses import replace
from pathlib import Path

import requests

from latlab.common.user_input import UserError
from latlab.loadtest.payloads import check_samples, load_samples, require_text
from latlab.loadtest.plan import SweepPlan
from latlab.loadtest.results import RESULTS_FILE, Run
from latlab.loadtest.scrape import fetch


def run_plan(plan: SweepPlan, out: Path, run_id: str | None = None) -> Run:
    """Check the plan against the server, then sweep into out/results.json, labelled `run_id` (default: the run
    folder's name). The folder is made only once the plan is accepted: a refused run leaves none behind."""
    plan = checked_against_server(plan)
    out.mkdir(parents=True, exist_ok=True)
    run = run_sweep(plan, out / RESULTS_FILE, run_id=run_id or out.name)
    print(f"results: {out / RESULTS_FILE}")
    return run


def checked_against_server(plan: SweepPlan) -> SweepPlan:
    """--text: every deployment must take sentences; --inputs: the sample file must fit every deployment's inputs,
    and its path becomes absolute (the generator's processes may run elsewhere in the file system). One readable
    line otherwise, before any load is sent."""
    workload = plan.workload
    if workload.payload.text:
        _require_text(workload.host, workload.deployments)
    if workload.payload.inputs:
        inputs = _require_samples(workload.host, workload.deployments, Path(workload.payload.inputs))
        plan = replace(plan, workload=replace(workload, payload=replace(workload.payload, inputs=inputs)))
    return plan


def _require_text(host: str, deployments: tuple[str, ...]) -> None:
    for deployment in deployments:
        try:
            response = fetch(host, f"/v2/models/{deployment}")
            response.raise_for_status()
            require_text(response.json())
        except (requests.RequestException, ValueError) as exc:
            raise UserError(f"--text: deployment '{deployment}': {exc}") from None


def _require_samples(host: str, deployments: tuple[str, ...], path: Path) -> str:
    try:
        samples = load_samples(path)
    except ValueError as exc:
        raise UserError(f"--inputs: {exc}") from None
    for deployment in deployments:
        try:
            response = fetch(host, f"/v2/models/{deployment}")
            response.raise_for_status()
            check_samples(response.json(), samples)
        except (requests.RequestException, ValueError) as exc:
            raise UserError(f"--inputs {path}: deployment '{deployment}': {exc}") from None
    return str(path.resolve())
