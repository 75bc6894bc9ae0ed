"""What the report finds for one model, found once from its curves, the SLOs and the prices: per SLO every
deployment's highest rate under it, the best deployment per provider (per server and provider where servers are
compared) and per server, the CPU's and the device's best with their cost crossover and the winner; the SLO the
answer speaks of, and why none is met where none is. The renderers (answer.py, sections.py, pictures.py,
verdict.py, write.py) put these into words, tables and pictures and compute nothing of their own."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from latlab.loadtest.results import Curve
from latlab.report import costs
from latlab.report.best import Best, Measured, best_per_group, best_per_server, measure
from latlab.report.naming import UNKNOWN, by_server, is_cpu, is_gpu, provider_of
from latlab.report.rates import unmet_text


@dataclass(frozen=True)
class AtSlo:
    """One model's findings under one SLO."""

    slo_s: float
    measured: tuple[Measured, ...]
    """Per deployment, in the model's order, its highest rate under the SLO."""
    best: tuple[Best, ...]
    """Per provider, or per server and provider where servers are compared, its best deployment, in table order
    (best.best_per_group); the same groups under every SLO."""
    per_server: tuple[Best, ...]
    """Per server its best deployment of any provider, latlab's first; empty where servers are not compared."""
    cpu: Best | None
    gpu: Best | None
    unknown: Best | None
    """The best row of the CPU, of the devices and of unknown providers (highest rate, whether or not it met the
    SLO); None where no deployment is of that kind."""
    crossover: dict | None
    """Where the cheaper of `cpu` and `gpu` changes (cost_crossover); None unless both met the SLO and are priced."""
    priced: tuple[Best, ...]
    """The rows that met the SLO and have a price, in table order: the cost picture's lines."""
    priced_crossover: dict | None
    """cost_crossover of the best CPU and device rows among `priced`: the cost picture's mark."""
    winner: Best | None
    """The cheaper per inference when each runs flat out; by rate when a price is missing; None when none met it."""

    def of(self, curve: Curve) -> Measured:
        """The deployment's own highest rate under the SLO."""
        return next(m for m in self.measured if m.curve is curve)


@dataclass(frozen=True)
class Findings:
    """Everything the report says of one model, per SLO in the order given."""

    model: str
    curves: tuple[Curve, ...]
    slos_s: tuple[float, ...]
    servers: bool
    """Whether its deployments are compared by server (naming.by_server)."""
    by_slo: tuple[AtSlo, ...]
    """The findings per SLO, in the order of `slos_s`."""
    headline: AtSlo | None
    """The findings under the SLO the answer speaks of: the tightest that both the CPU and a device meet, else the
    tightest any deployment meets; None when none meets any."""
    none_met: str
    """Why no deployment meets even the loosest SLO (rates.unmet_text over all); "" when one meets some SLO."""
    has_cpu: bool
    has_gpu: bool
    has_unknown: bool
    """Whether any deployment ran on the CPU, on a device, or on a provider not recorded."""

    def at(self, slo_s: float) -> AtSlo:
        return next(found for found in self.by_slo if found.slo_s == slo_s)


def findings_of(model: str, curves: Sequence[Curve], slos_s: Sequence[float], prices: dict | None = None) -> Findings:
    """The model's findings over its curves (tagged by server where servers are compared: naming.tag_servers)
    under each SLO; `prices` per provider (None: none, so no cost is known)."""
    curves, slos_s = tuple(curves), tuple(slos_s)
    servers = by_server(curves)
    by_slo = tuple(_at_slo(curves, slo, prices or {}, servers) for slo in slos_s)
    headline = _headline(by_slo)
    return Findings(
        model=model,
        curves=curves,
        slos_s=slos_s,
        servers=servers,
        by_slo=by_slo,
        headline=headline,
        none_met=unmet_text(list(curves), max(slos_s)) if headline is None and slos_s else "",
        has_cpu=any(is_cpu(c) for c in curves),
        has_gpu=any(is_gpu(c) for c in curves),
        has_unknown=any(provider_of(c) == UNKNOWN for c in curves),
    )


def _at_slo(curves: tuple[Curve, ...], slo_s: float, prices: dict, servers: bool) -> AtSlo:
    measured = tuple(measure(curves, slo_s))
    rows = tuple(best_per_group(measured, prices))
    cpu, gpu = _top(rows, "cpu"), _top(rows, "gpu")
    priced = tuple(r for r in rows if r.rate > 0 and r.price is not None)
    priced_cpu, priced_gpu = _top(priced, "cpu"), _top(priced, "gpu")
    return AtSlo(
        slo_s=slo_s,
        measured=measured,
        best=rows,
        per_server=tuple(best_per_server(rows)) if servers else (),
        cpu=cpu,
        gpu=gpu,
        unknown=_top(rows, UNKNOWN),
        crossover=cost_crossover(cpu, gpu) if cpu is not None and gpu is not None else None,
        priced=priced,
        priced_crossover=cost_crossover(priced_cpu, priced_gpu) if priced_cpu and priced_gpu else None,
        winner=_winner(rows),
    )


