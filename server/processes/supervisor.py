"""The engine's supervisor, in the process that runs Granian's front ends: it starts the engine, restarts it when
it dies (front ends meanwhile answer 503 and say not ready: server/processes/frontend.py), and stops it last, after the
front ends have drained, so that every request they hold is answered."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from prometheus_client.multiprocess import mark_process_dead

from latlab.server.processes.engine import DRAIN_LIMIT_S
from latlab.server.processes.shared import EngineStatus, SharedAdmission, metrics_folder

log = logging.getLogger("latlab.server.processes.supervisor")
RESTART_DELAYS_S = (0.2, 1.0, 2.0, 5.0, 10.0)
"""Waits before restarting an engine that died, longer each time it dies again within STABLE_S of starting."""
STABLE_S = 30.0


def run_folder(deployments: int, engines: int = 1) -> Path:
    """A fresh folder for the engines' sockets, the shared status and admission files, and the metrics files."""
    folder = Path(tempfile.mkdtemp(prefix="latlab-serve-"))
    Path(metrics_folder(folder)).mkdir()
    for index in range(engines):
        EngineStatus(folder, index, create=True).close()
    SharedAdmission(folder, deployments, create=True).close()
    return folder


class EngineFailed(Exception):
    """The engine exited (or never said ready) at start. Exit code 2: a config or model it could not load, said
    in its one logged line; anything else (a crash) is not said yet."""

    def __init__(self, code: int | None) -> None:
        super().__init__(f"the engine process could not start (exit code {code})")
        self.code = code


class Supervisor:
    """Engine `index` of a config (engine_groups), kept running until stop()."""

    def __init__(self, config_path: str | Path, run_dir: Path, observer: str, index: int = 0) -> None:
        self.command = [
            sys.executable,
            "-m",
            "latlab.server.processes.engine",
            str(config_path),
            str(run_dir),
            observer,
            str(index),
        ]
        self.run_dir = run_dir
        self.status = EngineStatus(run_dir, index)
        self.process: subprocess.Popen | None = None
        self.restarts = 0
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    def start(self, wait_s: float = 600.0) -> None:
        """Start the engine and wait until it serves; EngineFailed when it exits first."""
        self._spawn()
        if not self._wait_ready(wait_s):
            code = self.process.poll()
            self.stop()
            raise EngineFailed(code)
        self._watcher = threading.Thread(target=self._watch, name="latlab-engine-supervisor", daemon=True)
        self._watcher.start()

    def _spawn(self) -> None:
        # A session of its own: a Ctrl-C at the terminal reaches the front ends, and the engine stops after them.
        self.process = subprocess.Popen(self.command, start_new_session=True)
        self.status.starting(self.process.pid)

    def _wait_ready(self, wait_s: float) -> bool:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not self._stopping.is_set():
            if self.status.ready:
                return True
            if self.process.poll() is not None:
                return False
            time.sleep(0.02)
        return False

    def _watch(self) -> None:
        delays = iter(RESTART_DELAYS_S)
        while True:
            started = time.monotonic()
            code = self.process.wait()
            if self._stopping.is_set():
                return
            self.status.down()
            mark_process_dead(self.process.pid, metrics_folder(self.run_dir))
            if time.monotonic() - started > STABLE_S:
                delays = iter(RESTART_DELAYS_S)
            delay = next(delays, RESTART_DELAYS_S[-1])
            log.error(
                "the engine process %d exited (code %s); front ends answer 503 until it is back; restarting in %.1f s",
                self.process.pid,
                code,
                delay,
            )
            if self._stopping.wait(delay):
                return
            self.restarts += 1
            self._spawn()
            self._wait_ready(600.0)

    def stop(self) -> None:
        """Stop the engine: SIGTERM (it answers what it holds), then SIGKILL past its drain limit. Once."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(DRAIN_LIMIT_S + 5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.status.down()
        if self._watcher is not None:
            self._watcher.join(5)
        self.status.close()
