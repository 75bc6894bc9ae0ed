"""A discrete-event model of one replica: FIFO arrivals, the server's batcher rules, k instances, batch time by size."""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from latlab.common.settings import BatcherSettings

# Arrivals the adaptive rule averages its gap over: the server's moving average weighs about the last ten.
ADAPTIVE_GAP_ARRIVALS = 10


@dataclass(frozen=True)
class ReplicaModel:
    """One replica: a batch of n samples occupies an instance for a + b·n of model run plus c·n of serving work."""

    a_s: float
    """Fixed cost of one model run, seconds."""
    b_s: float
    """Model run cost per sample, seconds."""
    c_s: float = 0.0
    """Serving work per request (HTTP, decoding, the batcher, encoding) that does not overlap the run, seconds."""
    max_batch: int = 1
    delay_s: float = 0.0
    """How long the oldest waiting request may wait for its batch to fill."""
    instances: int = 1
    queue_size: int = 256
    """Requests allowed to wait; one more is rejected at once."""
    adaptive: bool = False
    """Wait only while the server's adaptive rule predicts that waiting pays (server/batching/latency_model.py)."""
    spread: float = 0.0
    """How much a batch's time varies: each batch holds its instance for service_s(n) times a log-normal factor of
    mean 1 and this sigma, drawn per batch (0: every batch takes exactly service_s(n))."""

    def __post_init__(self) -> None:
        if not (self.a_s >= 0 and self.b_s >= 0 and self.c_s >= 0 and self.a_s + self.b_s + self.c_s > 0):
            raise ValueError("a replica's batch time needs a, b, c >= 0, not all zero")
        if self.max_batch < 1 or self.instances < 1 or self.queue_size < 1 or self.delay_s < 0:
            raise ValueError("max_batch, instances and queue_size must be >= 1 and the delay >= 0")
        if not 0 <= self.spread < 5:
            raise ValueError("a batch time's spread (log-normal sigma) must be in [0, 5)")

    @classmethod
    def of(cls, a_s: float, b_s: float, c_s: float, batcher: BatcherSettings, spread: float = 0.0) -> ReplicaModel:
        """The model of a deployment with these batcher settings."""
        return cls(
            a_s,
            b_s,
            c_s,
            int(batcher.max_batch_size),
            float(batcher.max_queue_delay_ms) / 1e3,
            int(batcher.instances),
            int(batcher.max_queue_size),
            bool(batcher.adaptive),
            spread,
        )

    def factors(self, count: int, seed: int) -> np.ndarray | None:
        """`count` draws of the batch-time factor (log-normal, mean 1, sigma `spread`); None where it does not vary."""
        if self.spread == 0:
            return None
        return np.random.default_rng(seed).lognormal(-(self.spread**2) / 2, self.spread, count)

    def slowed(self, factor: float) -> ReplicaModel:
        """The same replica with every batch taking `factor` times as long (its CPU shared with other work)."""
        if not factor > 0:
            raise ValueError("a replica is slowed by a positive factor")
        if factor == 1:
            return self
        return dataclasses.replace(self, a_s=self.a_s * factor, b_s=self.b_s * factor, c_s=self.c_s * factor)

    def service_s(self, n: int) -> float:
        """How long a batch of n requests holds an instance."""
        return self.a_s + (self.b_s + self.c_s) * n

    def capacity_rps(self) -> float:
        """Throughput with every instance busy on full batches."""
        return self.instances * self.max_batch / self.service_s(self.max_batch)


@dataclass(frozen=True)
class Served:
    """What one replica did with its arrivals: each request's latency (inf where rejected) and the batches run."""

    latency_s: np.ndarray
    batches: int

    @property
    def requests(self) -> int:
        return int(self.latency_s.size)

    @property
    def rejected(self) -> int:
        return int(np.isinf(self.latency_s).sum())

    def percentile_s(self, q: float) -> float:
        """The q-th percentile of latency, rejected requests counted as infinitely late (nan without requests)."""
        if not self.latency_s.size:
            return math.nan
        return float(np.percentile(self.latency_s, q, method="higher"))

    def attainment(self, bound_s: float) -> float:
        """The share of requests answered within bound_s (rejected ones are not)."""
        return float(np.mean(self.latency_s <= bound_s)) if self.latency_s.size else 1.0

    @property
    def mean_batch(self) -> float:
        return (self.requests - self.rejected) / self.batches if self.batches else 0.0


