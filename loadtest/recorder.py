"""Every request's intended send time, completion time, HTTP status and outcome, and exact percentiles over a window."""

from __future__ import annotations

import itertools
import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

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
    samples: int = 0
    """Latencies behind the percentiles: completed plus still-outstanding arrivals intended in the window."""
    too_few_samples: bool = False
    """Fewer than MIN_SAMPLES_P99: the p99 is then the sample's maximum and means nothing (see below)."""
    send_lateness_p50_s: float | None = None
    """How long after its intended time the generator began to send a request (median over the window's sent
    requests): part of every latency here, since latencies count from the intended time. None: none sent."""
    send_lateness_p99_s: float | None = None
    arrival_cv: float | None = None
    """The coefficient of variation of the gaps between the window's requests as sent (actual send times, every
    process's merged): 1 for Poisson arrivals, 0 for constant gaps. None: fewer than 3 sent."""
    intended_cv: float | None = None
    """The same of the intended send times: what the schedule asked of this window (a bursty process's CV over a
    few thousand gaps strays from its nominal one by chance), so that arrival_cv / intended_cv is the generator's
    own doing."""

    def as_dict(self) -> dict:
        return asdict(self)


MIN_SAMPLES_P99 = 100
"""Below 1 / (1 - 0.99) latencies not one sample lies above the 99th percentile: the "p99" is the window's
maximum, one slow request decides it, and a step that short must never decide an SLO."""


