"""The best deployment per provider under an SLO, priced one way (costs.machine_price: a machine-hour price, or a
core-hour price times the cores the deployment computes on), and per server where servers are compared; built
on each deployment's highest rate under the SLO (Measured). findings.py builds them once per model and SLO; every
table, sentence and picture of the report takes its rows from there."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from latlab.loadtest.results import Curve, Step
from latlab.report import costs
from latlab.report.naming import UNKNOWN, by_server, group_name, provider_of, server_name, server_names
from latlab.report.rates import is_lower_bound, max_rate_under, rate_text, unmet_text


@dataclass(frozen=True)
class Measured:
    """One deployment's highest measured rate under one SLO."""

    curve: Curve
    slo_s: float
    step: Step | None
    """The step with the highest rate meeting the SLO (rates.max_rate_under); None when none met it."""
    unmet: str = ""
    """Why the deployment did not meet the SLO (rates.unmet_text); "" when it did."""

    @property
    def rate(self) -> float:
        return self.step.achieved_rps if self.step else 0.0

    @property
    def text(self) -> str:
        """The rate as a table shows it (rates.rate_text); without one, why."""
        return self.unmet if self.step is None else rate_text(self.curve, self.step, self.slo_s)


def measure(curves: Sequence[Curve], slo_s: float) -> list[Measured]:
    """Each deployment's highest rate under the SLO, in the order given."""
    found = []
    for curve in curves:
        step = max_rate_under(curve.steps, slo_s)
        met = step is not None and step.achieved_rps > 0
        found.append(Measured(curve, slo_s, step, "" if met else unmet_text([curve], slo_s)))
    return found


@dataclass(frozen=True)
class Best:
    """One provider's best deployment under one SLO."""

    provider: str
    curve: Curve | None = None
    step: Step | None = None
    price: costs.Price | None = None
    slo_s: float | None = None
    candidates: tuple[Curve, ...] = ()
    """Every deployment of the provider that was judged: what "never meets it" must hold for."""
    group: str = ""
    """What the row stands for in tables: the provider, or "server, provider" when servers are compared."""
    unmet: str = ""
    """Why none of the candidates met the SLO (rates.unmet_text over them all); "" when one did."""

    @property
    def rate(self) -> float:
        return self.step.achieved_rps if self.step else 0.0

    @property
    def unsaturated(self) -> bool:
        """The rate is only a lower bound: the sweep ended (cap or rates ran out) before the deployment
        saturated, and this is its last rate. A curve that does not say counts as saturated."""
        return self.curve is not None and self.step is not None and is_lower_bound(self.curve, self.step)

    @property
    def cost(self) -> float | None:
        """USD per million inferences with one machine kept busy at this rate."""
        if self.price is None or self.rate <= 0:
            return None
        return self.price.per_hour / (self.rate * 3600) * 1e6


def best_per_group(measured: Sequence[Measured], prices: dict) -> list[Best]:
    """Per provider (cpu first, then device providers, then an unknown one), the deployment with the highest rate
    meeting the SLO; per server and provider, servers in order (latlab's first), when servers are compared.
    `measured`: every deployment's highest rate under the one SLO (measure)."""
    curves = [m.curve for m in measured]
    servers = by_server(curves)
    order = {name: i for i, name in enumerate(server_names(curves))}
    groups: dict[str, list[Measured]] = {}
    for found in measured:
        groups.setdefault(group_name(found.curve, servers), []).append(found)
    rows = [_best_of(group, members, prices) for group, members in groups.items()]
    return sorted(
        rows,
        key=lambda r: (
            order[server_name(r.curve)] if servers else 0,
            r.provider == UNKNOWN,
            r.provider != "cpu",
            r.provider,
        ),
    )


def _best_of(group: str, members: list[Measured], prices: dict) -> Best:
    """The group's member with the highest rate under the SLO (the first of equals); its first without one."""
    top = members[0]
    for found in members:
        if found.step is not None and found.step.achieved_rps > (top.step.achieved_rps if top.step else 0.0):
            top = found
    candidates = tuple(m.curve for m in members)
    met = top.step is not None and top.step.achieved_rps > 0
    unmet = "" if met else unmet_text(list(candidates), top.slo_s)
    return Best(
        provider_of(top.curve),
        top.curve,
        top.step if met else None,
        costs.machine_price(prices, top.curve),
        top.slo_s,
        candidates,
        group,
        unmet,
    )


def best_per_provider(curves: Sequence[Curve], slo_s: float, prices: dict) -> list[Best]:
    """best_per_group of the curves under one SLO."""
    return best_per_group(measure(curves, slo_s), prices)


def best_per_server(rows: Sequence[Best]) -> list[Best]:
    """Per server, its best row under the SLO (any provider), servers in the rows' order (latlab's first).
    `rows`: best_per_group's, of one SLO."""
    best: dict[str, Best] = {}
    for row in rows:
        server = server_name(row.curve)
        held = best.get(server)
        if held is None:
            best[server] = row
        elif row.rate > held.rate:
            best[server] = replace(row, candidates=held.candidates + row.candidates)
        else:
            best[server] = replace(held, candidates=held.candidates + row.candidates)
    return [
        row if row.rate > 0 else replace(row, unmet=unmet_text(list(row.candidates), row.slo_s))
        for row in best.values()
    ]


def best_rate_text(row: Best) -> str:
    """The best rate as the tables show it (rates.rate_text); without one, why: "never" with its evidence,
    or where the search stopped."""
    if row.rate <= 0:
        return row.unmet or "–"
    return rate_text(row.curve, row.step, row.slo_s)
