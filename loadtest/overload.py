"""The overload test: offer a multiple of a deployment's capacity for a while, then show how the
server shed the excess (fast 503s with Retry-After, a bounded queue, nothing left hanging), how much
of its capacity it still served (goodput) and how soon it served a normal load normally again.

Phases, each a sweep step of its own: capacity (the rate served while saturated, unless given),
baseline at `recovery_load` x capacity, the burst, and the recovery at the baseline's rate in short
windows, started with the burst's backlog still queued, as it would be in production.

Recovery is judged on pooled requests, never on one window's handful: the server has recovered at the
start of the first recovery window from which (a) the next MIN_SAMPLES_P99 or more requests and (b) all
requests to the end of the phase are each served normally taken together (no errors, full throughput,
p99 within NORMAL_P99_FACTOR of the baseline's). (a) keeps the backlog's slow answers from being diluted
by a long normal tail; (b) keeps a server that falls back from passing; pooling keeps one slow request in
a hundred from flipping the verdict. The phase lasts long enough to hold TAIL_REQUESTS requests after
the expected drain of the admitted backlog.

Pure logic over a `phase(name, load, seconds, windows=3, warmup=0.0, drain=True, spans=False) -> Step`
callable (the sweep supplies it; with `spans` the step carries the pooled figures above as
`recovery_spans`), so it is tested without a server, like the SLO search.
"""

from __future__ import annotations

import math
from typing import Callable

from latlab.common.settings import admitted_bound
from latlab.loadtest.plan import OverloadPlan
from latlab.loadtest.recorder import MIN_SAMPLES_P99
from latlab.loadtest.results import Step
from latlab.loadtest.search import SATURATED_BELOW

NORMAL_P99_FACTOR = 2.0  # pooled recovery requests are normal when their p99 is within this factor of the baseline's
MAX_CAPACITY_PROBES = 5
TAIL_REQUESTS = 2 * MIN_SAMPLES_P99
"""Requests the recovery phase holds after the expected drain: enough for two pooled runs to judge."""


def run_overload(
    phase: Callable[..., Step],
    overload: OverloadPlan,
    start_rate: float,
    probe_seconds: float,
    info: dict,
    outstanding: Callable[[], int],
) -> dict:
    """All the phases; returns the overload figures. `outstanding()`: requests still unanswered after the
    last phase and a drain (the ones the server left hanging)."""
    capacity = overload.capacity_rps or _measure_capacity(phase, start_rate, probe_seconds)
    base_rate = overload.recovery_load * capacity
    baseline = phase("baseline", base_rate, overload.baseline_seconds, warmup=1.0)
    burst = phase("burst", overload.factor * capacity, overload.burst_seconds, drain=False)
    drain_s = drain_seconds(info, capacity, overload.recovery_load)
    seconds = max(overload.recovery_seconds, (drain_s or 0.0) + TAIL_REQUESTS / base_rate)
    windows = max(3, math.ceil(seconds / overload.recovery_window_seconds))
    recovery = phase(
        "recovery", base_rate, windows * overload.recovery_window_seconds, windows, drain=False, spans=True
    )
    return overload_figures(
        capacity,
        overload.factor,
        info,
        baseline,
        burst,
        recovery,
        hanging=outstanding(),
        recovery_load=overload.recovery_load,
    )


def admitted_backlog(info: dict) -> int | None:
    """The most infer requests the deployment admits at once (server/batching/admission.py): max_queue_size + instances
    x max_batch_size; None when its config does not say (a server other than latlab's)."""
    batcher = info.get("batcher")
    if batcher is None or not batcher.says("max_queue_size"):
        return None
    return int(admitted_bound(batcher))


def drain_seconds(info: dict, capacity: float, recovery_load: float) -> float | None:
    """How long a full admitted backlog takes to drain at the measured capacity while the recovery load keeps
    arriving: the time the recovery is expected to take, and what tests compare it with."""
    backlog = admitted_backlog(info)
    if backlog is None or recovery_load >= 1.0:
        return None
    return backlog / ((1.0 - recovery_load) * capacity)


