"""The configuration search behind `latlab tune`: which settings serve one model on one provider at the highest rate
under an SLO. Pure logic over a `probe(candidates) -> rates` callable, so it is tested without a server.

After Triton Model Analyzer: its brute-force search measures every configuration of a space; its quick search
climbs from a default one notch along one setting at a time (a neighbour), keeps the best neighbour while it
gains, and in most cases finds nearly the brute-force best while measuring a fraction of the space. Here each
probe ranks configurations by the highest rate that meets the SLO (loadtest's SLO search, coarse). A budget in
seconds stops the climb before a round it cannot afford.

A little over 400 lines on purpose: the space (a Candidate, its neighbours) and the searches that walk it are one
algorithm read together; the probe that measures is elsewhere (run.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable

from latlab.common.settings import BatcherSettings, CpuOptions, CudaOptions

BATCH_SIZES = (1, 4, 8, 16, 32, 64)
DELAYS_MS = (0.0, 0.5, 2.0, 5.0)
"""max_queue_delay_ms of a batching configuration: 0 batches what is already queued (batch size 1 waits for
nothing)."""
MIN_GAIN = 0.1
"""A neighbour replaces the current configuration only when it holds this fraction more: the probes' resolution,
below which two probes cannot tell the two apart and the climb wanders (a finer gain made the climb run many
more rounds for no better choice: docs/tuning.md)."""
FINALISTS = 3
"""How many of the screening's best are measured again side by side (Model Analyzer: full sweeps of the best
few)."""
FINE_COST = 1.5
"""What a finalist's probe (to the finer resolution) costs against a screening one: a step or two more of a few.
The climb keeps FINALISTS x FINE_COST probes of its budget for them."""
CONFIRM_ROUNDS = 2
"""How many times the finalists are measured again, in alternating order; the variants of the first round too
(quick_search's `first_probe`)."""


@dataclass(frozen=True, order=True)
class Candidate:
    """One serving configuration of one model on one provider: the settings that decide latency and throughput."""

    variant: str = "fp32"
    """The model's variant: "fp32" (the export), "int8" (CPU) or "fp16" (CUDA); see docs/variants.md."""
    max_batch_size: int = 1
    max_queue_delay_ms: float = 0.0
    adaptive: bool = False
    """Wait for a batch only while waiting is predicted to pay (server/batching/latency_model.py)."""
    instances: int = 1
    threads: int = 1
    """ORT intra-op threads of each instance (CPU); instances x threads is the cores the deployment takes."""
    cuda_graphs: bool = False
    """CUDA only: one captured graph per batch bucket."""

    def label(self) -> str:
        batching = (
            "batching off"
            if self.max_batch_size == 1
            else f"batch ≤ {self.max_batch_size}, wait ≤ {self.max_queue_delay_ms:g} ms"
            + (", adaptive" if self.adaptive else "")
        )
        layout = f"{self.instances} × {self.threads} thread{'s' if self.threads > 1 else ''}"
        return f"{self.variant}, {batching}, {layout}" + (", CUDA graphs" if self.cuda_graphs else "")

    @classmethod
    def serving(cls, variant: str, batcher: BatcherSettings, threads: int = 1, cuda_graphs: bool = False) -> Candidate:
        """The configuration of these batcher settings (their size, wait, adaptive waiting and instances) serving
        `variant` on `threads` ORT threads per instance."""
        return cls(
            variant,
            batcher.max_batch_size,
            batcher.max_queue_delay_ms,
            batcher.adaptive,
            batcher.instances,
            threads,
            cuda_graphs,
        )

    def batcher(self, base: BatcherSettings | None = None) -> BatcherSettings:
        """The searched batcher settings over those `base` names, less its batch_buckets: a config's buckets end at
        its own max_batch_size, so the server derives them from the searched one."""
        kept = (base or BatcherSettings.partial()).without("batch_buckets")
        return kept.updated(
            max_batch_size=self.max_batch_size,
            max_queue_delay_ms=self.max_queue_delay_ms,
            adaptive=self.adaptive,
            instances=self.instances,
        )

    def deployment(self, name: str, model_path: Path, provider: str, base: dict | None = None) -> dict:
        """The [[deployments]] entry serving this configuration (server.config.dumps_config writes it): `base`
        (a deployment table of the user's config, say) with the searched settings over it."""
        base = base or {}
        batcher = self.batcher(BatcherSettings.from_mapping(base.get("batcher", {})))
        entry = {**base, "name": name, "model_path": model_path, "provider": provider, "batcher": batcher.as_dict()}
        if provider == "cpu":
            cpu = CpuOptions.partial(allow_spinning=False).updated(**base.get("cpu", {}))
            entry["cpu"] = cpu.updated(intra_op_threads=self.threads).as_dict()
        else:
            cuda = CudaOptions.from_mapping(base.get("cuda", {}))
            entry["cuda"] = cuda.updated(enable_cuda_graph=self.cuda_graphs).as_dict()
        return entry


@dataclass(frozen=True)
class Space:
    """The values each setting may take, in order: a neighbour moves one setting one notch."""

    variants: tuple[str, ...] = ("fp32",)
    batch_sizes: tuple[int, ...] = BATCH_SIZES
    delays_ms: tuple[float, ...] = DELAYS_MS
    adaptive: tuple[bool, ...] = (False, True)
    layouts: tuple[tuple[int, int], ...] = ((1, 1),)
    """(instances, threads) pairs."""
    cuda_graphs: tuple[bool, ...] = (False,)
    begin: Candidate | None = None
    """Where the climb starts (a config's current settings), instead of the middle of the space."""

    def starting_at(self, c: Candidate) -> Space:
        """The space with `c` as its start, each of c's values added to its setting's values."""
        return replace(
            self,
            variants=_with(self.variants, c.variant, ordered=False),
            batch_sizes=_with(self.batch_sizes, c.max_batch_size),
            delays_ms=_with(self.delays_ms, c.max_queue_delay_ms),
            layouts=_with(self.layouts, (c.instances, c.threads), ordered=False),
            cuda_graphs=_with(self.cuda_graphs, c.cuda_graphs, ordered=False),
            begin=self.canonical(c),
        )

    def start(self) -> Candidate:
        """Where the climb starts: `begin`, else the first variant (space_for lists the provider's first), batching
        on at a middle size and wait, the first layout."""
        if self.begin is not None:
            return self.begin
        size = self.batch_sizes[len(self.batch_sizes) // 2]
        instances, threads = self.layouts[0]
        return self.canonical(
            Candidate(
                self.variants[0], size, self.delays_ms[len(self.delays_ms) // 2], False, instances, threads, False
            )
        )

    def canonical(self, c: Candidate) -> Candidate:
        """Settings that change nothing take one value: batch size 1 has no wait, and without a wait there is
        nothing to adapt."""
        if c.max_batch_size == 1:
            c = replace(c, max_queue_delay_ms=0.0)
        return replace(c, adaptive=False) if c.max_queue_delay_ms == 0 else c

    def neighbours(self, c: Candidate) -> list[Candidate]:
        """Every configuration that changes one setting of `c`: one notch along an ordered one (batch size, wait),
        any other value of a choice (variant, adaptive, core split, CUDA graphs). Canonical, without `c`."""
        found = []
        for axis, values, ordered in self._axes():
            k = values.index(_value(c, axis))
            others = [j for j in (k - 1, k + 1) if 0 <= j < len(values)] if ordered else range(len(values))
            found += [self.canonical(_set(c, axis, values[j])) for j in others]
        return sorted({n for n in found if n != c})

    def all(self) -> list[Candidate]:
        """Every configuration of the space once (what a brute-force search measures)."""
        found = {self.start()}
        frontier = [self.start()]
        while frontier:
            nxt = [n for c in frontier for n in self.neighbours(c) if n not in found]
            found.update(nxt)
            frontier = nxt
        return sorted(found)

    def _axes(self) -> list[tuple[str, tuple, bool]]:
        """(setting, its values, whether they are ordered)."""
        return [
            ("variant", self.variants, False),
            ("max_batch_size", self.batch_sizes, True),
            ("max_queue_delay_ms", self.delays_ms, True),
            ("adaptive", self.adaptive, False),
            ("layout", self.layouts, False),
            ("cuda_graphs", self.cuda_graphs, False),
        ]


def _with(values: tuple, value: object, ordered: bool = True) -> tuple:
    if value in values:
        return values
    return tuple(sorted((*values, value))) if ordered else (*values, value)


def _value(c: Candidate, axis: str) -> object:
    return (c.instances, c.threads) if axis == "layout" else getattr(c, axis)


def _set(c: Candidate, axis: str, value: object) -> Candidate:
    if axis == "layout":
        instances, threads = value  # type: ignore[misc]
        return replace(c, instances=instances, threads=threads)
    return replace(c, **{axis: value})


def layouts_for(cores: int) -> tuple[tuple[int, int], ...]:
    """How `cores` split into instances x threads: one instance on all of them first, then more instances of
    fewer threads (every split that uses all the cores)."""
    return tuple((cores // t, t) for t in range(cores, 0, -1) if cores % t == 0)


def space_for(provider: str, cores: int, variants: Iterable[str] = ("fp32",)) -> Space:
    """The space `latlab tune` searches on a provider: variants it may serve, batching, the CPU's core splits
    (cores = the ORT threads the CPU deployment may take), CUDA graphs on a GPU."""
    variants = tuple(sorted(variants, key=lambda v: v == "fp32"))  # the provider's variant first: the climb's start
    if provider == "cpu":
        return Space(variants=variants, layouts=layouts_for(max(1, cores)))
    return Space(variants=variants, layouts=((1, 1), (2, 1)), cuda_graphs=(False, True))


@dataclass
class Tried:
    """One configuration as the search measured it."""

    candidate: Candidate
    rate: float | None
    """The highest rate (req/s) that met the SLO in its probe; None where none did."""
    round: int = 0
    note: str = ""
    confirmed: float | None = None
    """A finalist's rate measured again beside the other finalists, finer (the mean of those probes); None for
    a configuration only screened."""

    def as_dict(self) -> dict:
        return {**asdict(self), "candidate": asdict(self.candidate), "label": self.candidate.label()}


@dataclass
class SearchLog:
    """What a search tried, in order, and why it stopped."""

    tried: list[Tried] = field(default_factory=list)
    """The screening probes: coarse, one or a few per configuration."""
    confirmed: list[Tried] = field(default_factory=list)
    """The finalists' probes side by side (confirm()); they, not the screening, decide the best."""
    stopped: str = ""
    seconds: float = 0.0
    probe_cost_s: float = 0.0
    """The most a configuration cost in any screening round (its seconds over its configurations): a round pays for
    a server start besides its probes, so a round of few configurations costs more each than the mean says, and
    the finalists' round is such a round."""

    def best(self, n: int = 1) -> list[Tried]:
        """The n configurations of the highest rates: the finalists by their confirmed rate first, then the rest
        by their screening (the mean of its probes); ties to the cheaper one (fewer cores, smaller batches,
        shorter waits)."""
        return sorted(
            self.configurations(),
            key=lambda t: (t.confirmed is None, -(t.confirmed or t.rate or 0.0), _cost(t.candidate)),
        )[:n]

    def configurations(self) -> list[Tried]:
        """Each configuration measured, once: its mean rate over its screening probes (a configuration the climb
        stood on is probed again beside its neighbours), its confirmed rate if it was a finalist, its last round,
        and how many probes in `note`."""
        found: dict[Candidate, list[Tried]] = {}
        for t in self.tried:
            found.setdefault(t.candidate, []).append(t)
        final: dict[Candidate, list[float]] = {}
        for t in self.confirmed:
            final.setdefault(t.candidate, []).append(t.rate or 0.0)
        return [
            Tried(
                c,
                _mean(t.rate or 0.0 for t in ts) or None,
                ts[-1].round,
                f"{len(ts)} probes" + (f", {len(final[c])} side by side" if c in final else ""),
                _mean(final[c]) or None if c in final else None,
            )
            for c, ts in found.items()
        ]

    def rate_of(self, c: Candidate) -> float | None:
        """A configuration's rate: confirmed when it was a finalist, else screened."""
        return next((t.confirmed or t.rate for t in self.configurations() if t.candidate == c), None)


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def _cost(c: Candidate) -> tuple:
    return (c.instances * c.threads, c.max_batch_size, c.max_queue_delay_ms, c.adaptive, c.variant)


Probe = Callable[[list[Candidate]], list[float | None]]
"""Measures each candidate of a round (one server serving them all); the rates, in order."""


def quick_search(
    space: Space,
    probe: Probe,
    budget_s: float,
    clock: Callable[[], float] = time.monotonic,
    min_gain: float = MIN_GAIN,
    reserve_probes: int = 0,
    variants_first: bool = False,
    first_probe: Probe | None = None,
) -> SearchLog:
    """Climb from space.start(): measure it, then in each round the current configuration again beside every
    neighbour not measured yet, and move to the round's best when it held min_gain more than the current one did
    in the same round (side by side: a lucky earlier probe of the current one cannot stop the climb). Stop at a
    top, or when the budget cannot pay for the round and `reserve_probes` more (what confirm() will need), a
    probe costing the most a probe has cost so far (log.probe_cost_s); a round the budget pays for only in part is
    cut short, and the log says so.
    confirm() then decides among the best few. With `variants_first`, the first round measures the start in every
    variant side by side (what the variant alone buys, the lab's first question), and the climb goes on from the
    best of them; with `first_probe` too (the finalists' finer probe) that round is measured up to CONFIRM_ROUNDS
    times more, in alternating order, while the budget pays, and decided by the means: one coarse probe each put
    ffn's FP32 ahead of its INT8 at the lab's start, and the climb never came back (0.71 of the brute force's INT8
    best, docs/tuning.md)."""
    log, began = SearchLog(), clock()
    current, round_ = space.start(), 0
    pending = [current]
    if variants_first:
        pending += [space.canonical(replace(current, variant=v)) for v in space.variants if v != current.variant]
    while pending:
        if log.tried and math.isfinite(budget_s):
            left = budget_s - (clock() - began)
            affordable = max(0, int(max(0.0, left) // max(log.probe_cost_s, 1e-9)) - reserve_probes)
            if affordable < len(pending):
                log.stopped = f"the budget ({budget_s:g} s): {len(pending) - affordable} of a round left unmeasured"
                pending = pending[:affordable]
                if len(pending) < 2:  # the current one alone: nothing new to compare
                    break
        round_began = clock()
        rates = probe(pending)
        log.probe_cost_s = max(log.probe_cost_s, (clock() - round_began) / len(pending))
        log.tried += [Tried(c, r, round=round_) for c, r in zip(pending, rates)]
        if round_ == 0 and variants_first and first_probe is not None and len(pending) > 1:
            # the finalists' share kept, as the climb keeps it
            cost = log.probe_cost_s * (FINE_COST * len(pending) + reserve_probes)
            rates = _again_side_by_side(log, first_probe, pending, budget_s - (clock() - began), cost, clock)
        if log.stopped:
            break
        if len(pending) > 1:
            here = {c: r or 0.0 for c, r in zip(pending, rates)}
            best = min(pending, key=lambda c: (-here[c], _cost(c)))
            if best != current and here[best] > here[current] * (1 + min_gain):
                current = best
            elif round_ > 0:  # the first round's variants are no top: the start's other neighbours come next
                log.stopped = f"a top: no neighbour held {min_gain:.0%} more than {current.label()} beside it"
                break
        round_ += 1
        measured = {t.candidate for t in log.tried}
        pending = [current] + [n for n in space.neighbours(current) if n not in measured]
        if len(pending) == 1:
            log.stopped = f"a top: every neighbour of {current.label()} is measured"
            pending = []
    log.seconds = clock() - began
    return log


def _again_side_by_side(
    log: SearchLog, probe: Probe, candidates: list[Candidate], left_s: float, cost_s: float, clock: Callable[[], float]
) -> list[float | None]:
    """The first round's candidates, measured once, measured again with `probe` up to CONFIRM_ROUNDS times in
    alternating order (the first of them reversed), each time only while `left_s` of the budget pays for it at
    `cost_s` (the lab's default 30 s a model pays for none: its first round stays one probe each). Every probe goes
    in the log; the mean rates, in order (None where none met the bound)."""
    found: dict[Candidate, list[float]] = {t.candidate: [t.rate or 0.0] for t in log.tried}
    for k in range(1, CONFIRM_ROUNDS + 1):
        if cost_s > left_s:
            break
        began = clock()
        order = candidates[::-1] if k % 2 == 1 else candidates
        for c, r in zip(order, probe(order)):
            log.tried.append(Tried(c, r, round=0, note="side by side"))
            found[c].append(r or 0.0)
        left_s -= clock() - began
    return [_mean(found[c]) or None for c in candidates]


def brute_force(space: Space, probe: Probe, per_round: int = 8) -> SearchLog:
    """Every configuration of the space, `per_round` at a time (what the quick search is judged against)."""
    log, began = SearchLog(), time.monotonic()
    everything = space.all()
    for k in range(0, len(everything), per_round):
        chunk = everything[k : k + per_round]
        log.tried += [Tried(c, r, round=k // per_round) for c, r in zip(chunk, probe(chunk))]
    log.stopped = f"all {len(everything)} configurations"
    log.seconds = time.monotonic() - began
    return log


def confirm(
    log: SearchLog,
    probe: Probe,
    budget_s: float = math.inf,
    finalists: int = FINALISTS,
    rounds: int = CONFIRM_ROUNDS,
    clock: Callable[[], float] = time.monotonic,
    probe_cost_s: float = 0.0,
    first_owed: bool = False,
) -> SearchLog:
    """Measure the screening's best few again side by side, `rounds` times in alternating order (`probe` is
    the finer one), so that the best is decided by rates taken together rather than by coarse probes minutes
    apart, the highest of which is more likely luck than the best (a brute force's top five of mlp lay within 6%
    here, its best a maximum of noisy probes). A round the budget cannot pay for is not started: the first at
    `probe_cost_s` a configuration, the others at the cost of the last; the log says what was measured.
    `first_owed`: the climb kept the first round's share of the budget (quick_search's reserve_probes), so it
    runs even where the climb's last rounds cost more than their estimate and ate into that share (a machine
    that slowed down): a best decided by coarse probes alone is what this stage exists to avoid. The overrun is
    at most that one round, and the log says it."""
    chosen = [t.candidate for t in log.best(finalists) if t.rate]
    if len(chosen) < 2:
        return log
    began, done = clock(), 0
    for k in range(rounds):
        cost = (clock() - began) / done if done else probe_cost_s * len(chosen)
        if clock() - began + cost > budget_s and not (first_owed and k == 0):
            break
        order = chosen if k % 2 == 0 else chosen[::-1]
        log.confirmed += [Tried(c, r, round=k, note="side by side") for c, r in zip(order, probe(order))]
        done += 1
    log.stopped += (
        f"; the best {len(chosen)} measured again side by side {done} time{'s' if done > 1 else ''}"
        if done
        else f"; the budget left no time to measure the best {len(chosen)} again side by side"
    )
    if clock() - began > budget_s:
        log.stopped += f" (over the budget by {clock() - began - budget_s:.0f} s: the climb's rounds ran long)"
    log.seconds += clock() - began
    return log


def share_of_best(quick: SearchLog, full: SearchLog) -> float:
    """The brute force's screening rate of the configuration the quick search chose, as a fraction of the highest
    the brute force screened: both judged by the same measurements (1.0 when neither found a rate)."""
    if not quick.tried or not full.tried:
        return 0.0
    screened = {t.candidate: t.rate or 0.0 for t in full.configurations()}
    best = max(screened.values())
    return 1.0 if best == 0 else screened.get(quick.best()[0].candidate, 0.0) / best
