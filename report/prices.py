"""The prices a report is given: `--price` read into hourly prices per provider (per machine-hour, or per
core-hour for a CPU deployment), and the example prices used when none are given."""

from __future__ import annotations

import math

DEFAULT_PRICES = {"cpu": 0.10, "cuda": 2.50}
"""Example hourly prices (USD) per provider, used when the user gives none; the report says so."""


class PriceError(ValueError):
    """An unreadable --price argument."""


PRICE_UNITS = {
    "": "machine-hour",
    "machine": "machine-hour",
    "machine-hour": "machine-hour",
    "core": "core-hour",
    "core-hour": "core-hour",
}


def parse_prices(text: str) -> dict[str, float | dict]:
    """'cpu=0.10,cuda=2.50' -> {'cpu': 0.1, 'cuda': 2.5} (USD per machine-hour per provider);
    'cpu=0.04/core' -> {'cpu': {'usd': 0.04, 'per': 'core-hour'}}: charged per core a CPU deployment uses."""
    prices: dict[str, float | dict] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        provider, sep, value = part.partition("=")
        amount, _, unit = value.partition("/")
        try:
            price = float(amount)
        except ValueError:
            price = math.nan
        per = PRICE_UNITS.get(unit.strip().lower())
        if not sep or not provider.strip() or not 0 < price < math.inf or per is None:
            raise PriceError(
                f"--price: cannot read {part!r}; write provider=USD per machine-hour, or USD/core "
                "per core-hour, e.g. cpu=0.10,cuda=2.50 or cpu=0.04/core,cuda=2.50"
            )
        prices[provider.strip().lower()] = price if per == "machine-hour" else {"usd": price, "per": per}
    if not prices:
        raise PriceError("--price needs at least one provider=price, e.g. cpu=0.10,cuda=2.50")
    return prices
