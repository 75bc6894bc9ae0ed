"""latlab.tune.search: the configuration space, the quick search against configurations of known capacity, and its
budget. The probe here returns each configuration's known rate; the real probe (a server per round) is tested end to
end in tests/e2e/test_tune.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from latlab.server.config import dumps_config, load_config
import math
import random

from latlab.tune.search import (
    Candidate,
    Space,
    brute_force,
    confirm,
    layouts_for,
    quick_search,
    share_of_best,
    space_for,
)


def held(c: Candidate) -> float:
    """A served rate under an SLO with the shape a real one has: batching pays until a batch's run and wait no
    longer fit the bound, INT8 runs rows faster, more instances of fewer threads scale better than threads."""
    per_row_ms = {"fp32": 1.0, "int8": 0.45}[c.variant] / c.threads**0.8
    batch_ms = per_row_ms * (2 + c.max_batch_size)
    capacity = c.instances * c.max_batch_size / batch_ms * 1e3
    latency_ms = 2 * batch_ms + c.max_queue_delay_ms
    return capacity * min(1.0, 20 / latency_ms) * (1.03 if c.adaptive else 1.0)


class Clock:
    """Probes cost `per_probe` seconds each on this clock: the budget is checked without sleeping."""

    def __init__(self, per_probe: float, per_round: float = 0.0) -> None:
        self.now, self.per_probe, self.per_round, self.probes = 0.0, per_probe, per_round, 0

    def __call__(self) -> float:
        return self.now

    def probe(self, candidates: list[Candidate]) -> list[float]:
        self.now += self.per_round + self.per_probe * len(candidates)
        self.probes += len(candidates)
        return [held(c) for c in candidates]


def test_settings_that_change_nothing_take_one_value():
    space = space_for("cpu", 2, ("fp32", "int8"))
    everything = space.all()
    assert len(everything) == len(set(everything))
    for c in everything:
        if c.max_batch_size == 1:
            assert c.max_queue_delay_ms == 0 and not c.adaptive
        if c.max_queue_delay_ms == 0:
            assert not c.adaptive
    # per variant and core split: batch 1, and per larger size a wait of 0 (no adaptive) or one of 3 waits x adaptive
    per_layout = 1 + (len(space.batch_sizes) - 1) * (1 + (len(space.delays_ms) - 1) * 2)
    assert len(everything) == 2 * len(layouts_for(2)) * per_layout
    assert layouts_for(4) == ((1, 4), (2, 2), (4, 1)) and layouts_for(1) == ((1, 1),)


def test_a_neighbour_changes_one_setting_one_notch_or_one_choice():
    space = space_for("cpu", 4, ("fp32", "int8"))
    c = Candidate("fp32", 16, 2.0, True, 1, 4)
    found = space.neighbours(c)
    assert c not in found
    assert replace(c, max_batch_size=8) in found and replace(c, max_batch_size=32) in found
    assert replace(c, max_batch_size=64) not in found  # two notches away
    assert replace(c, instances=4, threads=1) in found  # any other core split
    assert replace(c, variant="int8") in found and replace(c, adaptive=False) in found
    for n in found:
        changed = [
            k for k in ("variant", "max_batch_size", "max_queue_delay_ms", "adaptive") if getattr(n, k) != getattr(c, k)
        ]
        split = (n.instances, n.threads) != (c.instances, c.threads)
        assert len(changed) + split == 1 or (
            changed == ["max_queue_delay_ms", "adaptive"] and n.max_queue_delay_ms == 0
        )


@pytest.mark.parametrize("variants", [("fp32",), ("fp32", "int8")])
def test_the_quick_search_finds_nearly_the_best_of_a_third_of_the_space(variants):
    space = space_for("cpu", 2, variants)
    clock = Clock(per_probe=10.0)
    quick = quick_search(space, clock.probe, budget_s=float("inf"), clock=clock)
    full = brute_force(space, lambda candidates: [held(c) for c in candidates])
    assert len(full.tried) == len(space.all())
    assert full.best()[0].rate == max(held(c) for c in space.all())  # brute force ranks by the known rates
    assert share_of_best(quick, full) >= 0.9
    assert len(quick.tried) <= len(space.all()) / 3, (len(quick.tried), len(space.all()))
    assert quick.stopped.startswith("a top")
    assert quick.best()[0].rate == max(t.rate for t in quick.tried)


def test_the_best_is_the_cheaper_of_equal_rates():
    space = Space(batch_sizes=(1, 8), delays_ms=(0.0, 2.0), layouts=((1, 2), (2, 1)))
    flat = quick_search(space, lambda candidates: [100.0] * len(candidates), budget_s=1e9)
    best = flat.best()[0].candidate
    assert best.max_batch_size == 1 and best.instances * best.threads == 2


def test_the_budget_is_held_and_said():
    space = space_for("cpu", 2, ("fp32", "int8"))
    clock = Clock(per_probe=10.0)
    log = quick_search(space, clock.probe, budget_s=55.0, clock=clock)
    assert clock.now <= 55.0 and clock.probes == len(log.tried) == 5  # the start, then 4 of its neighbours
    assert log.stopped.startswith("the budget (55 s)")
    assert log.best()[0].rate == max(held(t.candidate) for t in log.tried)
    clock = Clock(per_probe=10.0)
    tiny = quick_search(space, clock.probe, budget_s=1.0, clock=clock)
    assert len(tiny.tried) == 1  # the start is always measured: a search that measured nothing says nothing


def test_a_configuration_is_a_deployment_the_server_reads(tmp_path, tiny_model):
    c = Candidate("fp32", 16, 2.0, True, 2, 1)
    path = tmp_path / "serving.toml"
    path.write_text(dumps_config({"deployments": [c.deployment("m-cpu", tiny_model, "cpu", {"model": "m"})]}))
    (deployment,) = load_config(path).deployments
    assert (deployment.name, deployment.provider, deployment.model_path) == ("m-cpu", "cpu", tiny_model)
    batcher = deployment.batcher
    assert (batcher.max_batch_size, batcher.max_queue_delay_ms, batcher.adaptive, batcher.instances) == (
        16,
        2.0,
        True,
        2,
    )
    assert deployment.cpu.intra_op_threads == 1 and not deployment.cpu.allow_spinning


def test_a_search_can_start_at_a_configs_settings():
    space = space_for("cpu", 2, ("fp32",)).starting_at(Candidate("fp32", 24, 1.0, True, 1, 2))
    assert space.start() == Candidate("fp32", 24, 1.0, True, 1, 2)
    assert 24 in space.batch_sizes and space.batch_sizes == tuple(sorted(space.batch_sizes))
    assert 1.0 in space.delays_ms
    found = space.neighbours(space.start())
    assert replace(space.start(), max_batch_size=16) in found and replace(space.start(), max_batch_size=32) in found
    clock = Clock(per_probe=10.0)
    log = quick_search(space, clock.probe, budget_s=float("inf"), clock=clock)
    assert log.tried[0].candidate == space.start() and log.tried[0].round == 0


def test_a_configuration_keeps_the_settings_it_does_not_search(tmp_path, tiny_model):
    base = {"name": "mine", "model": "m", "batcher": {"max_queue_size": 100, "timeout_ms": 500.0}}
    entry = Candidate("fp32", 8, 0.5, False, 1, 1).deployment("m-tune-0", tiny_model, "cpu", base)
    assert entry["name"] == "m-tune-0" and entry["batcher"]["max_queue_size"] == 100
    assert entry["batcher"]["max_batch_size"] == 8 and entry["cpu"]["intra_op_threads"] == 1
    assert base["batcher"] == {"max_queue_size": 100, "timeout_ms": 500.0}  # the base is not changed


def noisy(seed: int, spread: float, resolution: float):
    """A probe as a shared machine gives it: each configuration's known rate times a factor drawn in
    [1 - spread, 1 + spread], then rounded down to the SLO search's resolution (it reports the highest rate met,
    the bracket below the true one)."""
    draw = random.Random(seed)

    def probe(candidates: list[Candidate]) -> list[float]:
        rates = []
        for c in candidates:
            rate = held(c) * draw.uniform(1 - spread, 1 + spread)
            rates.append((1 + resolution) ** math.floor(math.log(rate, 1 + resolution)))
        return rates

    return probe


def test_the_finalists_measured_side_by_side_decide_the_best():
    space = space_for("cpu", 2, ("fp32", "int8"))
    everything = sorted(space.all(), key=held, reverse=True)
    truly_best, second = everything[0], everything[1]
    log = brute_force(space, lambda cs: [held(c) * (1.3 if c == second else 1.0) for c in cs])
    assert log.best()[0].candidate == second  # a lucky screening probe ranks the second first
    probed: list[list[Candidate]] = []

    def fine(candidates: list[Candidate]) -> list[float]:
        probed.append(list(candidates))
        return [held(c) for c in candidates]

    confirm(log, fine, finalists=3, rounds=2)
    assert probed[0] == probed[1][::-1] and len(probed[0]) == 3  # the best three, twice, in alternating order
    assert log.best()[0].candidate == truly_best and log.best()[0].confirmed == pytest.approx(held(truly_best))
    assert log.rate_of(truly_best) == pytest.approx(held(truly_best))
    assert "measured again side by side 2 times" in log.stopped
    assert [t.confirmed is not None for t in log.best(4)] == [True, True, True, False]


def test_the_finalists_round_the_budget_cannot_pay_for_is_not_started():
    space = space_for("cpu", 2, ("fp32",))
    log = brute_force(space, lambda cs: [held(c) for c in cs])
    clock = Clock(per_probe=10.0)
    confirm(log, clock.probe, budget_s=50.0, finalists=3, rounds=3, clock=clock, probe_cost_s=10.0)
    assert clock.probes == 3 and clock.now <= 50.0  # a second round would pass 50 s
    assert "side by side 1 time" in log.stopped
    short = brute_force(space, lambda cs: [held(c) for c in cs])
    clock = Clock(per_probe=10.0)
    confirm(short, clock.probe, budget_s=20.0, finalists=3, clock=clock, probe_cost_s=10.0)
    assert clock.probes == 0 and not short.confirmed and "left no time" in short.stopped


def test_the_finalists_first_round_is_owed_when_the_climb_ran_long():
    """The climb kept the finalists' share, but its last round ran slower than its estimate and ate into it: the
    first round side by side still runs (and only the first), and the log says by how much it went over."""
    space = space_for("cpu", 2, ("fp32",))
    log = brute_force(space, lambda cs: [held(c) for c in cs])
    clock = Clock(per_probe=10.0)
    confirm(log, clock.probe, budget_s=20.0, finalists=3, rounds=3, clock=clock, probe_cost_s=10.0, first_owed=True)
    assert clock.probes == 3 and len(log.confirmed) == 3
    assert "side by side 1 time (over the budget by 10 s" in log.stopped


def test_the_climb_keeps_the_finalists_share_of_the_budget():
    space = space_for("cpu", 2, ("fp32", "int8"))
    clock = Clock(per_probe=10.0)
    log = quick_search(space, clock.probe, budget_s=85.0, clock=clock, reserve_probes=3)
    assert clock.now <= 85.0 - 30.0 and len(log.tried) == 5  # 5 probes, and 3 left for the finalists
    assert log.stopped.startswith("the budget")


def test_a_server_start_per_round_is_paid_for_in_the_finalists_share():
    """Each round starts a server: the start alone costs 40 s here, a configuration 10 s more; the budget is held
    at every size, a round the budget cannot pay for beside the finalists' share is not started, and where the
    climb found two or more configurations to choose from, their round side by side is paid for."""
    for budget in range(100, 1000, 25):
        space = space_for("cpu", 2, ("fp32", "int8"))
        clock = Clock(per_probe=10.0, per_round=30.0)
        log = quick_search(space, clock.probe, budget_s=budget, clock=clock, reserve_probes=5)
        assert log.probe_cost_s >= 40.0  # the first round: the start alone, with its server
        confirm(log, clock.probe, budget - clock.now, finalists=3, clock=clock, probe_cost_s=log.probe_cost_s * 1.5)
        assert clock.now <= budget, budget
        assert len(log.tried) == 1 or log.confirmed, budget


def test_with_noisy_probes_the_quick_search_and_its_finalists_find_nearly_the_best():
    """Screening probes off by up to 20% and rounded down to 20% brackets, the finalists' to 5% with 5% noise, on
    the space the lab's CPU deployment has on 2 cores (one core: variant and batching), in 100 seeded draws: the
    configuration chosen holds >= 90% of the best rate of the space (judged by the known rates) in at least 95,
    never below 85%, each from under a third of the space. Without the finalists' stage 14 of 100 fall below 90%
    (docs/tuning.md)."""
    space = space_for("cpu", 1, ("fp32", "int8"))
    best = max(held(c) for c in space.all())
    shares = []
    for seed in range(100):
        quick = quick_search(space, noisy(seed, 0.2, 0.2), budget_s=float("inf"))
        confirm(quick, noisy(seed + 100, 0.05, 0.05))
        shares.append(held(quick.best()[0].candidate) / best)
        assert len(quick.configurations()) <= len(space.all()) / 3
    assert sum(s >= 0.9 for s in shares) >= 95 and min(shares) >= 0.85, sorted(shares)[:10]


def test_a_configs_batch_buckets_give_way_to_the_searched_batch_size(tmp_path, tiny_model):
    """A config's buckets end at its own max_batch_size; a candidate of another size takes the server's default
    buckets for its size (on CUDA with graphs too), so every configuration the search serves loads."""
    base = {"name": "mine", "batcher": {"max_batch_size": 24, "batch_buckets": [1, 8, 24], "max_queue_size": 50}}
    for provider, c in (("cpu", Candidate("fp32", 16, 2.0)), ("cuda", Candidate("fp32", 32, 2.0, cuda_graphs=True))):
        path = tmp_path / f"{provider}.toml"
        path.write_text(dumps_config({"deployments": [c.deployment("m", tiny_model, provider, base)]}))
        (deployment,) = load_config(path).deployments
        buckets = deployment.batcher.batch_buckets  # none on the CPU by default
        assert (not buckets or buckets[-1] == c.max_batch_size) and deployment.batcher.max_queue_size == 50


def test_variants_first_measures_the_start_in_every_variant_then_climbs_from_the_best():
    """The lab's first question, side by side in the first round: the plan's batching in INT8 and in FP32. Here
    INT8 (the start) holds more; with FP32 first the climb moves to INT8 at once."""
    space = space_for("cpu", 1, ("fp32", "int8")).starting_at(Candidate("fp32", 32, 3.0))
    clock = Clock(per_probe=10.0)
    log = quick_search(space, clock.probe, budget_s=float("inf"), clock=clock, variants_first=True)
    first = [t.candidate for t in log.tried if t.round == 0]
    assert first == [Candidate("fp32", 32, 3.0), Candidate("int8", 32, 3.0)]
    assert [t.candidate.variant for t in log.tried if t.round == 1][
        0
    ] == "int8"  # the current one, beside its neighbours
    assert log.best()[0].candidate.variant == "int8" and log.stopped.startswith("a top")
    clock = Clock(per_probe=10.0)
    short = quick_search(space, clock.probe, budget_s=1.0, clock=clock, variants_first=True)
    assert len(short.tried) == 2  # the first round is measured whole, whatever the budget


def test_the_variants_round_is_measured_again_side_by_side_when_the_budget_pays_and_decided_by_the_means():
    """One coarse probe each may put FP32 first (ffn at the lab's start: 0.71 of the brute force's INT8 best); with
    the finer probe the first round is measured twice more in alternating order, and the means decide."""
    space = space_for("cpu", 1, ("fp32", "int8")).starting_at(Candidate("int8", 32, 2.0))

    def unlucky(clock: Clock):  # the first probe's INT8 a tenth of its rate
        def probe(candidates: list[Candidate]) -> list[float]:
            rates = clock.probe(candidates)
            return [r / 10 if c.variant == "int8" and clock.probes <= 2 else r for c, r in zip(candidates, rates)]

        return probe

    clock = Clock(per_probe=10.0)
    fine_orders = []

    def fine(candidates: list[Candidate]) -> list[float]:
        fine_orders.append([c.variant for c in candidates])
        return clock.probe(candidates)

    log = quick_search(space, unlucky(clock), float("inf"), clock=clock, variants_first=True, first_probe=fine)
    assert fine_orders == [["fp32", "int8"], ["int8", "fp32"]]  # reversed first, then as the coarse one
    first = [t for t in log.tried if t.round == 0]
    assert len(first) == 6 and sum(t.note == "side by side" for t in first) == 4
    assert [t.candidate.variant for t in log.tried if t.round == 1][0] == "int8"  # the means chose INT8
    alone = Clock(per_probe=10.0)
    coarse_only = quick_search(space, unlucky(alone), float("inf"), clock=alone, variants_first=True)
    assert [t.candidate.variant for t in coarse_only.tried if t.round == 1][0] == "fp32"  # misled without them
    clock = Clock(per_probe=10.0)
    fine_orders.clear()
    short = quick_search(space, clock.probe, 45.0, clock=clock, variants_first=True, first_probe=fine)
    assert not fine_orders and len([t for t in short.tried if t.round == 0]) == 2  # the budget pays for no more


def test_a_first_rounds_probe_stops_halving_at_a_quarter_of_its_start(tmp_path):
    """Before any rate is known the probe starts at the model's highest listed rate, and its floor follows from that
    start (a run's first round went down to 1 req/s for the cnn in FP32, a third of the lab's search budget)."""
    from latlab.lab.plan import CNN, PLANS
    from latlab.tune.run import FLOOR_SHARE, NEAR_GROWTH, TuneJob, probe_plan

    job = TuneJob(PLANS["cpu"], CNN, {"fp32": tmp_path / "m.onnx"}, "cpu", 0.05, tmp_path)
    plan = probe_plan(job, "http://127.0.0.1:9", 2)
    assert plan.schedule.loads == (max(CNN.rates),) and plan.slo.search and plan.slo.p99_s == 0.05
    assert plan.slo.floor == max(CNN.rates) * FLOOR_SHARE
    assert plan.slo.growth == 2.0  # nothing known yet: doubling finds the edge fast
    assert plan.workload.deployments == ("cnn-tune-0", "cnn-tune-1")
    job.start_rate = 48.0  # a round later: from the best so far, raised gently (it lies near the edge)
    plan = probe_plan(job, "http://127.0.0.1:9", 2)
    assert plan.slo.floor == 48.0 * FLOOR_SHARE
    assert plan.slo.growth == NEAR_GROWTH


def test_probes_leave_the_generators_floor_to_the_sweeps(tmp_path):
    """A search's probes rank configurations side by side; a calibration in each would spend its budget."""
    from latlab.lab.plan import CNN, PLANS
    from latlab.tune.run import TuneJob, probe_plan

    job = TuneJob(PLANS["cpu"], CNN, {"fp32": tmp_path / "m.onnx"}, "cpu", 0.05, tmp_path)
    assert probe_plan(job, "http://127.0.0.1:9", 2).schedule.calibrate_seconds == 0
