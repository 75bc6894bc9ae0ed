"""A day of traffic: a mean rate per minute (a diurnal swing, or a trace's minutes scaled to a peak) with bursts
of a given coefficient of variation within each minute, and the arrival times it draws."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from latlab.common.user_input import UserError
from latlab.loadtest.arrivals import load_trace

DAY_S = 86_400
INTERVAL_S = 60.0
"""The rate is set per minute: production traces are summarised per minute (loadtest.arrivals.TRACE_SWING_S)."""
PROFILE_HELP = "diurnal:PEAK:TROUGH[:CV] (req/s, bursts of gamma CV within each minute, default 1) or trace:FILE"


class TrafficError(UserError):
    """A traffic profile the plan cannot read; the message says what it expects."""


@dataclass(frozen=True)
class DayTraffic:
    """Mean arrival rate per minute of the day and the burstiness within each minute."""

    rates_rps: np.ndarray
    cv: float
    """The gaps' coefficient of variation within a minute (gamma renewal; 1 is Poisson)."""
    name: str

    @property
    def interval_s(self) -> float:
        return INTERVAL_S

    @property
    def duration_s(self) -> float:
        return self.rates_rps.size * INTERVAL_S

    @property
    def requests(self) -> float:
        """Expected requests over the profile."""
        return float(self.rates_rps.sum() * INTERVAL_S)

    def rate_at(self, times_s: np.ndarray) -> np.ndarray:
        """The minute's mean rate at each time."""
        index = np.clip((np.asarray(times_s) // INTERVAL_S).astype(int), 0, self.rates_rps.size - 1)
        return self.rates_rps[index]

    def arrivals(self, minute: int, rng: np.random.Generator) -> np.ndarray:
        """One minute's arrival times, seconds from the day's start: a gamma renewal process at the minute's rate."""
        return gamma_arrivals(float(self.rates_rps[minute]), self.cv, INTERVAL_S, rng) + minute * INTERVAL_S


def gamma_arrivals(rate: float, cv: float, length_s: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times in [0, length_s) of a gamma renewal process (gaps of mean 1/rate and the given CV), started
    at a stationary point (its first gap drawn like any other: a small bias, the same in every interval)."""
    if rate <= 0:
        return np.empty(0)
    shape = 1.0 / cv**2
    expected = rate * length_s
    times = np.cumsum(rng.gamma(shape, 1.0 / (rate * shape), int(expected + 6 * math.sqrt(expected) * cv + 16)))
    while times[-1] < length_s:  # a rare burst of long gaps: draw on
        more = np.cumsum(rng.gamma(shape, 1.0 / (rate * shape), int(expected) + 16)) + times[-1]
        times = np.concatenate([times, more])
    return times[: np.searchsorted(times, length_s)]


def parse_profile(spec: str, trace_peak_rps: float | None = None, burst_cv: float | None = None) -> DayTraffic:
    """A day of traffic from `diurnal:PEAK:TROUGH[:CV]` or `trace:FILE` (with the trace's busiest minute scaled
    to trace_peak_rps); TrafficError says what is wrong."""
    kind, _, rest = spec.strip().partition(":")
    kind = kind.lower()
    if burst_cv is not None and not 0 < burst_cv < math.inf:
        raise TrafficError(f"--burst-cv must be a positive, finite number, got {burst_cv:g}")
    if kind == "diurnal":
        return _diurnal(spec, rest, burst_cv)
    if kind == "trace":
        if not rest.strip():
            raise TrafficError(f"--traffic {spec!r}: trace:FILE needs a file")
        if trace_peak_rps is None or not 0 < trace_peak_rps < math.inf:
            raise TrafficError("--traffic trace:FILE needs --trace-rate PEAK (req/s of the trace's busiest minute)")
        return trace_day(rest.strip(), trace_peak_rps, burst_cv)
    raise TrafficError(f"--traffic {spec!r}: not one of {PROFILE_HELP}")


def _diurnal(spec: str, rest: str, burst_cv: float | None) -> DayTraffic:
    try:
        numbers = [float(x) for x in rest.split(":")]
    except ValueError:
        raise TrafficError(f"--traffic {spec!r}: not one of {PROFILE_HELP}") from None
    if len(numbers) not in (2, 3) or not all(math.isfinite(x) for x in numbers):
        raise TrafficError(f"--traffic {spec!r}: not one of {PROFILE_HELP}")
    peak, trough = numbers[:2]
    cv = numbers[2] if len(numbers) == 3 else (burst_cv or 1.0)
    if not (peak > 0 and 0 <= trough <= peak and cv > 0):
        raise TrafficError(f"--traffic {spec!r}: needs PEAK > 0, 0 <= TROUGH <= PEAK and CV > 0")
    minutes = np.arange(DAY_S // int(INTERVAL_S)) + 0.5
    swing = (1 - np.cos(2 * np.pi * minutes * INTERVAL_S / DAY_S)) / 2  # trough at midnight, peak at noon
    return DayTraffic(trough + (peak - trough) * swing, cv, f"diurnal {trough:g} to {peak:g} req/s, CV {cv:g}")


def trace_day(path: str, peak_rps: float, burst_cv: float | None = None) -> DayTraffic:
    """The trace's requests per minute, scaled so that its busiest minute is peak_rps, repeated to fill a day;
    within a minute, gaps of the trace's own within-minute CV unless burst_cv is given."""
    trace = load_trace(path)
    times = np.asarray(trace.times)
    minutes = int(times[-1] // INTERVAL_S) + 1
    counts = np.bincount((times // INTERVAL_S).astype(int), minlength=minutes).astype(float)
    if times[-1] - (minutes - 1) * INTERVAL_S < INTERVAL_S / 2 and minutes > 1:
        counts = counts[:-1]  # a last minute barely begun would read as a lull
    rates = np.resize(counts / counts.max() * peak_rps, DAY_S // int(INTERVAL_S))
    cv = burst_cv or within_minute_cv(times)
    name = f"{path.rsplit('/', 1)[-1]}, busiest minute scaled to {peak_rps:g} req/s, repeated over the day"
    return DayTraffic(rates, cv, f"{name}, CV {cv:.2f} within a minute")


def within_minute_cv(times: np.ndarray) -> float:
    """The CV of a trace's gaps, each measured against its minute's mean gap (the minute-to-minute swing left out)."""
    gaps = np.diff(times)
    minute = (times[1:] // INTERVAL_S).astype(int)
    mean_gap = np.bincount(minute, gaps) / np.maximum(np.bincount(minute), 1)
    relative = gaps / np.where(mean_gap[minute] > 0, mean_gap[minute], 1.0)
    return float(np.std(relative) / np.mean(relative)) if relative.size > 1 else 1.0
