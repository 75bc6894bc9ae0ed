"""The load generator's own CPU in distributed mode: each worker ships its cumulative CPU seconds with its
samples (once a second), and the master turns two readings into a percentage over exactly the span it asks
about.

Locust's heartbeat figure cannot serve: a worker measures it every 10 s (CPU_MONITOR_INTERVAL) and reports
0.0 until the first measurement, so steps of a few seconds read 0.0% or a stale average.
"""

from __future__ import annotations

import time
from typing import Iterable, Sequence

import psutil

_PROCESS = psutil.Process()


def cpu_reading() -> tuple[float, float]:
    """What a worker ships: (monotonic seconds, CPU seconds this process has used so far)."""
    times = _PROCESS.cpu_times()
    return time.monotonic(), times.user + times.system


class FleetCpu:
    """The master's side: the latest reading of each worker, and each worker's CPU % between two reads."""

    def __init__(self) -> None:
        self._latest: dict[str, tuple[float, float]] = {}
        self._marks: dict[str, tuple[float, float]] = {}

    def reported(self, worker: str, reading: Sequence[float]) -> None:
        self._latest[worker] = (float(reading[0]), float(reading[1]))

    def since_last_read(self, workers: Iterable[str]) -> dict[str, float]:
        """CPU % of each of `workers` (100 = one core) from its reading at the previous call to its latest,
        like psutil's cpu_percent(); a worker without a reading at both ends is left out."""
        shares = {}
        for worker in workers:
            now = self._latest.get(worker)
            if now is None:
                continue
            then, self._marks[worker] = self._marks.get(worker), now
            if then is not None and now[0] > then[0]:
                shares[worker] = 100.0 * (now[1] - then[1]) / (now[0] - then[0])
        return shares