def _measure_capacity(phase: Callable[..., Step], start: float, seconds: float) -> float:
    """Raise the offered rate (doubling) until the server saturates; its capacity is what it then serves."""
    rate = start
    for _ in range(MAX_CAPACITY_PROBES):
        step = phase("capacity", rate, seconds, warmup=1.0)
        if step.achieved_rps < SATURATED_BELOW * step.offered_rps:
            return step.achieved_rps
        rate *= 2
    raise LookupError(f"the server did not saturate up to {rate / 2:g} req/s: give --capacity, or start --rates higher")


def overload_figures(
    capacity: float,
    factor: float,
    info: dict,
    baseline: Step,
    burst: Step,
    recovery: Step,
    hanging: int,
    recovery_load: float | None = None,
) -> dict:
    """What the burst did and how soon the server recovered, as one dict with a one-line summary.
    `hanging`: requests still unanswered 10 s after the load stopped; `recovery_load`: the recovery's rate as a
    fraction of the capacity (for the expected drain time)."""
    by_status = burst.by_status
    rejected, accepted = by_status.get("503", {}), by_status.get("200", {})
    batcher = info.get("batcher")
    timeout_s = batcher.timeout_ms / 1000.0 if batcher is not None and batcher.says("timeout_ms") else math.nan
    recovery_s, good_after = recovery_time(recovery, baseline.p99_s)
    figures = {
        "factor": factor,
        "capacity_rps": capacity,
        "offered_rps": burst.offered_rps,
        "achieved_rps": burst.achieved_rps,
        "burst_seconds": burst.duration_s,
        "rejected": rejected.get("count", 0),
        "rejected_p99_s": rejected.get("p99_s"),
        "rejected_response_p50_s": rejected.get("response_p50_s"),
        "rejected_response_p99_s": rejected.get("response_p99_s"),
        "rejected_response_max_s": rejected.get("response_max_s"),
        "rejected_without_retry_after": rejected.get("count", 0) - rejected.get("with_retry_after", 0),
        "accepted": accepted.get("count", 0),
        "accepted_p50_s": accepted.get("p50_s"),
        "accepted_p99_s": accepted.get("p99_s"),
        "accepted_max_s": accepted.get("max_s"),
        "accepted_response_max_s": accepted.get("response_max_s"),
        "timeout_s": timeout_s,
        "timeouts": by_status.get("504", {}).get("count", 0),
        "unanswered": by_status.get("0", {}).get("count", 0),
        "hanging": hanging,
        "other_statuses": {code: s["count"] for code, s in by_status.items() if code not in ("200", "503", "504", "0")},
        "queue_depth_max": burst.queue_depth_max,
        "queue_capacity": burst.queue_capacity,
        "baseline_p99_s": baseline.p99_s,
        "recovery_s": recovery_s,
        "recovery_good_windows_after": good_after,
        "recovery_gap_s": recovery.start_time - burst.end_time,
        "generator_bound": burst.generator_bound,
        "generator_cpu_percent": burst.generator_cpu_percent,
        "dropped": burst.dropped,
        "late": burst.late,
        **goodput(capacity, baseline, burst),
        "drain_s": drain_seconds(info, capacity, recovery_load) if recovery_load is not None else None,
        "recovery_window_s": recovery.window_seconds,
    }
    figures["summary"] = _summary(figures)
    return figures


