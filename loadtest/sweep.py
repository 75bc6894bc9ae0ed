"""Drives Locust step by step over a list of offered rates and writes the run's results file.

Import this module before anything that uses sockets or threads: Locust monkey-patches them for gevent.
"""

from __future__ import annotations

from locust.env import Environment  # first: gevent's monkey-patching must precede other imports

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import gevent
import psutil
import requests

from latlab import machine
from latlab.loadtest.locustfile import InferenceUser, LoadState
from latlab.loadtest.results import write_results
from latlab.loadtest.scrape import average_batch, scrape_batches

SATURATED_BELOW = 0.9   # achieved/offered under this: the server (or generator) cannot keep up
GENERATOR_BOUND_CPU = 90.0  # % of one core used by this process during a window


@dataclass
class SweepPlan:
    """What to load and how: rates in requests/s, each step a warm-up then a measurement window."""

    host: str
    deployments: list[str]
    rates: list[float]
    step_seconds: float = 10.0
    warmup_seconds: float = 2.0
    users: int = 1
    poisson: bool = True
    stop_at_saturation: bool = True
    max_error_ratio: float = 0.01


def run_sweep(plan: SweepPlan, out_path: Path, run_id: str,
              progress: Callable[[str], None] = print) -> dict:
    """Sweep every deployment in turn; write and return the results document."""
    doc = {"run_id": run_id, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": plan.host,
           "machine": machine.describe(), "arrivals": "poisson" if plan.poisson else "constant",
           "deployments": []}
    for deployment in plan.deployments:
        doc["deployments"].append(_sweep_deployment(plan, deployment, progress))
        write_results(out_path, doc)  # a partial run still leaves its finished deployments behind
    return doc


def _sweep_deployment(plan: SweepPlan, deployment: str, progress: Callable[[str], None]) -> dict:
    info = _describe(plan.host, deployment)
    state = LoadState(deployment, plan.rates[0], poisson=plan.poisson)
    env = Environment(user_classes=[InferenceUser], host=plan.host)
    env.latlab = state
    runner = env.create_local_runner()
    steps: list[dict] = []
    stop_reason = "all rates done"
    try:
        runner.start(plan.users, spawn_rate=plan.users)
        for rate in plan.rates:
            state.rate = rate
            step = _measure_step(plan, state, deployment)
            steps.append(step)
            progress(_progress_line(deployment, step))
            reason = _saturation(step, plan)
            if reason and plan.stop_at_saturation:
                stop_reason = f"stopped at {rate:g} req/s: {reason}"
                break
    finally:
        runner.quit()
        env.runner.greenlet.join(timeout=1)
    progress(f"{deployment}: {stop_reason}")
    return {**info, "steps": steps, "stop_reason": stop_reason}


def _measure_step(plan: SweepPlan, state: LoadState, deployment: str) -> dict:
    gevent.sleep(plan.warmup_seconds)
    process = psutil.Process()
    batches_before = scrape_batches(plan.host, deployment)
    process.cpu_percent()
    start = time.perf_counter()
    gevent.sleep(plan.step_seconds)
    end = time.perf_counter()
    cpu = process.cpu_percent()
    batches_after = scrape_batches(plan.host, deployment)
    stats = state.recorder.window(start, end, time.perf_counter())
    return {
        "target_rps": state.rate,
        **stats.as_dict(),
        "duration_s": end - start,
        "avg_batch_size": average_batch(batches_before, batches_after),
        "generator_cpu_percent": cpu,
        "generator_bound": cpu > GENERATOR_BOUND_CPU,
    }


def _saturation(step: dict, plan: SweepPlan) -> str | None:
    if step["achieved_rps"] < SATURATED_BELOW * step["offered_rps"]:
        return f"achieved {step['achieved_rps']:.0f} < 90% of offered {step['offered_rps']:.0f} req/s"
    if step["sent"] and step["errors"] / step["sent"] > plan.max_error_ratio:
        return f"{step['errors']} errors of {step['sent']} requests"
    return None


def _progress_line(deployment: str, step: dict) -> str:
    flag = "  [generator-bound]" if step["generator_bound"] else ""
    batch = f"{step['avg_batch_size']:.1f}" if step["avg_batch_size"] else "-"
    return (f"{deployment:>14}  offered {step['offered_rps']:7.0f}/s  achieved {step['achieved_rps']:7.0f}/s  "
            f"p50 {step['p50_s'] * 1e3:7.2f} ms  p99 {step['p99_s'] * 1e3:7.2f} ms  "
            f"errors {step['errors']}  batch {batch}{flag}")


def _describe(host: str, deployment: str) -> dict:
    """The deployment's settings as the server reports them, to label the curve."""
    response = requests.get(f"{host.rstrip('/')}/v2/models/{deployment}/config", timeout=10)
    if response.status_code != 200:
        raise LookupError(f"server at {host} has no deployment '{deployment}': {response.text.strip()}")
    return response.json()