class Recorder:
    """Keeps all samples (exact percentiles, no rounding buckets); cheap enough for minutes of load.

    Times are wall-clock seconds (`time.time()`), so samples from Locust workers in other processes
    merge into the master's recorder. A request that has not completed when a window is summarised
    counts with the time it has waited so far: a stalled server cannot hide its stall by not answering.
    Status 0 means no HTTP answer at all (connection refused or reset, client timeout)."""

    LATE_AFTER_S = 0.005  # a send starting this long after its intended time counts as late
    COMPLETED_EVERY_S = 0.25  # local completions reach `on_completed` in batches at most this old
    COLUMNS = ("intended", "sent", "done", "ok", "status", "retry_after", "error", "source")

    def __init__(self) -> None:
        self._keys = itertools.count()
        self._outstanding: dict[int, tuple[float, float]] = {}  # key -> (intended, sent)
        self._remote_outstanding: dict[str, list[float]] = {}
        self._shipped = 0
        self.intended: list[float] = []
        self.sent: list[float] = []
        self.done: list[float] = []
        self.ok: list[bool] = []
        self.status: list[int] = []
        self.retry_after: list[bool] = []
        self.error: list[str] = []  # why a request got no HTTP answer, e.g. 'ConnectionRefusedError'; else ''
        self.source: list[str] = []
        self.dropped: list[float] = []
        self.late: list[float] = []
        self._completed: tuple[list[float], list[bool]] = ([], [])  # not yet handed to on_completed
        self._completed_at = 0.0
        self._columns = self._empty_columns()
        self.on_completed: Callable[[list[float], list[bool]], None] | None = None
        self._collectors: list[Callable[[], None]] = []
        self._collecting = False

    @property
    def outstanding(self) -> int:
        """Requests still waiting for their answer (the senders' collected first)."""
        self.collect()
        return len(self._outstanding) + sum(len(v) for v in self._remote_outstanding.values())

    def outstanding_before(self, t: float) -> int:
        """Arrivals intended before t still waiting for their answer (the senders' collected first)."""
        self.collect()
        local = sum(1 for intended, _ in self._outstanding.values() if intended < t)
        return local + sum(1 for times in self._remote_outstanding.values() for i in times if i < t)

    def begin(self, intended: float, sent: float) -> int:
        if sent - intended > self.LATE_AFTER_S:
            self.late.append(intended)
        key = next(self._keys)
        self._outstanding[key] = (intended, sent)
        return key

    def end(
        self, key: int, done: float, ok: bool, status: int | None = None, retry_after: bool = False, error: str = ""
    ) -> None:
        """The answer came (or none did: status 0, `error` says why); `retry_after`: it carried that header.
        The generator's hot path: columns are appended directly, `on_completed` hears of it in batches."""
        intended, sent = self._outstanding.pop(key)
        self.intended.append(intended)
        self.sent.append(sent)
        self.done.append(done)
        self.ok.append(ok)
        self.status.append((200 if ok else 0) if status is None else status)
        self.retry_after.append(retry_after)
        self.error.append(error)
        self.source.append("local")
        if self.on_completed is not None:
            latencies, oks = self._completed
            latencies.append(done - intended)
            oks.append(ok)
            if done - self._completed_at >= self.COMPLETED_EVERY_S:
                self._hand_completed(done)

    def add_answered(
        self,
        sent: Sequence[float],
        done: Sequence[float],
        status: Sequence[int],
        retry_after: Sequence[bool],
        error: Sequence[str],
    ) -> None:
        """Requests that finished before they were begun here, each sent the moment it was meant to be (a closed
        loop's: its intended time is its send time), as columns: what `begin` then `end` of each would record."""
        ok = [code == 200 for code in status]
        self.intended.extend(sent)
        self.sent.extend(sent)
        self.done.extend(done)
        self.ok.extend(ok)
        self.status.extend(status)
        self.retry_after.extend(retry_after)
        self.error.extend(error)
        self.source.extend(itertools.repeat("local", len(ok)))
        if self.on_completed is not None and ok:
            latencies, oks = self._completed
            latencies.extend([d - s for s, d in zip(sent, done)])
            oks.extend(ok)
            if done[-1] - self._completed_at >= self.COMPLETED_EVERY_S:
                self._hand_completed(done[-1])

    def add_collector(self, collect: Callable[[], None]) -> None:
        """`collect()` hands this recorder what a sender finished and has not yet recorded (the closed loop's
        senders record in batches: loop_sender.py); it is called before anything here is counted or shipped."""
        self._collectors.append(collect)

    def remove_collector(self, collect: Callable[[], None]) -> None:
        if collect in self._collectors:
            self._collectors.remove(collect)

    def collect(self) -> None:
        """Every sender's requests finished but not yet recorded, recorded now (windows and drains call this)."""
        if self._collecting:  # a collector's recording must not set off the collectors again
            return
        self._collecting = True
        try:
            for collect in list(self._collectors):
                collect()
        finally:
            self._collecting = False

    def flush_completed(self, now: float | None = None) -> None:
        """Collect, then hand the local completions not yet reported to `on_completed` (windows and drains call
        this)."""
        self.collect()
        self._hand_completed(now)

    def _hand_completed(self, now: float | None = None) -> None:
        latencies, oks = self._completed
        self._completed_at = time.time() if now is None else now
        if latencies and self.on_completed is not None:
            self._completed = ([], [])
            self.on_completed(latencies, oks)

    def drop(self, intended: float) -> None:
        """The generator could not send this arrival (too many outstanding): counted, never skipped."""
        self.dropped.append(intended)

    def _add(self, columns: dict[str, list], source: str) -> None:
        for name, values in columns.items():
            getattr(self, name).extend(values)
        intended, done = columns["intended"], columns["done"]
        self.source.extend([source] * len(intended))
        if self.on_completed is not None and intended:
            self.on_completed([d - i for i, d in zip(intended, done)], list(columns["ok"]))

    def drain(self) -> dict:
        """What a Locust worker ships to the master: samples completed since the last drain, plus
        the arrivals still outstanding. Dropped and late arrivals are shipped once, then forgotten."""
        self.flush_completed()
        start, self._shipped = self._shipped, len(self.intended)
        payload = {name: getattr(self, name)[start:] for name in self.COLUMNS if name != "source"}
        payload.update(
            dropped=self.dropped, late=self.late, outstanding=[intended for intended, _ in self._outstanding.values()]
        )
        self.dropped, self.late = [], []
        return payload

    def absorb(self, source: str, payload: dict) -> None:
        """Merge a worker's drained samples (the master's side of `drain`)."""
        self._add({name: payload[name] for name in self.COLUMNS if name != "source"}, source)
        self.dropped.extend(payload["dropped"])
        self.late.extend(payload["late"])
        self._remote_outstanding[source] = payload["outstanding"]

    def forget_source(self, source: str) -> int:
        """A worker is gone: its requests still in flight will never report. Returns how many."""
        return len(self._remote_outstanding.pop(source, []))

    def forget_before(self, t: float) -> None:
        """Drop completed samples intended before t (earlier steps), keeping memory bounded."""
        keep = [i for i, intended in enumerate(self.intended) if intended >= t]
        self._shipped = sum(1 for i in keep if i < self._shipped)
        for name in self.COLUMNS:
            column = getattr(self, name)
            setattr(self, name, [column[i] for i in keep])
        self._columns = self._empty_columns()
        self.dropped = [d for d in self.dropped if d >= t]
        self.late = [d for d in self.late if d >= t]

    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """intended, done, ok and sent as arrays, each sample converted once: a window is summarised while the
        senders of this process wait on the same event loop, so its cost must not grow with the step's samples."""
        count, known = len(self.intended), len(self._columns[0])
        if known > count:  # forget_before shortened the lists
            self._columns, known = self._empty_columns(), 0
        if known < count:
            tail = (
                np.asarray(self.intended[known:count], dtype=float),
                np.asarray(self.done[known:count], dtype=float),
                np.asarray(self.ok[known:count], dtype=bool),
                np.asarray(self.sent[known:count], dtype=float),
            )
            self._columns = tuple(np.concatenate([have, new]) for have, new in zip(self._columns, tail))
        return self._columns

    @staticmethod
    def _empty_columns() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return (np.empty(0), np.empty(0), np.empty(0, dtype=bool), np.empty(0))

    def window(self, start: float, end: float, now: float) -> WindowStats:
        """Statistics of the arrivals intended within [start, end)."""
        return self.window_detail(start, end, now)[0]

    def window_detail(self, start: float, end: float, now: float) -> tuple[WindowStats, np.ndarray, dict]:
        """The window's statistics, its latencies (for histograms) and requests sent per source."""
        self.flush_completed()
        intended, done, ok, sent_times = self._arrays()
        mine = (intended >= start) & (intended < end)
        local = (intended for intended, _ in self._outstanding.values())
        outstanding = [*local, *itertools.chain(*self._remote_outstanding.values())]
        pending = np.asarray([t for t in outstanding if start <= t < end])
        latencies = np.concatenate([done[mine] - intended[mine], now - pending])
        sent_at = np.concatenate(
            [sent_times[mine], np.asarray([s for i, s in self._outstanding.values() if start <= i < end])]
        )
        meant = np.concatenate(
            [intended[mine], np.asarray([i for i, _ in self._outstanding.values() if start <= i < end])]
        )
        lateness = sent_at - meant
        duration = end - start
        # Achieved is the lesser of two counts. By intended send time, as offered counts: answers to requests
        # sent before the window (warm-up, an earlier step) cannot lift it above offered. By completion time:
        # what the server really got done in the window, so a backlog answered late never passes for throughput.
        by_intent = int(np.count_nonzero(ok & mine))
        completed_ok = min(by_intent, int(np.count_nonzero(ok & (done >= start) & (done < end))))
        dropped = _count_in(self.dropped, start, end)
        sent = int(np.count_nonzero(mine)) + len(pending)
        per_source: dict[str, int] = {}
        for i in np.flatnonzero(mine):
            per_source[self.source[i]] = per_source.get(self.source[i], 0) + 1
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
            samples=len(latencies),
            too_few_samples=len(latencies) < MIN_SAMPLES_P99,
            **lateness_percentiles(lateness),
            arrival_cv=gap_cv(sent_at),
            intended_cv=gap_cv(meant),
        )
        return stats, latencies, per_source

    def by_status(self, start: float, end: float) -> dict[str, dict]:
        """Answered requests intended within [start, end), per HTTP status ("0": no answer): how many,
        their latency from the intended send (p50/p99/max), their response time from the actual send
        (p50, p99, max: what the server and network took, without the generator's lateness), and how many
        carried a Retry-After header; for status 0, why (`errors`: count by kind)."""
        intended = np.asarray(self.intended)
        mine = (intended >= start) & (intended < end)
        status = np.asarray(self.status, dtype=int)[mine]
        done = np.asarray(self.done)[mine]
        latency, response = done - intended[mine], done - np.asarray(self.sent)[mine]
        retry_after = np.asarray(self.retry_after, dtype=bool)[mine]
        errors = [e for e, inside in zip(self.error, mine) if inside and e]
        result = {}
        for code in sorted(set(status.tolist())):
            of_code = status == code
            stats = percentiles(latency[of_code])
            times = response[of_code]
            result[str(code)] = {
                "count": int(np.count_nonzero(of_code)),
                "p50_s": stats["p50_s"],
                "p99_s": stats["p99_s"],
                "max_s": stats["max_s"],
                "response_p50_s": float(np.percentile(times, 50, method="inverted_cdf")),
                "response_p99_s": float(np.percentile(times, 99, method="inverted_cdf")),
                "response_max_s": float(times.max()),
                "with_retry_after": int(np.count_nonzero(retry_after[of_code])),
            }
        if errors and "0" in result:
            result["0"]["errors"] = {kind: errors.count(kind) for kind in sorted(set(errors))}
        return result


