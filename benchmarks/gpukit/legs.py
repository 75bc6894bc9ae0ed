"""The GPU work as ranked legs, each inside one 15-minute loan: its calls, their carries, and what they cost.

A loan is a fresh machine: every leg carries the kit again (its first calls each bring one part), and its last
part's call installs and starts measuring. Each device step runs under a cap (the kit stops it with Ctrl-C and
packs what it measured into $OUT), so a call's `timeout_s` is the sum of its steps' caps and a call that
overruns still brings its results back. The estimate of a leg is built from costs.json: measured step times
where a trip or a rehearsal measured them, assumed ones said so, and the carry measured by the last `prepare`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

COSTS_FILE = Path(__file__).with_name("costs.json")
LOAN_MINUTES = 15.0
RETRY_SPARE_MINUTES = 3.0
LEG_LIMIT_MINUTES = LOAN_MINUTES - RETRY_SPARE_MINUTES
"""A leg's estimate may not exceed this: the rest of the loan pays for one retried call."""
CALL_LIMIT_S = 600
"""One command's limit on the device machine."""
PACK_SPARE_S = 30
"""Added to a call's summed caps for packing and the reply."""
LEG_PREFIX = "leg-"
LEG_FILE = "leg.json"


@dataclass(frozen=True)
class Step:
    """One device step of a call: what gpu_kit.py runs there, and the seconds after which the kit stops it."""

    name: str
    cap_s: int


@dataclass(frozen=True)
class Call:
    carry: str | None
    """The folder this call carries (".whl/carry-K"), or None."""
    steps: tuple[Step, ...]

    @property
    def timeout_s(self) -> int:
        return min(CALL_LIMIT_S, sum(s.cap_s for s in self.steps) + PACK_SPARE_S)


@dataclass(frozen=True)
class LegSpec:
    """What a leg measures, before it is laid out over a carry of some number of parts."""

    number: int
    name: str
    why: str
    work: tuple[tuple[Step, ...], ...]
    """The leg's work calls after the install: the first runs in the last part's call, after stash and install."""
    lands: tuple[str, ...]
    """Files (globs) whose presence in report/reference/<machine>/leg-N/ means the leg has landed."""


STASH = Step("stash", 20)
INSTALL = Step("install", 45)
FLEET_REPLICAS = (1, 2, 4)
"""Leg 6's CPU fleets, one after another on the same machine: one server on every core the load generator
leaves, then 2 and 4 replicas sharing those cores."""
FLEET_CAP_S = 165
"""One fleet's lab run (`latlab lab --plan gpu-serve-cpu --models minilm --replicas N`): all three fit the last
part's call beside the stash and the install, so the leg needs no call of its own for them and ends inside
the loan even if every fleet runs to its cap (costs.json: what a run took rehearsed, what is assumed)."""
FLEET = tuple(Step(f"fleet-{n}", FLEET_CAP_S) for n in FLEET_REPLICAS)
SPECS = (
    LegSpec(
        1,
        "serve",
        "CUDA really loads; the GPU tests; cnn and minilm served on CUDA against the fair CPU baseline at p99 <= 25 "
        "and 50 ms (plan gpu-serve), each in a call of its own, the CUDA sweeps raised to the bench's ceiling",
        ((Step("verify", 75), Step("lab-cnn", 420)), (Step("lab-minilm", 330),)),
        ("gpu-tests.json", "lab-cnn/cnn/results.json", "lab-minilm/minilm/results.json"),
    ),
    LegSpec(
        2,
        "precision",
        "each side at its best on CUDA: FP16 against FP32 served, and the search's best against the lab's best of "
        "two (benchmarks/search_vs_lab.py minilm cnn --provider cuda --slo 50ms --search-minutes 1.5 --rounds 1)",
        ((Step("cuda", 30), Step("search", 465)),),
        ("search-vs-lab/summary.json",),
    ),
    LegSpec(
        3,
        "frontends",
        "one process (WSGI, then the native interface), then 2, 4, 8 native front ends before "
        "minilm-cuda-batch: the served rate at p99 <= 25 and 50 ms each (benchmarks/frontends_gpu.py)",
        ((Step("cuda", 30), Step("frontends", 420)),),
        ("frontends-gpu.json",),
    ),
    LegSpec(
        4,
        "bench",
        "seed 003's batch, width and depth sweeps on ORT and torch, CPU and CUDA (latlab bench), buckets and "
        "per-bucket graphs in process, then mlp and ffn served on CUDA against the CPU (plan gpu-quick, mlp and ffn)",
        ((Step("cuda", 30), Step("bench", 150), Step("buckets", 100)), (Step("lab-small", 300),)),
        ("bench/*.json", "gpu-buckets.json", "lab-small/mlp/results.json", "lab-small/ffn/results.json"),
    ),
    LegSpec(
        5,
        "traffic",
        "minilm served on CUDA against the fair CPU baseline under Poisson and Gamma CV 3 arrivals, requests of "
        "log-normal lengths (plan gpu-serve, --traffic poisson,gamma:3 --dim seq=lognormal:16:100): what "
        "burstiness and padding do to each side",
        ((Step("cuda", 30), Step("lab-traffic", 450)),),
        ("lab-traffic/minilm/results.json", "lab-traffic/minilm/traffic-1/results.json"),
    ),
    LegSpec(
        6,
        "fleet",
        "CPU fleets of 1, 2 and 4 replicas of minilm behind the kit's own HAProxy (leastconn), one after another "
        "on the 16 cores: what replicas buy against one server with all the cores, at p99 <= 25 and 50 ms "
        "(plan gpu-serve-cpu --models minilm --replicas N; docs/fleet.md)",
        (FLEET,),
        tuple(f"fleet-{n}/minilm/results.json" for n in FLEET_REPLICAS),
    ),
)