def simulate(arrivals_s: np.ndarray, model: ReplicaModel, seed: int = 0) -> Served:
    """Serve sorted arrival times (seconds) with one replica, FIFO; exact for the model, no wall clock involved.
    Where the model's batch time varies, its factors are drawn from `seed`, so a simulation repeats exactly."""
    times = np.asarray(arrivals_s, dtype=float)
    if times.size and np.any(np.diff(times) < 0):
        raise ValueError("arrival times must be sorted")
    factors = model.factors(times.size, seed)
    if model.max_batch == 1 and (factors is None or model.instances == 1):
        done = _unbatched(times, model, factors)
        if done is not None:
            return Served(done - times, int(times.size))
    done, batches = _batch_loop(times, model, factors)
    return Served(done - times, batches)


def _unbatched(times: np.ndarray, model: ReplicaModel, factors: np.ndarray | None) -> np.ndarray | None:
    """Completion times with batches of one, vectorised: with equal service times S and k instances, FIFO order
    hands request n the instance request n-k held, so start_n = max(t_n, start_{n-k} + S), a max-plus recursion
    solved per residue class by a running maximum; with varying times S_n (one instance only) the same recursion
    is start_n = max(t_n, start_{n-1} + S_{n-1}), solved over the cumulative sum of S. None where the queue bound
    would reject a request (the batch loop then serves them)."""
    service = model.service_s(1)
    k = model.instances
    if factors is not None:
        service = service * factors
        before = np.concatenate([[0.0], np.cumsum(service)[:-1]])  # the service of every earlier request
        start = before + np.maximum.accumulate(times - before)
    else:
        start = np.empty_like(times)
        for r in range(k):
            lane = times[r::k]
            steps = service * np.arange(lane.size)
            start[r::k] = steps + np.maximum.accumulate(lane - steps)
    waiting = np.arange(times.size) - np.minimum(np.searchsorted(start, times, side="right"), np.arange(times.size))
    if waiting.size and int(waiting.max()) >= model.queue_size:
        return None
    return start + service


def _batch_loop(times: np.ndarray, model: ReplicaModel, factors: np.ndarray | None) -> tuple[np.ndarray, int]:
    """Completion times (inf: rejected) from a loop over batches. While nothing is rejected the queue is the run of
    requests from the oldest not yet sent, so a batch follows from the earliest free instance and the arrivals
    alone: it goes when it is full, when the oldest has waited the delay, or when the instance frees, whichever is
    last of (full or delay) and (free). Where a queue would overflow, and in adaptive mode, `_queue_steps` takes
    over until the queue is empty again."""
    t = times.tolist()
    n = len(t)
    free = [0.0] * model.instances
    firsts: list[int] = []
    ends: list[int] = []
    finishes: list[float] = []
    service = [model.service_s(m) for m in range(model.max_batch + 1)]
    # each batch's factor, by its place in `finishes` (never past n - 1: every entry holds a request)
    scale = factors.tolist() if factors is not None else [1.0] * n
    size, delay, bound = model.max_batch, model.delay_s, model.queue_size
    head = 0
    while head < n:
        if not model.adaptive:
            idle = free[0]
            oldest = t[head]
            send = oldest + delay
            if head + size - 1 < n and t[head + size - 1] < send:
                send = t[head + size - 1]
            if idle > send:
                send = idle
            # the most that may wait at once: the bound, and a full batch more for an instance idle on arrival
            limit = head + bound + (size if idle <= oldest else 0) + 1
            arrived = bisect.bisect_right(t, send, head, min(limit, n))
            if arrived < limit:
                last = min(head + size, arrived)
                finish = send + service[last - head] * scale[len(finishes)]
                heapq.heapreplace(free, finish)
                firsts.append(head)
                ends.append(last)
                finishes.append(finish)
                head = last
                continue
        head = _queue_steps(t, model, free, head, (firsts, ends, finishes), service, scale)
    return _completions(n, firsts, ends, finishes), _batch_count(finishes)


