"""Rebuilds a run's results from Prometheus alone, out of the series LoadGenMetrics.record_step wrote.

Percentiles come from the per-step histograms (histogram_quantile), not from the exact p50/p99 gauges:
comparing the two is how we know the histogram buckets are fine enough to trust on a dashboard.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict

from latlab.common.settings import BatcherSettings
from latlab.loadtest.results import Curve, Run, Step
from latlab.common.prometheus import query, sample_value

UNKNOWN = "from prometheus"
STEP_HISTOGRAM = "latlab_loadtest_step_latency_seconds"
STEP_END = "latlab_loadtest_step_end_timestamp_seconds"
# A step's series appear at the first scrape after record_step, which runs right after the window:
# evaluating over the few minutes after the window's end finds them even after they went stale.
STEP_MARGIN_S = 300
QUANTILES = {"p50_s": 0.5, "p90_s": 0.9, "p99_s": 0.99}


def curves_from_prometheus(url: str, run_id: str, lookback: str = "30d") -> Run:
    """The run run_id (loadtest/results.py's types), from the Prometheus at url.

    What Prometheus does not hold (machine, batcher settings, dropped requests, generator CPU) is a
    placeholder or None. lookback bounds how old the run may be (the lab keeps 30 days)."""
    ends = step_ends(url, run_id, lookback)
    if not ends:
        raise LookupError(f"Prometheus at {url} has no steps of run {run_id!r} in the last {lookback}")
    by_deployment: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for (deployment, step), end in ends.items():
        by_deployment[deployment].append((step, end))
    order = sorted(by_deployment, key=lambda name: min(end for _, end in by_deployment[name]))  # as swept
    return Run(
        run_id=run_id,
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(min(ends.values()))),
        host=UNKNOWN,
        machine={"hostname": UNKNOWN, "cpu": UNKNOWN, "cores": None, "memory_gib": None},
        arrivals=UNKNOWN,
        deployments=[_deployment(url, run_id, name, sorted(by_deployment[name])) for name in order],
    ).context()


def step_ends(url: str, run_id: str, lookback: str = "30d") -> dict[tuple[str, int], float]:
    """{(deployment, step index): unix time its window ended} for every step the run recorded."""
    result = query(url, f"last_over_time({STEP_END}{_selector(run=run_id)}[{lookback}])")
    return {(s["metric"]["deployment"], int(s["metric"]["step"])): sample_value(s) for s in result}


def _deployment(url: str, run_id: str, name: str, steps: list[tuple[int, float]]) -> Curve:
    return Curve(
        name=name,
        model=name,
        provider="?",
        batcher=BatcherSettings.partial(),  # none known
        steps=[rebuild_step(url, run_id, name, step, end) for step, end in steps],
        stop_reason="rebuilt from Prometheus",
    )


def rebuild_step(url: str, run_id: str, deployment: str, step: int, end: float) -> Step:
    """One step as sweep.py records it, read back at the step's end (+ margin for the scrape); what Prometheus
    does not hold is None (`stable`, when not exported, its default). Its `target` is the rate asked for."""
    at = min(end + STEP_MARGIN_S, time.time())
    selector = _selector(run=run_id, deployment=deployment, step=str(step))

    def last(metric: str) -> float | None:
        return _one_value(url, f"last_over_time({metric}{selector}[{STEP_MARGIN_S}s])", at)

    buckets = f"sum by (le) (last_over_time({STEP_HISTOGRAM}_bucket{selector}[{STEP_MARGIN_S}s]))"
    percentiles = {key: _one_value(url, f"histogram_quantile({q}, {buckets})", at) for key, q in QUANTILES.items()}
    count, total = last(f"{STEP_HISTOGRAM}_count"), last(f"{STEP_HISTOGRAM}_sum")
    errors, bound, stable = (
        last("latlab_loadtest_step_errors"),
        last("latlab_loadtest_step_generator_bound"),
        last("latlab_loadtest_step_stable"),
    )
    target = last("latlab_loadtest_step_target_rps")
    return Step(
        target=target,
        target_rps=target,
        offered_rps=last("latlab_loadtest_step_offered_rps"),
        achieved_rps=last("latlab_loadtest_step_achieved_rps"),
        sent=None if count is None else int(count),  # the window's histogram holds one sample per arrival sent
        ok=None,
        errors=None if errors is None else int(errors),
        dropped=None,
        late=None,
        incomplete=None,
        **percentiles,
        max_s=None,
        mean_s=total / count if count else None,
        duration_s=None,
        avg_batch_size=None,
        generator_cpu_percent=None,
        generator_bound=None if bound is None else bool(bound),
        **({} if stable is None else {"stable": bool(stable)}),
    )


def _one_value(url: str, promql: str, at: float) -> float | None:
    """The single value of a query; None when it has no series or is NaN (an empty window's quantile)."""
    result = query(url, promql, at=at)
    if not result:
        return None
    if len(result) > 1:
        raise ValueError(f"{promql!r} matched {len(result)} series, expected one: {[s['metric'] for s in result]}")
    value = sample_value(result[0])
    return value if math.isfinite(value) else None


def _selector(**labels: str) -> str:
    """A PromQL label matcher; JSON string quoting is valid PromQL string quoting."""
    return "{" + ",".join(f"{name}={json.dumps(value)}" for name, value in labels.items()) + "}"
