"""How requests arrive in an open-loop step: gaps drawn from a process at the mean rate the step sets (Poisson,
constant, Gamma of a given coefficient of variation, bursts of a two-state Markov-modulated Poisson process) or a
trace replayed on its timestamps, time scaled so that its mean rate is the step's and its shape kept.

Every sending user of every process draws the same schedule (one seed, one origin) and takes every n-th arrival
of it (`share`): the fleet's arrivals are the asked process, arrival for arrival. Independent streams per sender
would not be: constant gaps or a trace would be sent once per sender, in step, and a sum of independent renewal
streams tends to Poisson as senders are added (Palm-Khintchine), so the burstiness asked for would shrink with
the number of workers.

The bursts are an MMPP of two states rather than on/off with silence between bursts: while ON arrivals come at
PEAK x the mean rate, while OFF at the rate that keeps the mean (zero only when PEAK x ON = ON + OFF), each state
lasting an exponential time of its mean. It is the textbook model of bursty traffic (Heffes and Lucantoni), its
sojourns are memoryless so a step can start anywhere in it, and within a burst the arrivals stay Poisson rather
than evenly spaced, as requests from many independent clients are."""

from __future__ import annotations

import bisect
import csv
import itertools
import math
import os
import random
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Iterator

from latlab.common.user_input import UserError
from latlab.loadtest.sizes import Sizes

TRACE_SWING_S = 60.0
"""The time scale of a trace's swings: production traces are summarised per minute (traces/README.md gives the
shared sample's per-minute counts)."""
KINDS = ("poisson", "constant", "gamma", "onoff", "trace")
SPEC_HELP = (
    "poisson, constant, gamma:CV, onoff:PEAK,ON,OFF (bursts at PEAK x the mean rate, mean ON/OFF s) or trace:FILE"
)


