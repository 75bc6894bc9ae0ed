"""What serving a model costs at a given sustained rate: machine prices (per machine- or per core-hour),
the staircase of machines each provider's best deployment needs, and the rate where the cheaper one changes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from latlab.loadtest.results import Curve
from latlab.report.naming import is_gpu, provider_of


@dataclass(frozen=True)
class Price:
    """USD per hour of one machine serving the deployment, and how that figure was arrived at."""

    per_hour: float
    basis: str
    """e.g. "$2.50 per machine-hour" or "$0.05 per core-hour × 16 cores"."""


def cpu_threads(curve: Curve) -> int | None:
    """The cores a CPU deployment computes on: `cpu_threads` from its environment (the lab's fair CPU share), else its
    ORT intra-op threads (0 = every core of the machine); None when nothing says."""
    environment = curve.environment or {}
    for threads in (environment.get("cpu_threads"), environment.get("intra_op_threads"), intra_op_threads(curve)):
        if threads is None:
            continue
        if int(threads) > 0:
            return int(threads)
        cores = environment.get("cores") or (curve.machine or {}).get("cores")
        return int(cores) if cores else None
    return None


def intra_op_threads(curve: Curve) -> int | None:
    """The server's ORT intra-op threads (0 = every core); None when its record does not say."""
    cpu = curve.cpu
    return cpu.intra_op_threads if cpu is not None and cpu.says("intra_op_threads") else None


def price_amount_and_unit(value: object) -> tuple[float, str]:
    """A price as given: a bare number (per machine-hour), a {"usd"/"price", "per"/"unit"} mapping or an
    object with such attributes (the parser may return either), the unit "machine-hour" or "core-hour"."""
    if isinstance(value, (int, float)):
        return float(value), "machine-hour"
    get = value.get if isinstance(value, dict) else lambda key: getattr(value, key, None)
    amount = next((get(k) for k in ("usd", "price", "amount", "per_hour") if get(k) is not None), None)
    unit = str(next((get(k) for k in ("per", "unit") if get(k) is not None), "machine-hour"))
    if amount is None:
        raise ValueError(f"cannot read a price from {value!r}")
    return float(amount), "core-hour" if "core" in unit else "machine-hour"


def machine_price(prices: dict, curve: Curve) -> Price | None:
    """The hourly price of one machine running `curve`'s deployment; None without a price for its provider.
    A core-hour price is charged for the cores a CPU deployment computes on (cpu_threads)."""
    provider = provider_of(curve)
    # TensorRT runs on the CUDA machine: without a price of its own it costs what that machine costs.
    value = prices.get(provider, prices.get("cuda") if provider == "tensorrt" else None)
    if value is None:
        return None
    amount, unit = price_amount_and_unit(value)
    if unit == "machine-hour":
        return Price(amount, f"${amount:.2f} per machine-hour")
    cores = cpu_threads(curve) if not is_gpu(curve) else None
    if cores is None:
        return Price(amount, f"${amount:.2f} per core-hour, core count unknown: priced as one core")
    return Price(amount * cores, f"${amount:.3g} per core-hour × {cores} cores")


def price_unit(prices: dict) -> str:
    """How the prices were given, in words, for the report."""
    units = {price_amount_and_unit(v)[1] for v in prices.values()}
    return " and ".join(sorted(f"per {u}" for u in units)) or "none given"


def fleet_cost_per_million(rate_rps: float, capacity_rps: float, price_per_hour: float) -> float:
    """USD per million inferences at `rate_rps` sustained by ceil(rate / capacity) machines, each able to
    serve `capacity_rps` within the SLO (the staircase: a second machine is paid in full from its first request)."""
    machines = math.ceil(rate_rps / capacity_rps)
    return machines * price_per_hour / (rate_rps * 3600) * 1e6


def rate_grid(top_rps: float, points: int = 400) -> list[float]:
    """Rates from 1 req/s to `top_rps`, evenly spaced on a log scale: dense enough that the staircase's
    steps show in a picture and a crossover is found within ~2%."""
    top = max(top_rps, 2.0)
    return [math.exp(math.log(top) * i / (points - 1)) for i in range(points)]


def crossover(cpu: tuple[float, float], gpu: tuple[float, float], top_rps: float) -> dict:
    """Where the cheaper provider changes, for (capacity req/s, USD/h) of the CPU's and the GPU's best
    deployment, over rates up to `top_rps`. Returns {"cheaper_low": "cpu"|"gpu", "from_rps": R or None,
    "cheaper_high": ...}: the provider cheaper at 1 req/s, and the lowest rate from which the other one stays
    cheaper up to top_rps (None when it never does)."""
    grid = rate_grid(top_rps)
    cheaper = ["gpu" if fleet_cost_per_million(r, *gpu) < fleet_cost_per_million(r, *cpu) else "cpu" for r in grid]
    low = cheaper[0]
    from_rps = None
    for rate, who in zip(reversed(grid), reversed(cheaper)):  # walk down while the other one stays cheaper
        if who == low:
            break
        from_rps = rate
    return {"cheaper_low": low, "from_rps": from_rps, "cheaper_high": cheaper[-1] if from_rps else low}
