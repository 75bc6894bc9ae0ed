"""Other work on the machine during a step: the whole machine's busy cores (every process, from the kernel's CPU
times), less the server's and the load generator's own. On a machine shared with other jobs this is what can set a
step's tail without the server or the generator being the cause; the step records it and says so where it is
material (MaterialOtherLoad)."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import psutil

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


class MachineLoad:
    """The machine's busy cores between one read and the next: CPU time in user, system and interrupt work summed
    over every core (idle, I/O wait, time stolen by a hypervisor and guests' time, already in user, left out),
    over the wall time between the reads."""

    def __init__(self) -> None:
        self._last = _busy_now()

    def busy_cores(self) -> float | None:
        """Busy cores since the last read (None for a span too short to tell)."""
        now = _busy_now()
        (t0, busy0), (t1, busy1) = self._last, now
        self._last = now
        return (busy1 - busy0) / (t1 - t0) if t1 - t0 > 0.05 else None


def _busy_now() -> tuple[float, float]:
    times = psutil.cpu_times()
    busy = times.user + times.system + sum(getattr(times, name, 0.0) for name in ("nice", "irq", "softirq"))
    return time.monotonic(), busy


def other_load(
    busy_cores: float | None,
    server_cores: float | None,
    generator_cores: float | None,
    host: str,
    fleet: bool = False,
) -> float | None:
    """Cores the machine spent on work other than the server and the generator during a step; None where the
    server is not on this machine, a figure is missing, or the load goes through a fleet (the server's figures are
    then one replica's, and the other replicas and the proxy are the fleet itself, no third party). Never below 0
    (the reads are not simultaneous)."""
    if busy_cores is None or server_cores is None or generator_cores is None or fleet:
        return None
    if urlsplit(host).hostname not in LOCAL_HOSTS:
        return None
    return max(0.0, busy_cores - server_cores - generator_cores)


def material(other_cores: float | None, cores: int | None = None) -> bool:
    """Whether other work took enough of the machine to matter to a step: a quarter of a core, or a tenth of the
    machine's cores where that is more."""
    if other_cores is None:
        return False
    return other_cores >= max(0.25, 0.1 * (cores or psutil.cpu_count() or 1))


def other_load_text(other_cores: float | None, cores: int | None = None) -> str:
    """'other load 1.2 cores' where it is material, else ''."""
    return f"other load {other_cores:.1f} cores" if material(other_cores, cores) else ""
