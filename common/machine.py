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


IDENTITY = ("hostname", "cpu", "cores")
"""What tells recorded machines apart: hostnames repeat (every lab VM is `vm`), CPU model and cores less so."""


def key(machine: dict) -> str:
    """Which machine a result came from, as a dict key (e.g. serving overhead per machine)."""
    return "|".join(str(machine.get(k, "?")) for k in IDENTITY)


def same(a: dict, b: dict) -> bool:
    """Whether two recorded machines are one: the same hostname, and the same CPU model and core count
    wherever both recorded them."""
    return bool(a.get("hostname")) and all(
        a[k] == b[k] for k in IDENTITY if a.get(k) is not None and b.get(k) is not None
    )