def _top(rows: Sequence[Best], kind: str) -> Best | None:
    """The row of highest rate (the first of equals) among the CPU's ("cpu"), the devices' ("gpu") or the unknown
    providers' (UNKNOWN)."""
    of_kind = [r for r in rows if (r.provider if r.provider in ("cpu", UNKNOWN) else "gpu") == kind]
    return max(of_kind, key=lambda r: r.rate, default=None)


def cost_crossover(cpu: Best, gpu: Best) -> dict | None:
    """costs.crossover for the two rows, over rates up to 4× the larger capacity; None without both. A side whose
    sweep ended before it saturated has a capacity that is only a lower bound (Best.unsaturated), so its cost is
    only an upper bound: where that side is the one cheaper at high rates the crossover rate is an upper bound
    ("at_most"); where it is the other one, which is cheaper is open ("open": the side, its rate, and the rate
    from which it would be the cheaper at high rates: overtaking_rate)."""
    if cpu.rate <= 0 or gpu.rate <= 0 or cpu.price is None or gpu.price is None:
        return None
    top = 4 * max(cpu.rate, gpu.rate)
    found = {**costs.crossover((cpu.rate, cpu.price.per_hour), (gpu.rate, gpu.price.per_hour), top), "top_rps": top}
    rows = {"cpu": cpu, "gpu": gpu}
    high = rows[found["cheaper_high"]]
    other = gpu if high is cpu else cpu
    if other.unsaturated:
        side = "gpu" if other is gpu else "cpu"
        found["open"] = {"side": side, "rate_rps": other.rate, "needs_rps": overtaking_rate(other, high)}
    elif high.unsaturated and found["from_rps"] is not None:
        found["at_most"] = True
    return found


def overtaking_rate(row: Best, cheaper: Best) -> float:
    """The capacity at which `row`, kept busy, would cost per inference what `cheaper` costs kept busy at its own:
    past it `row` is the cheaper at high rates. Both must be priced and have met the SLO."""
    return row.price.per_hour / cheaper.price.per_hour * cheaper.rate


def open_contender(at: AtSlo) -> tuple[Best, float] | None:
    """A row the winner beats only as measured: it met the SLO, costs more per inference at the rate it reached,
    but its sweep ended before it saturated, so it could still be the cheaper. (that row, the rate it would need:
    overtaking_rate) for the row that needs the least above what it reached; None when the winner's lead is
    settled."""
    best = at.winner
    if best is None or best.cost is None:
        return None
    rivals = [r for r in at.best if r is not best and r.rate > 0 and r.unsaturated and r.cost is not None]
    found = [(r, overtaking_rate(r, best)) for r in rivals if r.cost > best.cost]
    return min(found, key=lambda pair: pair[1] / pair[0].rate, default=None)


def _winner(rows: Sequence[Best]) -> Best | None:
    met = [r for r in rows if r.rate > 0]
    if all(r.cost is not None for r in met):
        return min(met, key=lambda r: r.cost, default=None)
    return max(met, key=lambda r: r.rate, default=None)


def _headline(by_slo: Sequence[AtSlo]) -> AtSlo | None:
    """The tightest SLO that both the CPU and a device meet, else the tightest any deployment meets."""

    def meets(found: AtSlo, kind: Callable[[Curve], bool]) -> bool:
        return any(m.step is not None and kind(m.curve) for m in found.measured)

    ordered = sorted(by_slo, key=lambda found: found.slo_s)
    both = [found for found in ordered if meets(found, is_cpu) and meets(found, is_gpu)]
    anyone = [found for found in ordered if meets(found, lambda curve: True)]
    return (both or anyone or [None])[0]


def by_traffic(
    model: str, curves: Sequence[Curve], slos_s: Sequence[float], prices: dict | None = None
) -> list[Findings]:
    """The model's findings per arrival process its curves were measured under (Curve.traffic), in the order the
    processes first appear: the first is the one the verdict speaks of (the lab's first --traffic profile)."""
    order = list(dict.fromkeys(c.traffic for c in curves))
    return [findings_of(model, [c for c in curves if c.traffic == t], slos_s, prices) for t in order]
