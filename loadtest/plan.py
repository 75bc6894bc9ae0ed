"""What a sweep is asked to do (`SweepPlan`): the deployments and loads, the step timing, the SLO searches, the
generator's workers and what the results record. A plain value: the sweep, the driver and the CLI share it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from latlab.loadtest.confidence import DEFAULT_CONFIDENCE


@dataclass
class SweepPlan:
    """What to load and how. `loads` are offered rates (open loop) or user counts (closed loop);
    with `slo_p99_s` and `search`, loads[0] is where the SLO search starts."""

    host: str
    deployments: list[str]
    loads: list[float]
    mode: str = "open"
    warmup_seconds: float = 2.0
    calibrate_seconds: float = 0.0
    """Open loop: measure the generator's floor for this long per rate before the first deployment (floor.py)."""
    window_seconds: float = 2.0
    min_windows: int = 3
    max_windows: int = 6
    poisson: bool = True
    binary: bool = False
    """Send tensors with the binary tensor extension (and ask for binary outputs) instead of JSON."""
    seq_len: int = 8
    """Length of every dynamic non-batch input dimension (e.g. tokens per sequence)."""
    client: str = "lean"
    """The generator's HTTP client for infer requests: "lean" or "locust" (see PayloadOptions)."""
    text: bool = False
    """Every deployment must take text; sentences of seq_len tokens are sent (see PayloadOptions)."""
    seq_len_max: int = 0
    """Above seq_len: sentence lengths drawn uniformly from seq_len..seq_len_max tokens."""
    inputs: str = ""
    """An .npz of sample inputs sent instead of random ones, one request per row (see PayloadOptions)."""
    stop_at_saturation: bool = True
    machine_name: str | None = None
    """What reports call the machine (default: its CPU model, or the GPU of a GPU deployment)."""
    max_rate: float = 0.0
    """Open loop: past the listed rates keep raising by RAISE_BY until the deployment saturates, breaks the
    SLO or errs, up to this cap (0: stop at the last listed rate). A maximum never reached is recorded as
    such (`saturated: false`), never as the deployment's capacity."""
    refine_within: float = 0.1
    """With max_rate, after a failed step: bisect between the last rate met and the first failed until they
    are within this fraction of the former (0.1: about three more steps; 0.3: one)."""
    max_error_ratio: float = 0.01
    slos_s: tuple[float, ...] = ()
    """Open loop: after the sweep, find each of these SLOs' highest rate to within `resolution`, searching
    between the last rate that met it and the first that broke it, and below the first step when that one
    broke it; "never" only with the single-request evidence (see single.py)."""
    confidence: float = DEFAULT_CONFIDENCE
    """The level of each step's percentile intervals and SLO decisions (`confidence` in the results)."""
    decide_windows: int = 6
    """With slos_s: a step whose p99 is undecided for one of them (loadtest/confidence.py) gets up to this many
    more windows before its figures are read, while they could decide it (0: never)."""
    resolution: float = 0.1
    """The SLO brackets' width: (first rate broken - last rate met) / last rate met."""
    max_slo_steps: int = 12
    """At most this many extra steps per deployment for the SLO brackets (each says when it ran out)."""
    max_slo_seconds: float = 0.0
    """No SLO bracket step starts after this many seconds of them per deployment (0: no time budget)."""
    slo_p99_s: float | None = None
    slo_margin: float = 2.0
    search: bool = False
    search_resolution: float = 0.05
    search_floor: float = 1.0
    """The SLO search halves the rate no further than this (req/s): below it a deployment counts as meeting the
    bound at no rate (a tuning probe ranks, and need not resolve what holds a tiny fraction of the best)."""
    search_growth: float = 2.0
    """The SLO search raises a passing rate by this factor until the bound breaks (search.slo_search)."""
    users_per_process: int = 1
    workers: int = 0
    expect_workers: int = 0
    master_bind_host: str = "127.0.0.1"
    master_port: int = 5557
    metrics_port: int | None = None
    log_dir: Path | None = None
    queue_sample_seconds: float = 0.0
    """Sample the server's queue depth this often during each step (0: off; each scrape costs the server
    a few ms of its interpreter lock, so plain sweeps leave it off)."""
    provider: str = ""
    """What the deployments compute on ("cpu", "cuda"), recorded where the server does not say (any server other than
    latlab's, unless its Triton model config tells); empty: the record has no provider (the report says unknown)."""
    server_metrics: str = ""
    """Where the server's own figures are read: a Prometheus text URL (latlab's series or Triton's nv_inference_*
    counters); empty: the server's /metrics (on latlab's observer port when it has one), if it answers."""
