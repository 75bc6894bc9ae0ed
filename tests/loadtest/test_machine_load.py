"""Other work on the generator's machine during a step (loadtest/machine_load.py): the machine's busy cores read
from the kernel, what is left after the server's and the generator's, and when it is worth saying."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from latlab.loadtest.machine_load import MachineLoad, material, other_load, other_load_text

SPIN = (
    "import time\nend = time.process_time() + float(__import__('sys').argv[1])\nwhile time.process_time() < end: pass\n"
)


def test_the_machines_busy_cores_include_a_process_spinning_beside_it() -> None:
    load = MachineLoad()
    started = time.monotonic()
    child = subprocess.Popen([sys.executable, "-c", SPIN, "0.5"])  # half a second of one core's CPU
    _, _, usage = os.wait4(child.pid, 0)
    busy = load.busy_cores()
    span = time.monotonic() - started
    spun = usage.ru_utime + usage.ru_stime  # the child's own CPU, as the kernel counted it
    assert busy is not None and busy >= 0.9 * spun / span  # the machine was busy at least with the child
    assert busy <= (psutil.cpu_count() or 1) * 1.05


def test_other_load_is_what_the_server_and_the_generator_did_not_use_on_a_local_server() -> None:
    assert other_load(1.9, 0.6, 0.3, "http://127.0.0.1:8000") == pytest.approx(1.0)
    assert other_load(0.8, 0.6, 0.3, "http://localhost:8000") == 0.0  # reads a moment apart: never negative
    assert other_load(1.9, 0.6, 0.3, "http://10.0.0.7:8000") is None  # the server's cores are another machine's
    assert other_load(None, 0.6, 0.3, "http://127.0.0.1:8000") is None
    assert other_load(1.9, None, 0.3, "http://127.0.0.1:8000") is None
    assert other_load(1.9, 0.6, 0.3, "http://127.0.0.1:8000", fleet=True) is None  # replicas and proxy: the fleet


def test_other_load_is_said_from_a_quarter_core_or_a_tenth_of_the_machine() -> None:
    assert not material(None, 2) and not material(0.2, 2) and material(0.25, 2)
    assert not material(1.5, 16) and material(1.6, 16)
    assert other_load_text(1.6, 16) == "other load 1.6 cores" and other_load_text(0.2, 2) == ""