def recovery_spans(recorder: Recorder, samples: list[int], start: float, width: float, now: float) -> list[dict]:
    """For each of consecutive windows of `width` from `start` (holding `samples` requests each): `run`, the
    requests intended from its start until at least MIN_SAMPLES_P99 of them (or the last window), and `rest`,
    those from its start to the last window's end, each pooled into one WindowStats dict (the overload test's
    recovery: latlab.loadtest.overload)."""
    end = start + len(samples) * width
    spans = []
    for k in range(len(samples)):
        held, j = 0, k
        while j < len(samples) and held < MIN_SAMPLES_P99:
            held += samples[j]
            j += 1
        t = start + k * width
        spans.append(
            {
                "t_s": k * width,
                "run": recorder.window(t, start + j * width, now).as_dict(),
                "rest": recorder.window(t, end, now).as_dict(),
            }
        )
    return spans


def percentiles(latencies: np.ndarray) -> dict[str, float]:
    """Exact order statistics (nearest rank: each is a latency that was observed)."""
    if latencies.size == 0:
        return {
            "p50_s": float("nan"),
            "p90_s": float("nan"),
            "p99_s": float("nan"),
            "max_s": float("nan"),
            "mean_s": float("nan"),
        }
    p50, p90, p99 = np.percentile(latencies, [50, 90, 99], method="inverted_cdf")
    return {
        "p50_s": float(p50),
        "p90_s": float(p90),
        "p99_s": float(p99),
        "max_s": float(latencies.max()),
        "mean_s": float(latencies.mean()),
    }


def lateness_percentiles(lateness: np.ndarray) -> dict[str, float | None]:
    """Median and 99th percentile of send lateness (actual minus intended send time), None when none was sent."""
    if lateness.size == 0:
        return {"send_lateness_p50_s": None, "send_lateness_p99_s": None}
    p50, p99 = np.percentile(lateness, [50, 99], method="inverted_cdf")
    return {"send_lateness_p50_s": float(p50), "send_lateness_p99_s": float(p99)}


def gap_cv(times: np.ndarray) -> float | None:
    """The coefficient of variation of the gaps between `times` (in any order); None below 3 times."""
    if times.size < 3:
        return None
    gaps = np.diff(np.sort(times))
    return float(gaps.std() / gaps.mean()) if gaps.mean() > 0 else None


def _count_in(times: list[float], start: float, end: float) -> int:
    return sum(1 for t in times if start <= t < end)
