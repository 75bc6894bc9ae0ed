"""The lab machine's terms in the replica check: the generator floor drawn per request, the cores the server shares
with the generator, and each term at zero giving back the check without it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from latlab.report.fleetplan.lab_machine import CheckTerms, GeneratorFloor, SharedCores
from latlab.report.fleetplan.replica import ReplicaModel, simulate
from latlab.report.fleetplan.validate import VALIDATION_REQUESTS, curve_models, floor_p99_s, predicted_p99_s
from latlab.report.fleetplan.traffic import gamma_arrivals
from tests.report.report_fixtures import CPU_NAME, curve, server, step

ENV = {"name": CPU_NAME, "cpu": "SYNTHETIC CPU", "cores": 2}
MACHINE = {"hostname": "vm", "cores": 2}
FLOOR = {
    "rates": [
        {"achieved_rps": 100.0, "p50_s": 0.0005, "p99_s": 0.002, "cpu_per_request_s": 0.0004},
        {"achieved_rps": 1000.0, "p50_s": 0.0005, "p99_s": 0.004, "cpu_per_request_s": 0.0002},
    ]
}
OLD = CheckTerms(spread=True, floor="p99", shared_cores=False)
"""The check before the machine's terms: the floor's p99 added to the model's p99, the cores left out."""


def deployment(cpu_cores_at_1000: float = 0.5, floor: dict | None = FLOOR, **extra):
    """A batching-off deployment whose server used `cpu_cores_at_1000` cores at 1000 req/s (and in proportion at
    500), on a 2-core machine."""
    steps = [
        step(500, 5.0, server=server(1, 0.2, 0.3, cpu_cores_at_1000 / 2, 0.2)),
        step(1000, 9.0, server=server(1, 0.2, 0.3, cpu_cores_at_1000, 0.4)),
    ]
    return curve("mlp-b1", "cpu", 1, steps, ENV, machine=MACHINE, generator_floor=floor, **extra)


def test_the_drawn_floor_has_the_measured_median_and_p99_at_each_rate_and_interpolates_between():
    floor = GeneratorFloor.of(deployment())
    rng = np.random.default_rng(3)
    low, high = FLOOR["rates"]
    halfway = ((low["achieved_rps"] + high["achieved_rps"]) / 2, (low["p99_s"] + high["p99_s"]) / 2)
    for rate, p99 in ((low["achieved_rps"], low["p99_s"]), (high["achieved_rps"], high["p99_s"]), halfway):
        drawn = floor.draw(rate, 400_000, rng)
        assert np.percentile(drawn, 50) == pytest.approx(low["p50_s"], rel=0.02)  # the same median at both rates
        assert np.percentile(drawn, 99) == pytest.approx(p99, rel=0.03)
    assert GeneratorFloor.of(deployment(floor=None)) is None


def test_with_a_server_that_takes_no_time_the_drawn_floor_alone_is_the_p99():
    instant = ReplicaModel(1e-9, 0.0, max_batch=1)
    (low, _) = FLOOR["rates"]
    p99 = predicted_p99_s(
        instant, deployment(), low["achieved_rps"], terms=CheckTerms(floor="drawn", shared_cores=False)
    )
    assert p99 == pytest.approx(low["p99_s"], rel=0.05)


def test_the_old_check_adds_the_floors_p99_to_the_models_p99():
    model = ReplicaModel(0.0005, 0.0, max_batch=1, spread=0.5)
    found = deployment()
    base = gamma_arrivals(1.0, 1.0, VALIDATION_REQUESTS * 1.02, np.random.default_rng(0))[:VALIDATION_REQUESTS]
    alone = simulate(base / 800.0, model, 1).percentile_s(99)
    assert predicted_p99_s(model, found, 800.0, terms=OLD) == alone + floor_p99_s(found, 800.0)
    assert predicted_p99_s(model, found, 800.0, terms=dataclasses.replace(OLD, floor="none")) == alone


def test_drawn_per_request_the_floor_adds_less_than_its_p99_and_more_than_nothing():
    model = ReplicaModel(0.0005, 0.0, max_batch=1, spread=0.5)
    found = deployment()
    drawn = predicted_p99_s(model, found, 800.0, terms=dataclasses.replace(OLD, floor="drawn"))
    added = predicted_p99_s(model, found, 800.0, terms=OLD)
    alone = predicted_p99_s(model, found, 800.0, terms=dataclasses.replace(OLD, floor="none"))
    assert alone < drawn < added


def test_without_a_recorded_floor_every_way_of_adding_it_gives_the_model_alone():
    model = ReplicaModel(0.0005, 0.0, max_batch=1)
    found = deployment(floor=None)
    p99s = {
        way: predicted_p99_s(model, found, 800.0, terms=dataclasses.replace(OLD, floor=way))
        for way in "p99 none drawn".split()
    }
    assert len(set(p99s.values())) == 1


