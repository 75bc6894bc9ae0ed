"""An autoscaler over a day: replicas wanted from the offered rate and a per-replica target, acted on after the
upscale and downscale delays, a new replica serving only after its cold start."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Ray Serve's documented defaults (target_ongoing_requests, upscale_delay_s, downscale_delay_s): ANCHORS.md, Fleets.
RAY_TARGET_ONGOING = 2.0
RAY_UPSCALE_DELAY_S = 30.0
RAY_DOWNSCALE_DELAY_S = 600.0
DEFAULT_COLD_START_S = 60.0
"""A replica's start to ready where the lab measured none: a machine that boots, starts `latlab serve` and
warms its model; an assumption, said so beside every plan that uses it."""
TICK_S = 10.0
"""How often the autoscaler looks at the load and decides."""


@dataclass(frozen=True)
class Autoscaler:
    """When replicas are added and removed."""

    upscale_delay_s: float = RAY_UPSCALE_DELAY_S
    """How long more replicas must be wanted, without a break, before they are started."""
    downscale_delay_s: float = RAY_DOWNSCALE_DELAY_S
    """How long fewer replicas must be wanted, without a break, before some are stopped."""
    cold_start_s: float = DEFAULT_COLD_START_S
    """From a replica's start (when it is billed) to ready (when it is sent requests)."""
    tick_s: float = TICK_S
    min_replicas: int = 1
    max_replicas: int = 10_000

    def __post_init__(self) -> None:
        if min(self.upscale_delay_s, self.downscale_delay_s, self.cold_start_s) < 0 or self.tick_s <= 0:
            raise ValueError("autoscaler delays and cold start must be >= 0 and its tick > 0")
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError("min_replicas must be in 0..max_replicas")


@dataclass(frozen=True)
class Timeline:
    """Replicas per autoscaler tick: ready (sent requests) and billed (started, ready or not)."""

    ready: np.ndarray
    billed: np.ndarray
    tick_s: float

    @property
    def machine_hours(self) -> float:
        return float(self.billed.sum() * self.tick_s / 3600)

    def ready_at(self, times_s: np.ndarray) -> np.ndarray:
        index = np.clip((np.asarray(times_s) // self.tick_s).astype(int), 0, self.ready.size - 1)
        return self.ready[index]


def wanted(rates_rps: np.ndarray, per_replica_rps: float, scaler: Autoscaler) -> np.ndarray:
    """Replicas wanted per tick so that none is offered more than per_replica_rps, within the scaler's bounds."""
    if per_replica_rps <= 0:
        return np.full(rates_rps.size, scaler.max_replicas)
    need = np.ceil(np.maximum(rates_rps, 0) / per_replica_rps - 1e-9).astype(int)
    return np.clip(need, scaler.min_replicas, scaler.max_replicas)


def scale(desired: np.ndarray, scaler: Autoscaler) -> Timeline:
    """Replicas over the ticks when the autoscaler follows `desired`: the fleet starts warm with desired[0];
    more are started once more were wanted for upscale_delay_s without a break, and serve cold_start_s later;
    fewer once fewer were wanted for downscale_delay_s, the last started stopped first (starting ones before
    ready ones)."""
    live = [-math.inf] * int(desired[0])  # each replica's ready time
    target = int(desired[0])
    above_since = below_since = None
    ready = np.empty(desired.size, dtype=int)
    billed = np.empty(desired.size, dtype=int)
    for i, want in enumerate(desired.tolist()):
        now = i * scaler.tick_s
        above_since = (now if above_since is None else above_since) if want > target else None
        below_since = (now if below_since is None else below_since) if want < target else None
        if above_since is not None and now - above_since >= scaler.upscale_delay_s:
            live += [now + scaler.cold_start_s] * (want - target)
            target, above_since = want, None
        elif below_since is not None and now - below_since >= scaler.downscale_delay_s:
            del live[want:]  # `live` is in start order: the newest go first
            target, below_since = want, None
        ready[i] = sum(1 for at in live if at <= now)
        billed[i] = len(live)
    return Timeline(ready, billed, scaler.tick_s)
