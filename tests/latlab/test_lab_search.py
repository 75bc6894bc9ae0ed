"""Where the lab's search starts: the plan's batching-on settings, in the provider's variant."""

from __future__ import annotations

from latlab.lab.plan import CNN, MINILM
from latlab.tune.lab_search import plan_start
from latlab.tune.search import Candidate, space_for


def test_the_lab_climb_starts_at_the_plans_batching_in_the_providers_variant():
    cpu = space_for("cpu", 2, ("fp32", "int8"))
    start = plan_start(cpu, MINILM)
    assert start == Candidate("int8", 32, 3.0, False, 1, 2)  # one instance on both cores first
    begun = cpu.starting_at(start)
    assert begun.start() == start and 3.0 in begun.delays_ms  # a wait the generic space lacks is searched too
    assert start in begun.all() and len(begun.all()) > len(cpu.all())
    cuda = space_for("cuda", 1, ("fp32", "fp16"))
    assert plan_start(cuda, CNN) == Candidate("fp16", 8, 5.0, False, 1, 1)
    assert plan_start(space_for("cpu", 1, ("fp32",)), CNN).variant == "fp32"  # no variant made: the export


def test_the_lab_probes_with_the_short_steps_tune_takes():
    from latlab.lab.plan import PLANS
    from latlab.tune.lab_search import probe_timing

    probing = probe_timing(PLANS["cpu"])
    quick = PLANS["quick"]
    assert (probing.step_seconds, probing.max_windows, probing.warmup_seconds) == (
        quick.step_seconds,
        quick.max_windows,
        quick.warmup_seconds,
    )
    assert probing.models == PLANS["cpu"].models and probing.slos == PLANS["cpu"].slos
