"""What machine a number came from: CPU model, cores, memory, OS (no heavy imports)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import psutil


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe(name: str | None = None) -> dict:
    """The machine; `name` (e.g. --machine-name) is what reports call it, else its GPU or CPU model: the
    hostname is recorded, never shown (every lab VM is called `vm`)."""
    return {
        **({"name": name} if name else {}),
        "hostname": platform.node(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
    }


def key(machine: dict) -> str:
    """Which machine a result came from, for matching a bench to the runs of the same machine: hostnames
    repeat (every lab VM is `vm`), so the CPU model and core count are part of it."""
    return "|".join(str(machine.get(k, "?")) for k in IDENTITY)


IDENTITY = ("hostname", "cpu", "cores")


def same(a: dict, b: dict) -> bool:
    """Whether two recorded machines are one: the same hostname, and the same CPU model and core count
    wherever both recorded them."""
    return bool(a.get("hostname")) and all(a[k] == b[k] for k in IDENTITY if a.get(k) is not None
                                           and b.get(k) is not None)