@dataclass(frozen=True)
class Arrivals:
    """An arrival process; the rate is the step's."""

    kind: str = "poisson"
    cv: float = 1.0
    """gamma: the gaps' coefficient of variation (1: Poisson; below 1 smoother, above burstier)."""
    peak: float = 0.0
    """onoff: the rate while ON, as a multiple of the mean rate."""
    on_s: float = 0.0
    """onoff: the mean length of a burst."""
    off_s: float = 0.0
    """onoff: the mean time between bursts."""
    trace: str = ""
    """trace: the CSV file whose first column is each request's timestamp (ISO 8601 or seconds)."""
    trace_start_s: float = 0.0
    """trace: where each step starts replaying, in seconds of the trace from its first request."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UserError(f"--arrivals {self.kind!r}: not one of {SPEC_HELP}")
        if self.kind == "gamma" and not 0 < self.cv < math.inf:
            raise UserError(f"--arrivals gamma:CV needs a positive, finite CV, got {self.cv:g}")
        if self.kind == "onoff":
            if not (self.peak > 1 and 0 < self.on_s < math.inf and 0 < self.off_s < math.inf):
                raise UserError(
                    f"--arrivals onoff:PEAK,ON,OFF needs PEAK > 1 and positive ON and OFF seconds, got {self.spec}"
                )
            if self.peak * self.on_s > self.on_s + self.off_s:
                raise UserError(
                    f"--arrivals {self.spec}: bursts at {self.peak:g}x the mean for {self.on_s:g} s of every "
                    f"{self.on_s + self.off_s:g} s would carry more than the mean rate; PEAK can be at most "
                    f"(ON + OFF) / ON = {(self.on_s + self.off_s) / self.on_s:g}"
                )
        if self.kind == "trace":
            if not self.trace:
                raise UserError("--arrivals trace:FILE needs a file")
            if not 0 <= self.trace_start_s < math.inf:
                raise UserError(f"--trace-start must be seconds >= 0, got {self.trace_start_s:g}")

    def check(self) -> Arrivals:
        """Itself, once its trace file is read and found good (every problem of the file now, before any load);
        the plan checks this where it is made, not where a worker rebuilds it from a message."""
        if self.kind == "trace":
            trace = load_trace(self.trace)
            if self.trace_start_s >= trace.duration_s:
                raise UserError(
                    f"--trace-start {self.trace_start_s:g} s is past the end of {self.trace} "
                    f"({trace.duration_s:.0f} s from its first request to its last)"
                )
        return self

    @classmethod
    def parse(cls, spec: str, trace_start_s: float = 0.0) -> Arrivals:
        """`poisson`, `constant`, `gamma:CV`, `onoff:PEAK,ON,OFF` or `trace:FILE`, as the user writes it."""
        kind, _, rest = spec.strip().partition(":")
        kind = kind.strip().lower()
        if kind in ("poisson", "constant") and not rest:
            return cls(kind)
        if kind == "trace":  # absolute: the sweep's child processes read it too
            return cls(
                "trace", trace=os.path.abspath(rest.strip()) if rest.strip() else "", trace_start_s=trace_start_s
            )
        try:
            numbers = [float(x) for x in rest.split(",")] if rest else []
        except ValueError:
            raise UserError(f"--arrivals {spec!r}: not one of {SPEC_HELP}") from None
        if kind == "gamma" and len(numbers) == 1:
            return cls("gamma", cv=numbers[0])
        if kind == "onoff" and len(numbers) == 3:
            return cls("onoff", peak=numbers[0], on_s=numbers[1], off_s=numbers[2])
        raise UserError(f"--arrivals {spec!r}: not one of {SPEC_HELP}")

    @property
    def spec(self) -> str:
        """What parse() reads back, and what results and reports call this process."""
        if self.kind == "gamma":
            return f"gamma:{self.cv:g}"
        if self.kind == "onoff":
            return f"onoff:{self.peak:g},{self.on_s:g},{self.off_s:g}"
        if self.kind == "trace":
            return f"trace:{Path(self.trace).name}" + (f"@{self.trace_start_s:g}s" if self.trace_start_s else "")
        return self.kind

    def offsets(self, rate: float, seed: int, trace: Trace | None = None) -> Iterator[float]:
        """The arrivals' times at mean `rate` (req/s), in seconds from the schedule's origin, in order, without
        end; the same for every process that draws it with the same seed (and `trace`: the trace's times, sent
        to the workers with the load, else read from the file)."""
        rng = random.Random(seed)
        if self.kind == "constant":
            return (k / rate for k in itertools.count(1))
        if self.kind == "gamma":
            shape = 1.0 / self.cv**2  # CV of a Gamma(k, theta) variable: 1 / sqrt(k)
            return itertools.accumulate(rng.gammavariate(shape, 1.0 / (rate * shape)) for _ in itertools.count())
        if self.kind == "onoff":
            return _mmpp(rng, rate * self.peak, rate * self.off_rate_share, self.on_s, self.off_s)
        if self.kind == "trace":
            return (trace or load_trace(self.trace)).replay(rate, self.trace_start_s)
        return itertools.accumulate(rng.expovariate(rate) for _ in itertools.count())

    @property
    def off_rate_share(self) -> float:
        """onoff: the rate between bursts as a multiple of the mean, so that the mean rate is the step's."""
        return (self.on_s + self.off_s - self.peak * self.on_s) / self.off_s

    @property
    def dispersion(self) -> float:
        """How many times Poisson's variance a window's count of Gamma arrivals has (the index of dispersion of a
        renewal process, CV^2): bursts make requests arrive, queue and fare together, so it takes that many times
        as many requests to hold as many independent ones. 1 for the others (their bursts: burst_cycle_s)."""
        return max(1.0, self.cv**2) if self.kind == "gamma" else 1.0

    def burst_cycle_s(self, rate: float) -> float:
        """How long one burst and the lull after it last at `rate`: an MMPP's ON + OFF seconds; a trace's swings
        are its minutes (TRACE_SWING_S), scaled to the rate. 0 for the renewal processes."""
        if self.kind == "onoff":
            return self.on_s + self.off_s
        if self.kind == "trace":
            return TRACE_SWING_S * load_trace(self.trace).mean_rate / rate
        return 0.0

    def expected_cv(self, rate: float) -> float | None:
        """The inter-arrival coefficient of variation this process asks for at `rate` (None: a trace's own)."""
        if self.kind == "trace":
            return None
        if self.kind == "onoff":  # bursts of given seconds: how many arrivals they hold depends on the rate
            return _mmpp_cv(self, rate)
        return {"poisson": 1.0, "constant": 0.0, "gamma": self.cv}[self.kind]


def parse_traffic(text: str) -> tuple[Arrivals, ...]:
    """A list of arrival processes as `--traffic` takes them, comma-separated (an onoff's own three numbers too:
    `poisson,onoff:4,1,5,gamma:3`), each checked, none twice."""
    tokens = [t.strip() for t in text.split(",") if t.strip()]
    found: list[Arrivals] = []
    while tokens:
        spec = tokens.pop(0)
        if spec.lower().startswith("onoff:"):
            spec = ",".join([spec, *tokens[:2]])
            del tokens[:2]
        arrivals = Arrivals.parse(spec).check()
        if arrivals in found:
            raise UserError(f"--traffic names {arrivals.spec} twice")
        found.append(arrivals)
    if not found:
        raise UserError("--traffic needs at least one arrival process, e.g. poisson,gamma:3")
    return tuple(found)


