"""Locust's own request statistics (its totals, response-time histogram and failures, hence its web UI, CSV and a
worker's reports to its master) told of the generator's requests, one at a time or a batch at once.

Locust learns of a request through its `request` event: every listener is called with a dict of keyword
arguments, and its runner's listener logs the request twice, into the total and into the request's entry. For a
closed loop that sends thousands of requests a second from the machine of the server under test that is a large
share of the generator's CPU per request (docs/measurement.md, "Closed loop against wrk"). So a batch is written
into the runner's statistics directly, with the very figures Locust's listener would log, where that listener is
the event's only one; where anyone else listens too (a locustfile's own hook), the event fires per request, as
ever. Seconds become Locust's milliseconds here and nowhere else on the way in."""

from __future__ import annotations

import bisect
from typing import Sequence

import locust.stats
from locust.env import Environment
from locust.stats import RequestStats, StatsEntry

from latlab.loadtest.raw_http import Finished

LOCUST_LISTENER = "Runner.__init__.<locals>.on_request"
"""The qualified name of the `request` listener a Locust runner adds to log into its statistics."""


class RequestFailed(Exception):
    """What Locust's statistics record for a request that got no answer or not a 200."""


def failure_of(finished: Finished) -> RequestFailed | None:
    """The failure Locust records for a request a loop sender finished; None for a 200."""
    if finished.status == 200:
        return None
    return RequestFailed(f"HTTP {finished.status}" if finished.status else f"no answer: {finished.error}")


class LocustTally:
    """Tells the `environment`'s Locust statistics of the requests of one method, name (the statistics' row)
    and path."""

    def __init__(self, environment: Environment, method: str, name: str, url: str) -> None:
        self.environment = environment
        self.method = method
        self.name = name
        self.url = url

    def tell(self, seconds: float, received: int, failure: Exception | None) -> None:
        """One request: its response time, its body's length and what failed (None: nothing), through the
        `request` event as Locust's own clients tell it."""
        self.environment.events.request.fire(
            request_type=self.method,
            name=self.name,
            context={},
            response_time=seconds * 1000.0,
            response=None,
            response_length=received,
            exception=failure,
            url=self.url,
        )

    def tell_batch(self, batch: Sequence[Finished]) -> None:
        """Requests a loop sender finished: into the runner's statistics at once where only the runner listens,
        else one event each. Locust's requests per second count each at its answer's time (its event counts
        them at the event's); its failures per second count them at this call's, as its event does."""
        if not batch:
            return
        stats = self._only_listener_stats()
        if stats is None:
            for finished in batch:
                self.tell(finished.done - finished.sent, finished.received, failure_of(finished))
            return
        rows = sorted(batch, key=_done)
        done = [finished.done for finished in rows]
        milliseconds = [(finished.done - finished.sent) * 1000.0 for finished in rows]
        received = [finished.received for finished in rows]
        for entry in (stats.total, stats.entries[(self.name, self.method)]):
            log_requests(entry, done, milliseconds, received)
        for finished in rows:
            if finished.status != 200:
                stats.log_error(self.method, self.name, failure_of(finished))

    def _only_listener_stats(self) -> RequestStats | None:
        """The runner's statistics, where its own listener is the `request` event's only one; else None."""
        runner = self.environment.runner
        handlers = self.environment.events.request._handlers  # EventHook lists its listeners nowhere public
        if runner is None or len(handlers) != 1 or getattr(handlers[0], "__qualname__", "") != LOCUST_LISTENER:
            return None
        return runner.stats


def log_requests(entry: StatsEntry, done: list[float], milliseconds: list[float], received: list[int]) -> None:
    """What StatsEntry.log does for each request, `done` (ascending) its time: counts, response times (the
    histogram bucketed by Locust's `bucket_response_time`, looked up now, as a locustfile may replace it), bytes,
    requests per second and, where the entry keeps them, the per-second copies of its histogram."""
    bucket = locust.stats.bucket_response_time
    start = 0
    while start < len(done):
        second = int(done[start])
        end = bisect.bisect_left(done, second + 1, start)
        last = entry.last_request_timestamp
        if entry.use_response_times_cache and last and second > int(last):
            entry._cache_response_times(second - 1)  # as StatsEntry.log does when a new second begins
        part = milliseconds[start:end]
        entry.num_requests += end - start
        entry.num_reqs_per_sec[second] += end - start
        entry.last_request_timestamp = done[end - 1] if last is None else max(last, done[end - 1])
        for response_time in part:
            entry.total_response_time += response_time
            entry.response_times[bucket(response_time)] += 1
        low = min(part)
        entry.min_response_time = low if entry.min_response_time is None else min(entry.min_response_time, low)
        entry.max_response_time = max(entry.max_response_time, max(part))
        entry.total_content_length += sum(received[start:end])
        start = end


def _done(finished: Finished) -> float:
    return finished.done
