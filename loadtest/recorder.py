"""Every request's intended send time, completion time and outcome, and exact percentiles over a window."""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

import numpy as np


@dataclass
class WindowStats:
    """What one measurement window saw; latencies in seconds, measured from the intended send time."""

    offered_rps: float
    achieved_rps: float
    sent: int
    ok: int
    errors: int
    dropped: int
    late: int
    incomplete: int
    p50_s: float
    p90_s: float
    p99_s: float
    max_s: float
    mean_s: float

    def as_dict(self) -> dict:
        return asdict(self)


class Recorder:
    """Keeps all samples (exact percentiles, no rounding buckets); cheap enough for minutes of load.

    A request that has not completed when a window is summarised counts with the time it has waited
    so far: a stalled server cannot hide its stall by not answering."""

    LATE_AFTER_S = 0.005  # a send starting this long after its intended time counts as late

    def __init__(self) -> None:
        self._keys = itertools.count()
        self._outstanding: dict[int, float] = {}
        self.intended: list[float] = []
        self.done: list[float] = []
        self.ok: list[bool] = []
        self.dropped: list[float] = []
        self.late: list[float] = []

    @property
    def outstanding(self) -> int:
        return len(self._outstanding)

    def begin(self, intended: float, sent: float) -> int:
        if sent - intended > self.LATE_AFTER_S:
            self.late.append(intended)
        key = next(self._keys)
        self._outstanding[key] = intended
        return key

    def end(self, key: int, done: float, ok: bool) -> None:
        self.intended.append(self._outstanding.pop(key))
        self.done.append(done)
        self.ok.append(ok)

    def drop(self, intended: float) -> None:
        """The generator could not send this arrival (too many outstanding): counted, never skipped."""
        self.dropped.append(intended)

    def window(self, start: float, end: float, now: float) -> WindowStats:
        """Statistics of the arrivals intended within [start, end)."""
        intended = np.asarray(self.intended)
        done = np.asarray(self.done)
        ok = np.asarray(self.ok, dtype=bool)
        mine = (intended >= start) & (intended < end)
        pending = np.asarray([t for t in self._outstanding.values() if start <= t < end])
        latencies = np.concatenate([done[mine] - intended[mine], now - pending])
        duration = end - start
        completed_ok = int(np.count_nonzero(ok & (done >= start) & (done < end)))
        dropped = _count_in(self.dropped, start, end)
        sent = int(np.count_nonzero(mine)) + len(pending)
        return WindowStats(
            offered_rps=(sent + dropped) / duration,
            achieved_rps=completed_ok / duration,
            sent=sent,
            ok=int(np.count_nonzero(ok[mine])),
            errors=int(np.count_nonzero(~ok[mine])),
            dropped=dropped,
            late=_count_in(self.late, start, end),
            incomplete=len(pending),
            **percentiles(latencies),
        )


def percentiles(latencies: np.ndarray) -> dict[str, float]:
    """Exact order statistics (nearest rank: each is a latency that was observed)."""
    if latencies.size == 0:
        return {"p50_s": float("nan"), "p90_s": float("nan"), "p99_s": float("nan"),
                "max_s": float("nan"), "mean_s": float("nan")}
    p50, p90, p99 = np.percentile(latencies, [50, 90, 99], method="inverted_cdf")
    return {"p50_s": float(p50), "p90_s": float(p90), "p99_s": float(p99),
            "max_s": float(latencies.max()), "mean_s": float(latencies.mean())}


def _count_in(times: list[float], start: float, end: float) -> int:
    return sum(1 for t in times if start <= t < end)