def share(offsets: Iterator[float], slot: int, slots: int) -> Iterator[float]:
    """The arrivals of one sender among `slots`: every slots-th of the schedule, from its `slot`-th."""
    return itertools.islice(offsets, slot, None, slots)


@dataclass(frozen=True)
class FleetSchedule:
    """One schedule for every sender of the fleet: what the driver tells each process with the load."""

    rate: float = 0.0
    """The fleet's mean rate (req/s)."""
    seed: int = 0
    origin: float = 0.0
    """Wall-clock time (time.time()) the schedule's offsets count from: the same in every process."""
    process: int = 0
    """This process's place among the `processes` that send."""
    processes: int = 1
    users: int = 1
    """Senders per process."""
    trace: Trace | None = None

    def slot(self, local: int) -> int:
        """The place of this process's `local`-th sender among all the fleet's senders."""
        return self.process * self.users + local % self.users

    def times(self, arrivals: Arrivals, local: int) -> Iterator[float]:
        """The intended send times of this process's `local`-th sender."""
        offsets = arrivals.offsets(max(self.rate, 1e-9), self.seed, self.trace)
        return (self.origin + t for t in share(offsets, self.slot(local), self.processes * self.users))

    def sizes(self, sizes: Sizes, arrivals: Arrivals, local: int) -> Iterator[int]:
        """The sizes of the requests of this process's `local`-th sender, in the order of its times(): a trace's
        column row for row with the arrivals it replays, else the sender's own draws (one stream per sender)."""
        slot = self.slot(local)
        if sizes.kind != "trace":
            return sizes.draws(self.seed * 1_000_003 + slot)
        if arrivals.kind != "trace":
            raise UserError(
                f"--dim seq={sizes.spec} takes each request's size from the replayed trace: name it with --trace"
            )
        trace = (
            self.trace if self.trace is not None and sizes.column in self.trace.columns else load_trace(arrivals.trace)
        )
        column = sizes.column_values(trace.columns, arrivals.trace)
        return sizes.draws(0, share(trace.rows(arrivals.trace_start_s), slot, self.processes * self.users), column)

    def as_message(self, arrivals: Arrivals, columns: tuple[str, ...] = ()) -> dict:
        """Its fields for a Locust message (the trace's times, and the `columns` request sizes come from, only
        where the process replays one)."""
        replays = self.trace is not None and arrivals.kind == "trace"
        return {
            "rate": self.rate,
            "seed": self.seed,
            "origin": self.origin,
            "process": self.process,
            "processes": self.processes,
            "users": self.users,
            "trace": list(self.trace.times) if replays else None,
            "columns": {c: list(self.trace.columns[c]) for c in columns if c in self.trace.columns} if replays else {},
        }

    @classmethod
    def from_message(cls, message: dict, arrivals: Arrivals) -> FleetSchedule:
        times = message.pop("trace", None)
        columns = {name: tuple(values) for name, values in message.pop("columns", {}).items()}
        trace = Trace(arrivals.trace, tuple(times), columns) if times is not None else None
        return cls(**message, trace=trace)


def _mmpp(rng: random.Random, on_rate: float, off_rate: float, on_s: float, off_s: float) -> Iterator[float]:
    """Arrival times of a two-state MMPP, starting in a state drawn from its stationary share."""
    t, on = 0.0, rng.random() < on_s / (on_s + off_s)
    state_end = rng.expovariate(1.0 / (on_s if on else off_s))
    while True:
        rate = on_rate if on else off_rate
        gap = rng.expovariate(rate) if rate > 0 else math.inf
        if t + gap < state_end:
            t += gap
            yield t
            continue
        t, on = state_end, not on  # the gap did not end in this state: memoryless, so draw again in the next
        state_end = t + rng.expovariate(1.0 / (on_s if on else off_s))


