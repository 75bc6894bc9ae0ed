"""Admission at the door: how many infer requests a deployment lets into the process at once, and the request
threads that number calls for.

Granian hands each request to one of a fixed number of Python threads; a request that finds none free waits in
Granian's own queue, where no metric, no queue bound and no Retry-After sees it (docs/overload.md). So every
request a deployment admits must have a thread, with threads to spare for refusing the rest and for the other
routes: the bound below is per deployment, and `threads` must exceed their sum.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable, Iterable

from latlab.server.errors import ConfigError, QueueFull

if TYPE_CHECKING:
    from latlab.server.config import BatcherSettings, DeploymentConfig

SPARE_THREADS = 4
"""Request threads beyond the admitted requests: they refuse the excess (tens of µs each, under the GIL) and
answer the other routes on the main port. More only contend for the GIL: under a storm of refusals 16 spares
refused fewer requests per second than 4 and slowed /metrics on the observer port (docs/overload.md)."""


def admitted_bound(batcher: BatcherSettings) -> int:
    """The most infer requests a deployment holds at once: a full queue plus its largest batches in flight
    (a request carries at least one sample, so a batch of max_batch_size samples holds at most that many)."""
    return batcher.max_queue_size + batcher.instances * batcher.max_batch_size


def auto_threads(deployments: Iterable[DeploymentConfig]) -> int:
    """Request threads for every admitted request of every deployment, plus SPARE_THREADS."""
    return sum(admitted_bound(d.batcher) for d in deployments) + SPARE_THREADS


def check_threads(threads: int, deployments: Iterable[DeploymentConfig]) -> None:
    """Refuse a thread count that admitted requests could use up: the excess would then wait unseen."""
    deployments = tuple(deployments)
    admitted = sum(admitted_bound(d.batcher) for d in deployments)
    if threads <= admitted:
        parts = ", ".join(
            f"'{d.name}' {d.batcher.max_queue_size} + {d.batcher.instances} x {d.batcher.max_batch_size}"
            for d in deployments
        )
        raise ConfigError(
            f"[server]: threads = {threads} must exceed the {admitted} infer requests the deployments "
            f"admit (max_queue_size + instances x max_batch_size: {parts}), or requests past the "
            f"threads wait where nothing refuses them; leave threads unset "
            f"({admitted + SPARE_THREADS}) or lower max_queue_size"
        )


class Admission:
    """A deployment's count of admitted infer requests, from the door to their answer. `enter` refuses one
    past the bound with QueueFull (503 + Retry-After), before its body is read; `limit` None admits all."""

    __slots__ = ("limit", "_count", "_lock", "_on_refused", "_detail")

    def __init__(self, limit: int | None, on_refused: Callable[[], None] = lambda: None, detail: str = "") -> None:
        self.limit = limit
        self._count = 0
        self._lock = threading.Lock()
        self._on_refused = on_refused
        self._detail = detail

    @property
    def count(self) -> int:
        return self._count

    def enter(self) -> None:
        """Admit one request, or raise QueueFull when `limit` are already in; a request let in must `leave`."""
        with self._lock:
            if self.limit is None or self._count < self.limit:
                self._count += 1
                return
        self._on_refused()
        raise QueueFull(f"deployment is full ({self.limit} requests admitted{self._detail})")

    def leave(self) -> None:
        with self._lock:
            self._count -= 1


def admission_for(config: DeploymentConfig, bounded: bool, on_refused: Callable[[], None]) -> Admission:
    """The deployment's Admission: bounded by admitted_bound, or unbounded when admission is off."""
    return Admission(admitted_bound(config.batcher) if bounded else None, on_refused, bound_detail(config.batcher))


def bound_detail(batcher: BatcherSettings) -> str:
    """What the bound is made of, as a refusal says it."""
    return (
        f": max_queue_size {batcher.max_queue_size} waiting + {batcher.instances} x "
        f"max_batch_size {batcher.max_batch_size} in flight"
    )
