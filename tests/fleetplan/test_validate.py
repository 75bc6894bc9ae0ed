"""The serving work split per request and per batch: recovered from the server's CPU per request over the batch
sizes a run's deployments served, and offered as a replica model beside the bench's one c."""

from __future__ import annotations

import pytest

from latlab.common.machine import key as machine_key
from latlab.report.fleetplan.validate import SPLIT_SOURCE, curve_models, serving_splits
from latlab.report.predict import BatchTimeFit
from tests.report.report_fixtures import CPU_NAME, curve, server, step

ENV = {"name": CPU_NAME, "cpu": "SYNTHETIC CPU", "cores": 2}
PER_REQUEST_S, PER_BATCH_S = 0.0002, 0.0003


def served(name: str, batch: int, sizes: list[float], rates: list[float]):
    """A deployment whose server spends PER_REQUEST_S + PER_BATCH_S / n of CPU per request at mean batch n."""
    steps = []
    for n, rate in zip(sizes, rates):
        cores = rate * (PER_REQUEST_S + PER_BATCH_S / n)
        steps.append(step(rate, 5.0, avg_batch_size=n, server=server(1.0, 0.2, 0.3, cores, 1.0)))
    return curve(name, "cpu", batch, steps, ENV, machine=dict(ENV))


def test_the_split_is_recovered_from_the_cpu_per_request() -> None:
    curves = [served("b1", 1, [1, 1], [200, 800]), served("batch", 32, [2, 6, 12], [500, 1500, 3000])]
    ((key, (per_request, per_batch)),) = serving_splits(curves).items()
    assert key[1] == "minilm"
    assert per_request == pytest.approx(PER_REQUEST_S) and per_batch == pytest.approx(PER_BATCH_S)


def test_no_split_from_one_batch_size_or_overloaded_steps() -> None:
    assert serving_splits([served("b1", 1, [1, 1], [200, 800])]) == {}
    overloaded = served("batch", 32, [2, 12], [500, 3000])
    for s in overloaded.steps:
        s.achieved_rps = 0.5 * s.offered_rps  # steps that did not keep up say nothing of the work per request
    assert serving_splits([served("b1", 1, [1], [200]), overloaded]) == {}


def test_the_split_model_charges_the_batch_part_once_per_batch() -> None:
    deployment = served("batch", 32, [2, 6, 12], [500, 1500, 3000])
    splits = serving_splits([served("b1", 1, [1, 1], [200, 800]), deployment])
    host = machine_key(deployment.machine or {})
    bench = {"cpu": "SYNTHETIC CPU"}  # no hostname: matched by CPU model
    fits = [{"model": "minilm", "backend": "ort-cpu", "machine": bench, "fit": BatchTimeFit(0.001, 0.0001, 5, 32)}]
    found = {source: model for model, source in curve_models(deployment, fits, {host: 0.0005}, splits)}
    split = found[SPLIT_SOURCE]
    assert split.a_s == pytest.approx(0.001 + PER_BATCH_S) and split.c_s == pytest.approx(PER_REQUEST_S)
    assert split.service_s(32) < found[next(s for s in found if s != SPLIT_SOURCE)].service_s(32)