def _mmpp_cv(arrivals: Arrivals, rate: float) -> float:
    """The stationary inter-arrival CV of the two-state MMPP at mean `rate`: a gap is phase-type with the
    generator D0 = Q - diag(lambda), started in the state an arrival leaves it in, pi D1 / (pi D1 1) (Fischer and
    Meier-Hellstern, "The Markov-modulated Poisson process (MMPP) cookbook"); its moments k! a (-D0)^-k 1."""
    import numpy as np  # here: the plan, which every command imports, stays light

    lam = rate * np.array([arrivals.peak, arrivals.off_rate_share])
    q = np.array([[-1 / arrivals.on_s, 1 / arrivals.on_s], [1 / arrivals.off_s, -1 / arrivals.off_s]])
    pi = np.array([arrivals.on_s, arrivals.off_s]) / (arrivals.on_s + arrivals.off_s)
    after_arrival = pi * lam / (pi @ lam)
    inverse = np.linalg.inv(np.diag(lam) - q)
    first = after_arrival @ inverse @ np.ones(2)
    second = 2 * after_arrival @ inverse @ inverse @ np.ones(2)
    return float(math.sqrt(second - first**2) / first)


@dataclass(frozen=True)
class Trace:
    """A trace's request times, seconds from its first request, and its numeric columns by header name (NaN
    where a row has no number)."""

    path: str
    times: tuple[float, ...]
    columns: dict[str, tuple[float, ...]]

    @property
    def duration_s(self) -> float:
        return float(self.times[-1])

    @property
    def mean_rate(self) -> float:
        """Requests per second: its gaps' mean taken as the period's (n - 1 gaps over the span)."""
        return (len(self.times) - 1) / self.duration_s

    def replay(self, rate: float, start_s: float = 0.0) -> Iterator[float]:
        """Its requests from `start_s` on, time scaled so that the mean rate is `rate` (its shape kept), looping
        to its first request one mean gap after its last; seconds from the replay's start."""
        scale = self.mean_rate / rate  # scaled seconds per second of the trace
        period = self.duration_s + 1.0 / self.mean_rate
        first = bisect.bisect_left(self.times, start_s)
        for lap in itertools.count():
            for t in self.times[first if lap == 0 else 0 :]:
                yield (t - start_s + lap * period) * scale

    def rows(self, start_s: float = 0.0) -> Iterator[int]:
        """The index of each request replay() yields, in its order (a column's value of each replayed request)."""
        first = bisect.bisect_left(self.times, start_s)
        return itertools.chain(range(first, len(self.times)), itertools.cycle(range(len(self.times))))

    def per_second(self, rate: float, start_s: float, seconds: int) -> list[int]:
        """Requests in each second of a replay at `rate` from `start_s`, for `seconds` (to compare a run with)."""
        counts = [0] * seconds
        for t in itertools.takewhile(lambda t: t < seconds, self.replay(rate, start_s)):
            counts[int(t)] += 1
        return counts


@lru_cache(maxsize=8)
def _load(path: str, mtime_ns: int) -> Trace:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header = None
    if rows and _timestamp(rows[0][0] if rows[0] else "") is None:
        header, rows = rows[0], rows[1:]
    first_row = 2 if header else 1
    rows = [(n, row) for n, row in enumerate(rows, first_row) if row and any(cell.strip() for cell in row)]
    if len(rows) < 2:
        raise UserError(f"{path}: a trace needs at least 2 requests, found {len(rows)}")
    times = [0.0] * len(rows)
    for k, (n, row) in enumerate(rows):
        t = _timestamp(row[0])
        if t is None:
            raise UserError(f"{path} row {n}: cannot read the timestamp {row[0]!r} (ISO 8601 or seconds)")
        if k and t < times[k - 1]:
            raise UserError(f"{path} row {n}: its timestamp is earlier than the row before's: the trace must be sorted")
        times[k] = t
    if times[-1] == times[0]:
        raise UserError(f"{path}: every request has the same timestamp: the trace spans no time")
    columns = {}
    for j, name in enumerate(header[1:] if header else [], 1):
        values = tuple(_number(row[j] if j < len(row) else "") for _, row in rows)
        if not all(math.isnan(v) for v in values):
            columns[name.strip()] = values
    return Trace(path, tuple(t - times[0] for t in times), columns)


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def load_trace(path: str | Path) -> Trace:
    """The trace at `path`, checked: at least two requests, every timestamp readable, in order; a bad one stops
    here with one line naming its row."""
    p = Path(path)
    try:
        return _load(str(p), p.stat().st_mtime_ns)
    except OSError as e:
        raise UserError(f"cannot read the trace {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a text CSV file") from None


def _timestamp(text: str) -> float | None:
    """Seconds from a number of seconds or an ISO 8601 time (without a zone: taken as UTC); None if neither."""
    text = text.strip()
    try:
        value = float(text)
        return value if math.isfinite(value) else None
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()