def _queue_steps(
    t: list[float],
    model: ReplicaModel,
    free: list[float],
    seen: int,
    batches: tuple[list, list, list],
    service: list,
    scale: list,
) -> int:
    """Batches from a queue kept request by request (rejections leave holes in it; the adaptive rule looks at its
    length), from `seen` on, until the queue is empty again (in adaptive mode: until the arrivals end); returns the
    first request not yet arrived then."""
    firsts, ends, finishes = batches
    n = len(t)
    runs: deque[list[int]] = deque()  # admitted waiting requests as [first, end) index runs, FIFO
    waiting = 0
    fill = min(model.max_batch, model.queue_size)
    sent = False

    def admit(until: float) -> None:
        nonlocal waiting, seen
        end = bisect.bisect_right(t, until, seen)
        if end == seen:
            return
        # As the server's queue: full batches that instances idle when they arrive take at once do not count.
        room = model.queue_size - waiting + model.max_batch * sum(1 for f in free if f <= t[seen])
        keep = seen + min(end - seen, max(room, 0))  # past a full queue, arrivals are rejected (done stays inf)
        if keep > seen:
            if runs and runs[-1][1] == seen:
                runs[-1][1] = keep
            else:
                runs.append([seen, keep])
            waiting += keep - seen
        seen = end

    while True:
        if not waiting:
            if seen >= n or (sent and not model.adaptive):
                return seen
            now = max(free[0], t[seen])
        else:
            now = max(free[0], t[runs[0][0]])
        admit(now)
        if waiting < model.max_batch and model.delay_s > 0:
            now = _fill_until(t, now, runs, waiting, seen, fill, free, model)
            admit(now)
        count = min(waiting, model.max_batch)
        finish = now + service[count] * scale[len(finishes)]
        heapq.heapreplace(free, finish)
        waiting -= count
        sent = True
        while count:
            run = runs[0]
            take = min(count, run[1] - run[0])
            firsts.append(run[0])
            ends.append(run[0] + take)
            finishes.append(finish)
            run[0] += take
            count -= take
            if run[0] == run[1]:
                runs.popleft()


def _completions(n: int, firsts: list[int], ends: list[int], finishes: list[float]) -> np.ndarray:
    """Each request's completion time from the index runs the batches took (inf for the requests none took)."""
    done = np.full(n, np.inf)
    if firsts:
        lo, hi = np.asarray(firsts), np.asarray(ends)
        sizes = hi - lo
        offsets = np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        done[np.repeat(lo, sizes) + offsets] = np.repeat(np.asarray(finishes), sizes)
    return done


def _batch_count(finishes: list[float]) -> int:
    """Batches run: a batch that took requests from two runs of the queue appears twice with one finish time."""
    if not finishes:
        return 0
    values = np.asarray(finishes)
    return int(1 + np.count_nonzero(np.diff(values)))


def _fill_until(
    t: list[float], now: float, runs: deque, waiting: int, seen: int, fill: int, free: list[float], model: ReplicaModel
) -> float:
    """When a batch not yet full is sent: the oldest's delay runs out or the batch fills (Triton's rule), sooner
    where the adaptive rule predicts that waiting for one more arrival does not pay."""
    send_at = t[runs[0][0]] + model.delay_s
    if now >= send_at:
        return now
    filled = t[seen + fill - waiting - 1] if waiting < fill and seen + fill - waiting - 1 < len(t) else math.inf
    until = max(now, min(send_at, filled))
    if not model.adaptive:
        return until
    queued = waiting
    while True:
        if sum(1 for f in free if f <= now) > 1:  # another idle instance: sending now always wins
            return now
        recent = t[max(0, seen - ADAPTIVE_GAP_ARRIVALS - 1) : seen]
        if len(recent) < 2:
            return now
        gap = (recent[-1] - recent[0]) / (len(recent) - 1)
        break_even = (model.a_s - queued * model.b_s) / (queued + 1)
        if gap >= break_even:
            return now
        hold = min(recent[-1] + break_even, send_at)
        following = t[seen] if seen < len(t) else math.inf
        if hold <= now or queued >= fill:
            return now
        if following >= hold:
            return hold
        now, seen, queued = following, seen + 1, queued + 1  # one more arrived while waiting: decide again
        if queued >= model.max_batch:
            return now
