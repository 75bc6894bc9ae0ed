"""Every request's intended send time, completion time and outcome, and exact percentiles over a window."""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Callable

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

    Times are wall-clock seconds (`time.time()`), so samples from Locust workers in other processes
    merge into the master's recorder. A request that has not completed when a window is summarised
    counts with the time it has waited so far: a stalled server cannot hide its stall by not answering."""

    LATE_AFTER_S = 0.005  # a send starting this long after its intended time counts as late

    def __init__(self) -> None:
        self._keys = itertools.count()
        self._outstanding: dict[int, float] = {}
        self._remote_outstanding: dict[str, list[float]] = {}
        self._shipped = 0
        self.intended: list[float] = []
        self.done: list[float] = []
        self.ok: list[bool] = []
        self.source: list[str] = []
        self.dropped: list[float] = []
        self.late: list[float] = []
        self.on_completed: Callable[[list[float], list[bool]], None] | None = None

    @property
    def outstanding(self) -> int:
        return len(self._outstanding) + sum(len(v) for v in self._remote_outstanding.values())

    def begin(self, intended: float, sent: float) -> int:
        if sent - intended > self.LATE_AFTER_S:
            self.late.append(intended)
        key = next(self._keys)
        self._outstanding[key] = intended
        return key

    def end(self, key: int, done: float, ok: bool) -> None:
        self._add([self._outstanding.pop(key)], [done], [ok], "local")

    def drop(self, intended: float) -> None:
        """The generator could not send this arrival (too many outstanding): counted, never skipped."""
        self.dropped.append(intended)

    def _add(self, intended: list[float], done: list[float], ok: list[bool], source: str) -> None:
        self.intended.extend(intended)
        self.done.extend(done)
        self.ok.extend(ok)
        self.source.extend([source] * len(intended))
        if self.on_completed is not None and intended:
            self.on_completed([d - i for i, d in zip(intended, done)], list(ok))

    def drain(self) -> dict:
        """What a Locust worker ships to the master: samples completed since the last drain, plus
        the arrivals still outstanding. Dropped and late arrivals are shipped once, then forgotten."""
        start, self._shipped = self._shipped, len(self.intended)
        payload = {"intended": self.intended[start:], "done": self.done[start:], "ok": self.ok[start:],
                   "dropped": self.dropped, "late": self.late, "outstanding": list(self._outstanding.values())}
        self.dropped, self.late = [], []
        return payload

    def absorb(self, source: str, payload: dict) -> None:
        """Merge a worker's drained samples (the master's side of `drain`)."""
        self._add(payload["intended"], payload["done"], payload["ok"], source)
        self.dropped.extend(payload["dropped"])
        self.late.extend(payload["late"])
        self._remote_outstanding[source] = payload["outstanding"]

    def forget_before(self, t: float) -> None:
        """Drop completed samples intended before t (earlier steps), keeping memory bounded."""
        keep = [i for i, intended in enumerate(self.intended) if intended >= t]
        self._shipped = sum(1 for i in keep if i < self._shipped)
        for name in ("intended", "done", "ok", "source"):
            column = getattr(self, name)
            setattr(self, name, [column[i] for i in keep])
        self.dropped = [d for d in self.dropped if d >= t]
        self.late = [d for d in self.late if d >= t]

    def window(self, start: float, end: float, now: float) -> WindowStats:
        """Statistics of the arrivals intended within [start, end)."""
        return self.window_detail(start, end, now)[0]

    def window_detail(self, start: float, end: float, now: float) -> tuple[WindowStats, np.ndarray, dict]:
        """The window's statistics, its latencies (for histograms) and requests sent per source."""
        intended = np.asarray(self.intended)
        done = np.asarray(self.done)
        ok = np.asarray(self.ok, dtype=bool)
        mine = (intended >= start) & (intended < end)
        outstanding = [*self._outstanding.values(), *itertools.chain(*self._remote_outstanding.values())]
        pending = np.asarray([t for t in outstanding if start <= t < end])
        latencies = np.concatenate([done[mine] - intended[mine], now - pending])
        duration = end - start
        completed_ok = int(np.count_nonzero(ok & (done >= start) & (done < end)))
        dropped = _count_in(self.dropped, start, end)
        sent = int(np.count_nonzero(mine)) + len(pending)
        per_source: dict[str, int] = {}
        for source, inside in zip(self.source, mine):
            if inside:
                per_source[source] = per_source.get(source, 0) + 1
        stats = WindowStats(
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
        return stats, latencies, per_source


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
