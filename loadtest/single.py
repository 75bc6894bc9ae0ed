"""One request at a time: a deployment's latency at its lowest useful load, with nothing queued beside it.

As the offered rate falls, a deployment's p99 falls towards this one, so it is the evidence behind "never meets
the SLO": a deployment whose p99 breaks the bound even here breaks it at every rate. Sent from the sweep's own
process while its open-loop arrivals are paused, through the same lean client and bodies as the load."""

from __future__ import annotations

import time

import numpy as np

from latlab.loadtest.lean_http import LeanClient, Prepared
from latlab.loadtest.payloads import request_bodies
from latlab.loadtest.plan import PayloadOptions
from latlab.loadtest.recorder import MIN_SAMPLES_P99, percentiles
from latlab.loadtest.scrape import fetch

REQUESTS = 300
"""Enough that a p99 is not the maximum (and, at p99, what a "met" needs with none over the bound at 95%)."""
BUDGET_S = 30.0
"""A deployment slower than this per 300 requests gets fewer; the result says how many it got."""


def one_at_a_time(
    host: str, deployment: str, options: PayloadOptions, requests: int = REQUESTS, budget_s: float = BUDGET_S
) -> dict:
    """Send `requests` infer requests back to back, each after the previous answer (fewer when `budget_s` runs
    out); their latency percentiles, error count and whether there were enough for a p99."""
    client = LeanClient(host)
    prepared = lone_requests(client, host, deployment, options)
    latencies, errors = [], 0
    deadline = time.monotonic() + budget_s
    try:
        client.send(prepared[0])  # a fresh connection's set-up is not the deployment's latency
        while len(latencies) < requests and time.monotonic() < deadline:
            seconds, ok = timed(client, prepared[len(latencies) % len(prepared)])
            latencies.append(seconds)
            errors += not ok
    finally:
        client.close()
    return summary(latencies, errors)


def lone_requests(client: LeanClient, host: str, deployment: str, options: PayloadOptions) -> list[Prepared]:
    """The load's own request bodies for `deployment`, prepared for `client` (its metadata read from `host`)."""
    metadata = fetch(host, f"/v2/models/{deployment}").json()
    bodies = request_bodies(metadata, seed=0, options=options)
    path = f"/v2/models/{deployment}/infer"
    return [client.prepare("POST", path, body.data, body.headers) for body in bodies]


def timed(client: LeanClient, request: Prepared) -> tuple[float, bool]:
    """One request's round trip (seconds) and whether it was answered 200."""
    began = time.perf_counter()
    try:
        ok = client.send(request).status == 200
    except OSError:
        ok = False
    return time.perf_counter() - began, ok


def summary(latencies: list[float], errors: int) -> dict:
    """The figures of one-at-a-time latencies (seconds), as a deployment's results record them: the recorder's
    exact percentiles (recorder.percentiles), so they read like every step's."""
    values = np.asarray(latencies, dtype=float)
    if not len(values):
        return {"requests": 0, "errors": errors, "p50_s": None, "p99_s": None, "max_s": None, "too_few_samples": True}
    figures = percentiles(values)
    return {
        "requests": int(len(values)),
        "errors": int(errors),
        "p50_s": figures["p50_s"],
        "p99_s": figures["p99_s"],
        "max_s": figures["max_s"],
        "too_few_samples": bool(len(values) < MIN_SAMPLES_P99),
    }
