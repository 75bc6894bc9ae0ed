"""How the report words the replica check: the steps the generator decided, and a replica slowed by shared cores."""

from __future__ import annotations

from latlab.report.fleetplan.replica import ReplicaModel
from latlab.report.plan_section import validation_section, validation_summary


def row(name: str, off: bool, bound: int, stretch: float = 1.0, by_generator: bool = False) -> dict:
    slo = {"slo_s": 0.025, "measured_rps": 100.0, "broke_rps": 150.0, "predicted_rps": 200.0 if off else 105.0}
    slo["broke_by_generator"] = by_generator
    slo.update(error=slo["predicted_rps"] / 100.0 - 1, off=off)
    return {
        "deployment": name,
        "traffic": "poisson",
        "source": "test",
        "replica": ReplicaModel(0.001, 0.0, max_batch=1),
        "stretch": stretch,
        "generator_bound": bound,
        "steps": [{}] * 4,
        "slos": [slo],
        "off": off,
    }


def test_the_summary_counts_the_steps_the_generator_decided_and_still_names_the_models_off():
    said = validation_summary([row("mlp-b1", True, 3), row("mlp-batch", False, 1)])
    assert "within 20% for 1 of 2 SLOs" in said and "not planned with: mlp-b1." in said
    assert "On 4 of 8 steps the load generator sent late" in said


def test_without_steps_the_generator_decided_the_summary_says_nothing_of_them():
    assert "generator" not in validation_summary([row("mlp-b1", False, 0)])


def test_a_replica_slowed_by_shared_cores_says_by_how_much_and_one_not_slowed_says_nothing():
    text = validation_section([row("mlp-b1", False, 0, stretch=1.25), row("mlp-batch", False, 0)])
    assert text.count("slowed ×") == 1 and "slowed ×1.25 at its busiest step" in text


def test_a_bound_the_generator_could_have_broken_says_so_beside_its_rate():
    text = validation_section([row("mlp-b1", True, 1, by_generator=True), row("mlp-batch", False, 0)])
    assert text.count("broke at 150 (the generator late enough to decide it)") == 1