@dataclass(frozen=True)
class Leg:
    spec: LegSpec
    calls: tuple[Call, ...]

    @property
    def number(self) -> int:
        return self.spec.number


def lay_out(spec: LegSpec, parts: int) -> Leg:
    """The leg's calls over a kit of `parts` parts: one stash call per part but the last, which also installs
    and runs the first work call's steps when they fit one command; the other work calls follow."""
    if parts < 1:
        raise ValueError("a kit has at least one part")
    carries = [Call(f".whl/carry-{k}", (STASH,)) for k in range(1, parts)]
    first, *rest = spec.work
    last = (STASH, INSTALL, *first)
    if sum(s.cap_s for s in last) + PACK_SPARE_S <= CALL_LIMIT_S:
        calls = [*carries, Call(f".whl/carry-{parts}", last), *(Call(None, w) for w in rest)]
    else:
        calls = [*carries, Call(f".whl/carry-{parts}", (STASH, INSTALL)), *(Call(None, w) for w in spec.work)]
    for call in calls:
        if sum(s.cap_s for s in call.steps) + PACK_SPARE_S > CALL_LIMIT_S:
            raise ValueError(f"leg {spec.number}: a call's steps cap at more than one command may run")
    return Leg(spec, tuple(calls))


def legs(parts: int) -> list[Leg]:
    return [lay_out(spec, parts) for spec in SPECS]


def leg(number: int, parts: int) -> Leg:
    for spec in SPECS:
        if spec.number == number:
            return lay_out(spec, parts)
    raise ValueError(f"no leg {number}: the legs are {', '.join(str(s.number) for s in SPECS)}")


# --- costs and the estimate ---------------------------------------------------------------------------------


def load_costs(path: Path = COSTS_FILE) -> dict:
    return json.loads(path.read_text())


def _value(costs: dict, key: str) -> float:
    return float(costs[key]["value"])


def step_seconds(costs: dict, step: str) -> float:
    """A step's expected seconds: measured where costs.json has a measurement, else its stated assumption."""
    return float(costs["steps"][step]["value"])


@dataclass(frozen=True)
class Estimate:
    calls: int
    carried_mib: float
    seconds: float
    parts: list[float]
    """Seconds per call, in order (the first includes the machine's start)."""

    @property
    def minutes(self) -> float:
        return self.seconds / 60


