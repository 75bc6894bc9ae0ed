"""The adaptive batcher's predictions: batch time a*n + b, the arrival rate, and when waiting pays."""

from __future__ import annotations

import math
from collections import Counter, deque
from typing import Sequence

# Recent batches the fit looks at: enough to average out noise, few enough to follow a change of load.
FIT_WINDOW = 128
# Batches recorded between two fits once a fit exists: at low load every request is a batch, and a refit
# per batch (a median per size over the window) cost more than the rest of the batcher's work for it.
REFIT_EVERY = 16
# Weight of the newest inter-arrival gap in the moving average (about the last 10 arrivals count).
ARRIVAL_ALPHA = 0.2


class LatencyModel:
    """Least-squares fit of a batch's compute time ~ a*n + b over a bounded window of recent batches.

    Each batch size is represented by the median of its recent times, so the first run at a new size
    (ONNX Runtime's slow first call) cannot drag the line. Until two sizes have been seen there is no
    fit, and the adaptive rule then sends at once (like a delay of 0). Once there is a fit it is redone
    every `refit_every` batches: the line moves slowly, and at low load each request is a batch."""

    def __init__(self, window: int = FIT_WINDOW, refit_every: int = REFIT_EVERY) -> None:
        self._batches: deque[tuple[int, float]] = deque()
        self._window = window
        self._refit_every = refit_every
        self._sizes: Counter[int] = Counter()  # batch size -> batches of that size in the window
        self._fit: tuple[float, float] | None = None
        self._recorded_since_fit = 0

    def record(self, samples: int, seconds: float) -> None:
        if len(self._batches) == self._window:
            dropped, _ = self._batches.popleft()
            self._sizes[dropped] -= 1
            if not self._sizes[dropped]:
                del self._sizes[dropped]
        self._batches.append((samples, seconds))
        self._sizes[samples] += 1
        self._recorded_since_fit += 1

    def fit(self) -> tuple[float, float] | None:
        """(a, b) in seconds per sample and seconds per batch, both >= 0; None while the window holds fewer
        than two sizes."""
        if len(self._sizes) < 2:
            self._fit = None
        elif self._fit is None or self._recorded_since_fit >= self._refit_every:
            self._fit, self._recorded_since_fit = _least_squares(self._batches), 0
        return self._fit


def _least_squares(batches: Sequence[tuple[int, float]]) -> tuple[float, float] | None:
    by_size: dict[int, list[float]] = {}
    for samples, seconds in batches:
        by_size.setdefault(samples, []).append(seconds)
    if len(by_size) < 2:
        return None
    xs = list(by_size)
    ys = [sorted(times)[len(times) // 2] for times in by_size.values()]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    a = max(slope, 0.0)
    return a, max(mean_y - a * mean_x, 0.0)


class ArrivalRate:
    """Exponentially weighted moving average of the gaps between arrivals (monotonic seconds)."""

    def __init__(self, alpha: float = ARRIVAL_ALPHA) -> None:
        self._alpha = alpha
        self.mean_gap: float | None = None
        self.last_arrival: float | None = None

    def arrived(self, at: float) -> None:
        if self.last_arrival is not None:
            gap = max(at - self.last_arrival, 0.0)
            self.mean_gap = gap if self.mean_gap is None else self.mean_gap + self._alpha * (gap - self.mean_gap)
        self.last_arrival = at

    def expected_gap(self, now: float) -> float | None:
        """Expected time to the next arrival: the average gap, or longer when none came for longer than
        that (a burst that ended must not keep the batcher waiting); None before two arrivals."""
        if self.mean_gap is None or self.last_arrival is None:
            return None
        return max(self.mean_gap, now - self.last_arrival)


def adaptive_wait(
    now: float,
    sizes: Sequence[int],
    oldest_enqueued_at: float,
    fit: tuple[float, float] | None,
    expected_gap_s: float | None,
    last_arrival_at: float,
    free_instances: int,
    max_queue_delay_s: float,
    earliest_deadline: float = math.inf,
) -> float | None:
    """When a partial batch should be sent: None for now, or the time until which waiting pays.

    Called for a batch that Triton's rule would hold (not full, no preferred size, delay not over).
    Derivation, for q queued requests of k samples in all, batch time T(n) = a*n + b and the next arrival
    expected after tau:
      send now: the queued are done at T(k). If another instance is free the newcomer runs at once
        (T(1)); otherwise it waits for this batch, then pays its own run: T(k) - tau + T(1).
      wait for it: the q queued wait tau longer and their batch takes a more; the newcomer gets T(k+1).
    With no other free instance, (latency summed over the q+1 requests when sending now) minus (when
    waiting) = b - tau - q*(tau + a): waiting saves the newcomer's fixed cost b and costs every queued
    request the extra wait. So wait only while  b > (q+1)*tau + q*a,  i.e. tau < (b - q*a)/(q+1).
    With another instance free, sending now always wins (the difference is -q*(tau + a) - a*k).
    The condition tightens as q grows, so waiting for one more arrival at a time is also the best
    multi-step plan. Low load (tau large) sends a lone request at once; under load the batch fills
    while each newcomer still saves more than it costs. The wait ends at the latest time the condition
    can still hold (last arrival + (b - q*a)/(q+1)), at the oldest request's max_queue_delay, and early
    enough that the batch's predicted run still ends before the earliest deadline.
    The rule is myopic: near saturation a saved b also shortens the wait of later requests, which it does
    not count, so there a fixed delay may batch more; it never waits where waiting is predicted to hurt."""
    if fit is None or expected_gap_s is None or free_instances > 1 or not sizes:
        return None
    a, b = fit
    queued = len(sizes)
    break_even_gap = (b - queued * a) / (queued + 1)
    if expected_gap_s >= break_even_gap:
        return None
    predicted_run = a * sum(sizes) + b
    until = min(
        last_arrival_at + break_even_gap, oldest_enqueued_at + max_queue_delay_s, earliest_deadline - predicted_run
    )
    return until if until > now else None
