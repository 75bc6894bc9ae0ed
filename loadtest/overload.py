"""The overload test: offer a multiple of a deployment's capacity for a while, then show how the
server shed the excess (fast 503s with Retry-After, a bounded queue, nothing left hanging) and how
soon it served a normal load normally again.

Phases, each a sweep step of its own: capacity (the rate served while saturated, unless given),
baseline at `recovery_load` x capacity, the burst, and the recovery at the baseline's rate in short
windows, started with the burst's backlog still queued, as it would be in production.

Pure logic over a `phase(name, load, seconds, windows=3, warmup=0.0, drain=True) -> step` callable
(the sweep supplies it), so it is tested without a server, like the SLO search.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from latlab.loadtest.search import SATURATED_BELOW

NORMAL_P99_FACTOR = 2.0  # a recovery window is normal when its p99 is within this factor of the baseline's
MAX_CAPACITY_PROBES = 5


@dataclass
class OverloadPlan:
    """How hard and how long to overload, and how the recovery is measured."""

    factor: float = 3.0
    """Offered load during the burst, as a multiple of the capacity."""
    burst_seconds: float = 60.0
    capacity_rps: float | None = None
    """The deployment's capacity; None: measured, as the rate served while saturated (from --rates[0] up)."""
    recovery_load: float = 0.6
    """Load before and after the burst, as a fraction of the capacity."""
    baseline_seconds: float = 3.0
    recovery_seconds: float = 8.0
    recovery_window_seconds: float = 0.5


def run_overload(phase: Callable[..., dict], overload: OverloadPlan, start_rate: float, probe_seconds: float,
                 info: dict, outstanding: Callable[[], int]) -> dict:
    """All the phases; returns the overload figures. `outstanding()`: requests still unanswered after the
    last phase and a drain (the ones the server left hanging)."""
    capacity = overload.capacity_rps or _measure_capacity(phase, start_rate, probe_seconds)
    base_rate = overload.recovery_load * capacity
    baseline = phase("baseline", base_rate, overload.baseline_seconds, warmup=1.0)
    burst = phase("burst", overload.factor * capacity, overload.burst_seconds, drain=False)
    windows = max(3, round(overload.recovery_seconds / overload.recovery_window_seconds))
    recovery = phase("recovery", base_rate, windows * overload.recovery_window_seconds, windows, drain=False)
    return overload_figures(capacity, overload.factor, info, baseline, burst, recovery, hanging=outstanding())


def _measure_capacity(phase: Callable[..., dict], start: float, seconds: float) -> float:
    """Raise the offered rate (doubling) until the server saturates; its capacity is what it then serves."""
    rate = start
    for _ in range(MAX_CAPACITY_PROBES):
        step = phase("capacity", rate, seconds, warmup=1.0)
        if step["achieved_rps"] < SATURATED_BELOW * step["offered_rps"]:
            return step["achieved_rps"]
        rate *= 2
    raise LookupError(f"the server did not saturate up to {rate / 2:g} req/s: give --capacity, or start "
                      "--rates higher")


def overload_figures(capacity: float, factor: float, info: dict, baseline: dict, burst: dict,
                     recovery: dict, hanging: int) -> dict:
    """What the burst did and how soon the server recovered, as one dict with a one-line summary.
    `hanging`: requests still unanswered 10 s after the load stopped."""
    by_status = burst["by_status"]
    rejected, accepted = by_status.get("503", {}), by_status.get("200", {})
    timeout_s = (info.get("batcher") or {}).get("timeout_ms", float("nan")) / 1000.0
    recovery_s, good_after = recovery_time(recovery, baseline["p99_s"])
    figures = {
        "factor": factor, "capacity_rps": capacity, "offered_rps": burst["offered_rps"],
        "achieved_rps": burst["achieved_rps"], "burst_seconds": burst["duration_s"],
        "rejected": rejected.get("count", 0), "rejected_p99_s": rejected.get("p99_s"),
        "rejected_response_p99_s": rejected.get("response_p99_s"),
        "rejected_response_max_s": rejected.get("response_max_s"),
        "rejected_without_retry_after": rejected.get("count", 0) - rejected.get("with_retry_after", 0),
        "accepted": accepted.get("count", 0), "accepted_p50_s": accepted.get("p50_s"),
        "accepted_p99_s": accepted.get("p99_s"),
        "accepted_max_s": accepted.get("max_s"), "timeout_s": timeout_s,
        "timeouts": by_status.get("504", {}).get("count", 0),
        "unanswered": by_status.get("0", {}).get("count", 0), "hanging": hanging,
        "other_statuses": {code: s["count"] for code, s in by_status.items() if code not in ("200", "503", "504", "0")},
        "queue_depth_max": burst["queue_depth_max"], "queue_capacity": burst["queue_capacity"],
        "baseline_p99_s": baseline["p99_s"],
        "recovery_s": recovery_s, "recovery_good_windows_after": good_after,
        "recovery_gap_s": recovery["start_time"] - burst["end_time"],
        "generator_bound": burst["generator_bound"], "generator_cpu_percent": burst["generator_cpu_percent"],
        "dropped": burst["dropped"], "late": burst["late"],
    }
    figures["summary"] = _summary(figures)
    return figures


def recovery_time(recovery: dict, baseline_p99_s: float) -> tuple[float | None, str]:
    """Seconds from the load's drop to the end of the first normal window (full throughput, no errors,
    nothing outstanding, p99 within NORMAL_P99_FACTOR of the baseline); None if none was. Also how
    many of the windows from then on were normal, e.g. '14/15'."""
    bound = NORMAL_P99_FACTOR * baseline_p99_s
    width = recovery["window_seconds"]
    good = [w["errors"] == 0 and w["incomplete"] == 0 and w["achieved_rps"] >= SATURATED_BELOW * w["offered_rps"]
            and w["p99_s"] is not None and w["p99_s"] <= bound for w in recovery["timeline"]]
    if True not in good:
        return None, f"0/{len(good)}"
    first = good.index(True)
    return recovery["timeline"][first]["t_s"] + width, f"{sum(good[first:])}/{len(good) - first}"


def _summary(f: dict) -> str:
    def ms(value: float | None) -> str:
        return f"{value * 1e3:.1f} ms" if value is not None and value == value else "n/a"
    queue = (f"max queue depth {f['queue_depth_max']:g} of bound {f['queue_capacity']:g}"
             if f["queue_depth_max"] is not None and f["queue_capacity"] is not None else "queue depth not exported")
    recovery = f"recovery {f['recovery_s']:.1f} s" if f["recovery_s"] is not None else "NO recovery"
    missing = f["rejected_without_retry_after"]
    retry_after = f"Retry-After missing on {missing}" if missing else "Retry-After on all"
    return (f"overload {f['factor']:g}x ({f['offered_rps']:.0f} req/s offered vs capacity {f['capacity_rps']:.0f}, "
            f"{f['burst_seconds']:.0f} s): served {f['achieved_rps']:.0f} req/s; "
            f"{f['rejected']} rejected, 503 p99 {ms(f['rejected_p99_s'])} "
            f"(response {ms(f['rejected_response_p99_s'])}), "
            f"{retry_after}; {queue}; "
            f"{f['accepted']} accepted, p99 {ms(f['accepted_p99_s'])}, max {ms(f['accepted_max_s'])} "
            f"(timeout {ms(f['timeout_s'])}, timeouts {f['timeouts']}, unanswered {f['unanswered']}, "
            f"left hanging {f['hanging']}); {recovery}"
            + (" [generator-bound]" if f["generator_bound"] else ""))
