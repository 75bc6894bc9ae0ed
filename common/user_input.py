"""What the user writes for a load, read once into numbers: offered rates ('100,200,400', req/s) and p99 bounds
('25ms,0.1s', seconds; a list of them is `Slos`). A mistake is a UserError: one line the user can act on (the CLI
prints it and exits 2)."""

from __future__ import annotations

from dataclasses import dataclass


class UserError(Exception):
    """A mistake the user can fix; printed as one line, exit status 2."""


def parse_rates(text: str) -> list[float]:
    try:
        rates = [float(r) for r in text.split(",") if r.strip()]
    except ValueError:
        raise UserError(f"--rates must be numbers separated by commas, got {text!r}") from None
    if not rates or not all(0 < r < float("inf") for r in rates):
        raise UserError(f"--rates must be positive finite numbers, got {text!r}")
    return rates


def parse_slos(text: str) -> list[float]:
    """'25ms,0.1s,50' -> seconds (a bare number is milliseconds)."""
    slos = []
    for part in (p.strip().lower() for p in text.split(",") if p.strip()):
        scale, number = (
            (1.0, part[:-1]) if part.endswith("s") and not part.endswith("ms") else (1e-3, part.removesuffix("ms"))
        )
        try:
            value = float(number) * scale
        except ValueError:
            value = float("nan")
        if not 0 < value < float("inf"):
            raise UserError(f"--slo: cannot read {part!r}; write positive bounds, e.g. 25ms or 0.1s")
        slos.append(value)
    if not slos:
        raise UserError("--slo needs at least one bound, e.g. 25ms,50ms")
    return slos


def parse_slo_bound(text: str) -> float:
    """'p99=50ms' (or just '50ms') -> seconds."""
    metric, _, bound = text.rpartition("=")
    if metric and metric.strip().lower() != "p99":
        raise UserError(f"--slo: only p99 bounds are supported, got {text!r}")
    return parse_slos(bound)[0]


@dataclass(frozen=True)
class Slos:
    """p99 bounds in seconds, read once from what the user wrote ('10ms,25ms'), in the order written (the
    report's columns follow it). Empty: no bound."""

    seconds: tuple[float, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Slos:
        """'25ms,0.1s,50' -> Slos((0.025, 0.1, 0.05)); UserError on anything else (parse_slos)."""
        return cls(tuple(parse_slos(text)))

    def __bool__(self) -> bool:
        return bool(self.seconds)

    def ascending(self) -> Slos:
        return Slos(tuple(sorted(self.seconds)))

    @property
    def largest(self) -> float:
        return max(self.seconds)

    @property
    def middle(self) -> float:
        """The bound in the middle of the list as written (the upper middle of an even count)."""
        return self.seconds[len(self.seconds) // 2]
