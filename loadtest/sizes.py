"""How long each request is: the size of the dynamic axes after the batch (a text request's tokens), fixed or drawn
per request from a distribution (uniform, log-normal by its median and 99th percentile) or taken from a replayed
trace's column, row for row with its arrivals; capped at the deployment's maximum, and how often said.

Production requests are not all one length: a batch pads its rows to its longest (docs/serving.md, the padding
counters), which a CPU serving one request at a time never pays, so the lengths decide CPU against GPU as much as
the rate does. A log-normal is the usual fit of prompt lengths (its median and tail given as the user knows them);
a trace's own column keeps the lengths with the times they arrived at."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Iterator

from latlab.common.user_input import UserError

KINDS = ("fixed", "uniform", "lognormal", "trace")
SPEC_HELP = "N, uniform:LO:HI, lognormal:P50:P99 or trace:COLUMN (a column of the --trace file)"
Z99 = 2.3263478740408408
"""The standard normal's 99th percentile: a log-normal's sigma is ln(P99 / P50) / Z99."""
AXIS = "seq"
"""The one axis name `--dim` takes in a load test: every dynamic axis after the batch (the server's metadata names
none), and a text request's tokens."""


@dataclass(frozen=True)
class Sizes:
    """Each request's size along the dynamic axes after the batch."""

    kind: str = "fixed"
    low: float = 8.0
    """fixed: the size; uniform: the smallest; lognormal: the median."""
    high: float = 0.0
    """uniform: the largest; lognormal: the 99th percentile."""
    column: str = ""
    """trace: the column of the replayed trace that gives each request's size."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UserError(f"--dim {AXIS}={self.kind}: not one of {SPEC_HELP}")
        if self.kind == "trace":
            if not self.column:
                raise UserError(f"--dim {AXIS}=trace:COLUMN needs the name of a column of the --trace file")
            return
        if not (self.low >= 1 and self.low == int(self.low)):
            raise UserError(f"--dim {AXIS}={self.spec}: sizes are whole numbers >= 1")
        if self.kind == "uniform" and not (self.high >= self.low and self.high == int(self.high)):
            raise UserError(f"--dim {AXIS}={self.spec}: uniform:LO:HI needs a whole HI >= LO")
        if self.kind == "lognormal" and not (self.low < self.high < math.inf):
            raise UserError(f"--dim {AXIS}={self.spec}: lognormal:P50:P99 needs P99 above P50")

    @classmethod
    def parse(cls, spec: str) -> Sizes:
        """`N`, `uniform:LO:HI`, `lognormal:P50:P99` or `trace:COLUMN`, as the user writes it."""
        kind, _, rest = spec.strip().partition(":")
        kind = kind.strip().lower()
        if kind == "trace":
            return cls("trace", column=rest.strip())
        try:
            numbers = [float(x) for x in rest.split(":")] if rest else []
            if not rest:
                return cls("fixed", low=float(kind))
        except ValueError:
            raise UserError(f"--dim {AXIS}={spec!r}: not one of {SPEC_HELP}") from None
        if kind in ("uniform", "lognormal") and len(numbers) == 2:
            return cls(kind, low=numbers[0], high=numbers[1])
        raise UserError(f"--dim {AXIS}={spec!r}: not one of {SPEC_HELP}")

    @classmethod
    def of(cls, seq_len: int, seq_len_max: int = 0, spec: str = "") -> Sizes:
        """The sizes a payload asks for: its spec, else --seq-len (uniform up to --seq-len-max where that is above)."""
        if spec:
            return cls.parse(spec)
        if seq_len_max > seq_len:
            return cls("uniform", low=seq_len, high=seq_len_max)
        return cls("fixed", low=seq_len)

    @property
    def spec(self) -> str:
        """What parse() reads back, and what results call these sizes."""
        if self.kind == "fixed":
            return f"{self.low:g}"
        if self.kind == "trace":
            return f"trace:{self.column}"
        return f"{self.kind}:{self.low:g}:{self.high:g}"

    @property
    def varies(self) -> bool:
        return self.kind != "fixed" and not (self.kind == "uniform" and self.low == self.high)

    @property
    def sigma(self) -> float:
        """lognormal: the standard deviation of the sizes' logarithm."""
        return math.log(self.high / self.low) / Z99

    def column_values(self, columns: dict[str, tuple[float, ...]], path: str) -> tuple[int, ...]:
        """trace: the column's sizes, each a whole number >= 1; UserError naming the request (row of data) where
        one is missing or is not, or the columns there are."""
        if self.column not in columns:
            raise UserError(
                f"--dim {AXIS}=trace:{self.column}: {path} has no numeric column {self.column!r}; "
                f"its columns: {', '.join(columns) or 'none besides the timestamp'}"
            )
        values = columns[self.column]
        for k, value in enumerate(values):
            if not (value >= 1 and value == int(value)):
                raise UserError(
                    f"{path}: request {k + 1} (data row {k + 1}) has {self.column} = {value:g}: "
                    f"--dim {AXIS}=trace:{self.column} needs a whole number >= 1 in every row"
                )
        return tuple(int(v) for v in values)

    def draws(self, seed: int, rows: Iterator[int] | None = None, column: tuple[int, ...] = ()) -> Iterator[int]:
        """Each request's size in the order the sender sends, without end: drawn from `seed` (one stream per sender),
        or, for a trace, the column's value of each row the sender replays (`rows`, aligned with its times)."""
        if self.kind == "trace":
            rows = rows if rows is not None else itertools.cycle(range(len(column)))
            return (column[row] for row in rows)
        rng = random.Random(seed)
        if self.kind == "uniform":
            low, high = int(self.low), int(self.high)
            return (rng.randint(low, high) for _ in itertools.count())
        if self.kind == "lognormal":
            mu, sigma = math.log(self.low), self.sigma
            return (max(1, round(rng.lognormvariate(mu, sigma))) for _ in itertools.count())
        return itertools.repeat(int(self.low))

    def share_above(self, cap: int, column: tuple[int, ...] = ()) -> float:
        """The share of requests longer than `cap` (sent at the cap): exact for the distributions, over the column
        for a trace."""
        if self.kind == "fixed":
            return float(self.low > cap)
        if self.kind == "uniform":
            return max(0.0, min(1.0, (self.high - cap) / (self.high - self.low + 1)))
        if self.kind == "lognormal":  # P(round(X) > cap) = P(X >= cap + 0.5)
            return 0.5 * math.erfc((math.log(cap + 0.5) - math.log(self.low)) / (self.sigma * math.sqrt(2)))
        return sum(v > cap for v in column) / len(column) if column else 0.0


def max_length(metadata: dict) -> int:
    """The most tokens a text deployment takes (its tokenizer's max_length, from its metadata); 0 when it does not
    say."""
    value = (metadata.get("parameters") or {}).get("max_length", 0)
    return value if isinstance(value, int) and value > 0 else 0


def truncation_line(sizes: Sizes, deployment: str, cap: int, column: tuple[int, ...] = ()) -> str | None:
    """What a run says when some requests would be longer than the deployment takes; None when none would."""
    share = sizes.share_above(cap, column)
    if share <= 0:
        return None
    return (
        f"{deployment}: {share:.1%} of the sizes {sizes.spec} are above its maximum of {cap} tokens; "
        f"those requests are sent at {cap}"
    )