def test_shared_cores_stretch_nothing_while_they_suffice_and_by_demand_over_cores_beyond():
    # the server: 0.5 ms of CPU a request; the generator: 0.2 ms at 1000 req/s (its floor); 2 cores
    cores = SharedCores.of(deployment(cpu_cores_at_1000=0.5))
    assert cores.demand_cores(1000.0) == pytest.approx(1000.0 * (0.0005 + 0.0002))
    assert cores.stretch(1000.0) == 1.0
    busy = SharedCores(2.0, (1000.0, 4000.0), (0.0005, 0.0005), (0.0002, 0.0002))
    assert busy.stretch(2000.0) == 1.0  # 1.4 cores asked of 2
    assert busy.stretch(4000.0) == pytest.approx(4000.0 * 0.0007 / 2.0)  # 2.8 of 2: each batch 1.4 times as long


def test_a_slowed_replica_takes_longer_by_the_factor_and_its_capacity_shrinks_by_it():
    model = ReplicaModel(0.001, 0.0002, 0.0001, max_batch=8, delay_s=0.002)
    assert model.slowed(1.0) is model
    slow = model.slowed(1.5)
    assert all(slow.service_s(n) == pytest.approx(1.5 * model.service_s(n)) for n in range(1, 9))
    assert slow.capacity_rps() == pytest.approx(model.capacity_rps() / 1.5)
    assert (slow.max_batch, slow.delay_s, slow.spread) == (model.max_batch, model.delay_s, model.spread)
    with pytest.raises(ValueError):
        model.slowed(0.0)


def test_where_the_cores_suffice_the_shared_cores_term_changes_nothing():
    model = ReplicaModel(0.0005, 0.0, max_batch=1, spread=0.3)
    found = deployment(cpu_cores_at_1000=0.5)
    with_term = predicted_p99_s(model, found, 1000.0, terms=dataclasses.replace(OLD, shared_cores=True))
    assert with_term == predicted_p99_s(model, found, 1000.0, terms=OLD)


def test_where_the_cores_do_not_suffice_the_replica_is_checked_slowed_by_the_stretch():
    model = ReplicaModel(0.0004, 0.0, max_batch=1)
    found = deployment(cpu_cores_at_1000=2.2)  # 2.2 ms of server CPU a request: 2.4 cores asked at 1000 req/s
    stretch = SharedCores.of(found).stretch(1000.0)
    assert stretch == pytest.approx((0.0022 + 0.0002) * 1000.0 / 2.0)
    with_term = predicted_p99_s(model, found, 1000.0, terms=dataclasses.replace(OLD, shared_cores=True))
    assert with_term == predicted_p99_s(model.slowed(stretch), found, 1000.0, terms=OLD)
    assert with_term > predicted_p99_s(model, found, 1000.0, terms=OLD)


def test_the_generators_cpu_comes_from_the_steps_where_the_run_has_no_floor():
    found = deployment(floor=None)
    for s in found.steps:
        s.generator_cpu_percent = 100.0 * 0.0003 * s.achieved_rps  # 0.3 ms of the generator's CPU a request
    cores = SharedCores.of(found)
    assert cores.demand_cores(1000.0) == pytest.approx(1000.0 * (0.0005 + 0.0003))
    found.machine = {"hostname": "vm"}  # the machine's cores unsaid: no term
    assert SharedCores.of(found) is None


def test_the_spread_can_be_left_out_and_a_bad_floor_way_is_refused():
    lone = {"requests": 300, "p50_s": 0.001, "p99_s": 0.006}
    found = deployment(single_request=lone, saturated=True)
    (with_spread, _), *_ = curve_models(found, [], {})
    (without, _), *_ = curve_models(found, [], {}, spread=False)
    assert with_spread.spread > 0 and without.spread == 0.0
    assert dataclasses.replace(with_spread, spread=0.0) == without
    with pytest.raises(ValueError):
        CheckTerms(floor="sum")


def test_other_work_on_the_machine_takes_from_the_same_cores() -> None:
    """Steps that recorded other load (Step.other_load_cores) add it to what the server and the generator ask: at
    1000 req/s 0.7 cores of theirs and 1.6 of other work ask 2.3 of the 2 cores, so each batch takes 1.15 times as
    long; a run that recorded none is the term without it."""
    plain = deployment(cpu_cores_at_1000=0.5)
    loaded = dataclasses.replace(plain, steps=[dataclasses.replace(s, other_load_cores=1.6) for s in plain.steps])
    assert SharedCores.of(plain).stretch(1000.0) == 1.0 and SharedCores.of(plain).other_cores == (0.0, 0.0)
    busy = SharedCores.of(loaded)
    assert busy.demand_cores(1000.0) == pytest.approx(1000.0 * (0.0005 + 0.0002) + 1.6)
    assert busy.stretch(1000.0) == pytest.approx((0.7 + 1.6) / 2.0)