def goodput(capacity: float, baseline: Step, burst: Step) -> dict:
    """What the burst still got done, as a fraction of the capacity, and where the cores went.

    `goodput_fraction`: requests answered 200 per second during the burst over the capacity, counted by the
    server (every client's, `goodput_source` "server") when it exports its request counts, else this
    generator's achieved rate ("generator"). `busy_share`: the share of the burst the model was running; below
    1 the model waited between runs (for the interpreter lock, a request's decoding): the server's cost.
    `compute_slowdown`: a run's mean time in the burst over the baseline's; above 1 the model's own threads got
    less CPU (refusals, the load generator and other clients on the same cores)."""
    server, before = burst.server or {}, baseline.server or {}
    served = server.get("ok_count")
    source = "server" if served is not None and server.get("seconds") else "generator"
    rate = served / server["seconds"] if source == "server" else burst.achieved_rps
    slowdown = (
        server["compute_s"] / before["compute_s"] if server.get("compute_s") and before.get("compute_s") else None
    )
    return {
        "goodput_rps": rate,
        "goodput_fraction": rate / capacity if capacity else None,
        "goodput_source": source,
        "busy_share": server.get("busy_share"),
        "compute_slowdown": slowdown,
        "server_cpu_cores": server.get("process_cpu_cores"),
        "refused_rps": server["rejected_count"] / server["seconds"]
        if server.get("rejected_count") is not None and server.get("seconds")
        else None,
    }


def recovery_time(recovery: Step, baseline_p99_s: float) -> tuple[float | None, str]:
    """Seconds from the load's drop to the start of the first recovery window from which on the requests were
    served normally, pooled as the module's docstring says (`recovery_spans`); None if from no window on they
    were. Also how many of the windows from then on start a normal run, e.g. '14/15'."""
    bound = NORMAL_P99_FACTOR * baseline_p99_s
    spans = recovery.recovery_spans or []
    runs = [normal(s["run"], bound) for s in spans]
    recovered = [run and normal(s["rest"], bound) for run, s in zip(runs, spans)]
    if True not in recovered:
        return None, f"0/{len(spans)}"
    first = recovered.index(True)
    return spans[first]["t_s"], f"{sum(runs[first:])}/{len(runs) - first}"


def normal(pooled: dict, bound_s: float) -> bool:
    """Pooled requests served normally: enough of them to have a p99, none failed, full throughput, p99 within
    the bound (up to 1 in 100 may be slow)."""
    return (
        pooled["samples"] >= MIN_SAMPLES_P99
        and pooled["errors"] == 0
        and pooled["p99_s"] is not None
        and pooled["p99_s"] <= bound_s
        and pooled["achieved_rps"] >= SATURATED_BELOW * pooled["offered_rps"]
    )


def _summary(f: dict) -> str:
    def ms(value: float | None) -> str:
        return f"{value * 1e3:.1f} ms" if value is not None and value == value else "n/a"

    queue = (
        f"max queue depth {f['queue_depth_max']:g} of bound {f['queue_capacity']:g}"
        if f["queue_depth_max"] is not None and f["queue_capacity"] is not None
        else "queue depth not exported"
    )
    recovery = f"recovery {f['recovery_s']:.1f} s" if f["recovery_s"] is not None else "NO recovery"
    if f["drain_s"] is not None:
        recovery += f" (full backlog drains in {f['drain_s']:.1f} s)"
    share = f"{f['goodput_fraction']:.0%}" if f["goodput_fraction"] is not None else "n/a"
    goodput_text = f"goodput {f['goodput_rps']:.0f} req/s = {share} of capacity" + (
        " (all clients, server-counted)" if f["goodput_source"] == "server" else ""
    )
    missing = f["rejected_without_retry_after"]
    retry_after = f"Retry-After missing on {missing}" if missing else "Retry-After on all"
    return (
        f"overload {f['factor']:g}x ({f['offered_rps']:.0f} req/s offered vs capacity {f['capacity_rps']:.0f}, "
        f"{f['burst_seconds']:.0f} s): served {f['achieved_rps']:.0f} req/s; {goodput_text}; "
        f"{f['rejected']} rejected, 503 p99 {ms(f['rejected_p99_s'])} "
        f"(response {ms(f['rejected_response_p99_s'])}), "
        f"{retry_after}; {queue}; "
        f"{f['accepted']} accepted, p99 {ms(f['accepted_p99_s'])}, max {ms(f['accepted_max_s'])} "
        f"(timeout {ms(f['timeout_s'])}, timeouts {f['timeouts']}, unanswered {f['unanswered']}, "
        f"left hanging {f['hanging']}); {recovery}" + (" [generator-bound]" if f["generator_bound"] else "")
    )
