"""Admission at the door: a deployment's count of the infer requests it holds, refused past its bound before
their body is read.

The bound (common/settings.py's admitted_bound) is a full queue plus the largest batches in flight; the server's
request threads are sized from it (config.auto_threads), so that every admitted request has a thread and none waits
unseen in Granian's own queue (docs/overload.md).
"""

from __future__ import annotations

import threading
from typing import Callable

from latlab.common.settings import BatcherSettings, admitted_bound
from latlab.server.config import DeploymentConfig
from latlab.server.errors import QueueFull


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