def estimate(leg: Leg, costs: dict, part_mib: list[float]) -> Estimate:
    """Device time of a leg made back to back: the machine's start, then per call its carry at the transfer
    rate, the call's fixed overhead and its steps' expected times, and a gap between calls (the reply read,
    the next call made)."""
    rate = _value(costs, "transfer_mib_per_s")
    per_call = []
    for index, call in enumerate(leg.calls):
        carried = part_mib[index] if call.carry else 0.0
        seconds = carried / rate + _value(costs, "call_overhead_s")
        seconds += sum(step_seconds(costs, s.name) for s in call.steps)
        if index == 0:
            seconds += _value(costs, "start_s")
        else:
            seconds += _value(costs, "gap_s")
        per_call.append(seconds)
    carried_total = sum(part_mib[i] for i, c in enumerate(leg.calls) if c.carry)
    return Estimate(len(leg.calls), carried_total, sum(per_call), per_call)


def part_sizes(archive_mib: float, part_mib: float, tree_mib: float) -> list[float]:
    """What each call of the carry moves: its part plus the working tree, which every call sends."""
    parts = max(1, math.ceil(archive_mib / part_mib))
    sizes = [part_mib] * (parts - 1) + [archive_mib - part_mib * (parts - 1)]
    return [s + tree_mib for s in sizes]


# --- what has landed ----------------------------------------------------------------------------------------


def landed(spec: LegSpec, reference: Path) -> list[str]:
    """The machines under `reference` whose leg-N folder holds every file the leg lands, newest first."""
    found = []
    for folder in sorted(reference.glob(f"*/{LEG_PREFIX}{spec.number}")):
        if all(any(folder.glob(pattern)) for pattern in spec.lands):
            found.append((folder.stat().st_mtime, folder.parent.name))
    return [name for _, name in sorted(found, reverse=True)]


def next_leg(reference: Path) -> LegSpec | None:
    """The first leg, in rank order, that no machine has landed."""
    return next((spec for spec in SPECS if not landed(spec, reference)), None)


# --- costs learned from a trip ------------------------------------------------------------------------------


def record_step(costs: dict, step: str, seconds: float, ended: str, where: str) -> None:
    """A step's time as a trip measured it; a step stopped at its cap or failed keeps its old figure."""
    if ended == "done" and step in costs["steps"]:
        costs["steps"][step] = {"value": round(seconds, 1), "source": f"measured: {where}"}


def record_call(costs: dict, carried_mib: float, wall_s: float, held_s: float, first: bool, where: str) -> None:
    """One call as the device tool's reply timed it: `held_s` is the device time the call added to the loan
    (its held_s less the previous reply's), `wall_s` the command's own. Once two calls after the first carried
    different amounts, the transfer rate and the per-call overhead are fitted from them (least squares), and
    the start from the first call."""
    costs["calls_observed"].append(
        {"carried_mib": carried_mib, "wall_s": wall_s, "held_s": held_s, "first": first, "where": where}
    )
    later = [c for c in costs["calls_observed"] if not c["first"]]
    if len({round(c["carried_mib"]) for c in later}) < 2:
        return
    from statistics import linear_regression

    fit = linear_regression([c["carried_mib"] for c in later], [c["held_s"] - c["wall_s"] for c in later])
    if fit.slope <= 0:
        return
    gap = _value(costs, "gap_s")
    costs["transfer_mib_per_s"] = {"value": round(1 / fit.slope, 2), "source": f"fitted from {len(later)} calls"}
    costs["call_overhead_s"] = {"value": round(max(0.0, fit.intercept - gap), 1), "source": "fitted, less gap_s"}
    firsts = [c for c in costs["calls_observed"] if c["first"]]
    if firsts:
        c = firsts[-1]
        start = c["held_s"] - c["wall_s"] - c["carried_mib"] * fit.slope - costs["call_overhead_s"]["value"]
        costs["start_s"] = {"value": round(max(0.0, start)), "source": f"from the first call: {c['where']}"}


def save_costs(costs: dict, path: Path = COSTS_FILE) -> None:
    path.write_text(json.dumps(costs, indent=1) + "\n")
