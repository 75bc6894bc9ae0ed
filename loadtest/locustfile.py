"""Open-loop Locust users for an Open Inference Protocol deployment.

Works on its own:  locust -f loadtest/locustfile.py --host http://127.0.0.1:8000 \\
                          --latlab-deployment ffn --latlab-rate 200
and is what `latlab loadtest` drives step by step.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import gevent
from gevent.pool import Group
from locust import FastHttpUser, events, task

import numpy as np
import orjson

from latlab.loadtest.recorder import Recorder

BODIES_PER_USER = 32
MAX_OUTSTANDING_PER_USER = 256


@dataclass
class LoadState:
    """Shared by the users of one process: what to hit, at what total rate, and where samples go."""

    deployment: str
    rate: float
    poisson: bool = True
    recorder: Recorder = field(default_factory=Recorder)


@events.init_command_line_parser.add_listener
def _add_arguments(parser) -> None:
    parser.add_argument("--latlab-deployment", default="", help="deployment (model name) to load")
    parser.add_argument("--latlab-rate", type=float, default=10.0, help="target arrivals/s for this process")
    parser.add_argument("--latlab-constant", action="store_true", help="constant gaps instead of Poisson")


@events.init.add_listener
def _init_state(environment, **_kwargs) -> None:
    options = environment.parsed_options
    if getattr(environment, "latlab", None) is None and options is not None:
        environment.latlab = LoadState(options.latlab_deployment, options.latlab_rate,
                                       poisson=not options.latlab_constant)


def random_bodies(metadata: dict, count: int, seed: int) -> list[bytes]:
    """Valid JSON infer bodies of batch 1 with random data, from the model's metadata."""
    rng = np.random.default_rng(seed)
    bodies = []
    for _ in range(count):
        inputs = []
        for spec in metadata["inputs"]:
            shape = [1] + [d if d > 0 else 8 for d in spec["shape"][1:]]
            inputs.append({"name": spec["name"], "shape": shape, "datatype": spec["datatype"],
                           "data": _random_data(rng, spec["datatype"], shape)})
        bodies.append(orjson.dumps({"inputs": inputs}, option=orjson.OPT_SERIALIZE_NUMPY))
    return bodies


def _random_data(rng: np.random.Generator, datatype: str, shape: list[int]) -> np.ndarray:
    if datatype.startswith("FP"):
        return rng.standard_normal(shape).astype(np.float32).reshape(-1)
    if datatype == "BOOL":
        return rng.integers(0, 2, shape).astype(bool).reshape(-1)
    return rng.integers(0, 100, shape).reshape(-1)


class InferenceUser(FastHttpUser):
    """Sends requests at its share of the target rate, whether or not earlier ones have returned.

    Latency is measured from each request's intended send time (no coordinated omission); arrivals
    beyond MAX_OUTSTANDING_PER_USER are dropped and counted."""

    concurrency = MAX_OUTSTANDING_PER_USER  # connections in this user's pool
    network_timeout = 30.0
    connection_timeout = 5.0

    def on_start(self) -> None:
        self.state: LoadState = self.environment.latlab
        self.path = f"/v2/models/{self.state.deployment}/infer"
        metadata = self.client.get(f"/v2/models/{self.state.deployment}", name="metadata").json()
        self.bodies = random_bodies(metadata, BODIES_PER_USER, seed=random.randrange(2**32))
        self.inflight = Group()
        self.rng = random.Random()

    def on_stop(self) -> None:
        self.inflight.join(timeout=self.network_timeout)

    @task
    def arrivals(self) -> None:
        next_at = time.perf_counter()
        while True:
            users = max(1, self.environment.runner.user_count if self.environment.runner else 1)
            rate = max(self.state.rate / users, 1e-3)
            next_at += self.rng.expovariate(rate) if self.state.poisson else 1.0 / rate
            delay = next_at - time.perf_counter()
            if delay > 0:
                gevent.sleep(delay)
            if len(self.inflight) >= MAX_OUTSTANDING_PER_USER:
                self.state.recorder.drop(next_at)
                continue
            self.inflight.spawn(self._send, next_at)

    def _send(self, intended: float) -> None:
        recorder = self.state.recorder
        key = recorder.begin(intended, time.perf_counter())
        body = self.bodies[self.rng.randrange(len(self.bodies))]
        ok = False
        try:
            with self.client.post(self.path, data=body, headers={"Content-Type": "application/json"},
                                  name=self.state.deployment, catch_response=True) as response:
                ok = response.status_code == 200
                if not ok:
                    response.failure(f"HTTP {response.status_code}: {response.text[:200]}")
        finally:
            recorder.end(key, time.perf_counter(), ok)
