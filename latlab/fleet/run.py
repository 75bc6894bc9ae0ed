"""A running fleet: replicas started from their own configs, HAProxy in front, a supervisor that restarts a
replica that died, a rolling restart that loses no request, and a stop that drains the proxy first."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from latlab.common import procs
from latlab.fleet.haproxy import SERVER_TIMEOUT_S, RuntimeApi, check_config, haproxy_binary, haproxy_config
from latlab.fleet.spec import READY_PATH, FleetSpec, Replica, read_config_document, replica_document
from latlab.fleet.targets import TARGETS_FILE, write_targets
from latlab.server.command import serve_command
from latlab.server.config import load_config, save_config
from latlab.server.errors import ConfigError

READY_TIMEOUT_S = 300.0
"""Safety bound on a replica's start (loading and warming its models) and on the proxy seeing it up."""
SUPERVISE_INTERVAL_S = 0.2


@dataclass
class ReplicaProcess:
    """A replica and the process serving it now (a new one after each restart)."""

    replica: Replica
    config: Path
    log_path: Path
    process: subprocess.Popen | None = None
    restarts: int = 0
    """Restarts by the supervisor (after the process died)."""
    managed: bool = False
    """Set while the fleet itself stops or restarts it: the supervisor then leaves it alone."""
    starts: int = 0

    def start(self) -> None:
        """Start a process serving the replica's config; an earlier process's log is kept as rN.<k>.log."""
        if self.starts:
            self.log_path.replace(self.log_path.with_suffix(f".{self.starts}.log"))
        self.starts += 1
        self.process = procs.start(serve_command(self.config), log_path=self.log_path)

    def wait_ready(self) -> None:
        assert self.process is not None
        url = f"http://127.0.0.1:{self.replica.port}{READY_PATH}"
        procs.wait_ready(url, self.process, timeout_s=READY_TIMEOUT_S, log_path=self.log_path)

    def stop(self) -> None:
        if self.process is not None:
            procs.stop(self.process)


class Fleet:
    """The fleet of a FleetSpec serving the config at `config`; files (replica configs, logs, the HAProxy config,
    the targets, unless `targets` names where Prometheus watches) go to `folder`; `scratch`, a folder of its own
    elsewhere (its runtime socket's, where `folder` is too deep for one), is removed when it stops. start()
    returns when the proxy and every replica are ready; stop() drains the proxy, then stops the replicas. `say`
    receives the lines a user should see."""

    def __init__(
        self,
        spec: FleetSpec,
        config: Path,
        folder: Path,
        gpus: int = 0,
        targets: Path | None = None,
        say: Callable = print,
        scratch: Path | None = None,
    ) -> None:
        self.spec, self.folder, self.say, self.scratch = spec, folder, say, scratch
        self.api = RuntimeApi(spec.admin_socket)
        self.proxy: subprocess.Popen | None = None
        self._lock = threading.Lock()  # a replica's process is replaced by one of supervisor and roll at a time
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None
        try:
            load_config(config)  # a mistake in the config is one error now, not N replicas failing to start
        except ConfigError as exc:
            raise ConfigError(f"{config}: {exc}") from None
        doc = read_config_document(config)
        folder.mkdir(parents=True, exist_ok=True)
        self.replicas = [
            ReplicaProcess(
                r, save_config(replica_document(doc, r, gpus), folder / f"{r.name}.toml"), folder / f"{r.name}.log"
            )
            for r in spec.replicas
        ]
        self.proxy_config = folder / "haproxy.cfg"
        self.proxy_config.write_text(haproxy_config(spec))
        self.targets = write_targets(spec, targets or folder / TARGETS_FILE)

    def start(self) -> None:
        """Start every replica, wait until each is ready, then the proxy, and wait until it sees them all up."""
        check_config(self.proxy_config)
        try:
            for replica in self.replicas:
                replica.start()
            for replica in self.replicas:
                replica.wait_ready()
            self.proxy = procs.start(
                [haproxy_binary(), "-db", "-f", str(self.proxy_config)], log_path=self.folder / "haproxy.log"
            )
            self._wait_up([r.replica.name for r in self.replicas])
        except BaseException:
            self.stop()
            raise
        self._supervisor = threading.Thread(target=self._supervise, name="latlab-fleet-supervisor", daemon=True)
        self._supervisor.start()

    def stop(self) -> None:
        """Soft-stop the proxy (SIGUSR1: it stops accepting, lets requests in flight finish, within drain_s), then
        stop every replica. Safe to call twice, and on a fleet that did not finish starting."""
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join()
        if self.proxy is not None and self.proxy.poll() is None:
            os.kill(self.proxy.pid, signal.SIGUSR1)
            try:
                self.proxy.wait(self.spec.drain_s + 5)
            except subprocess.TimeoutExpired:
                procs.stop(self.proxy)
        for replica in self.replicas:
            with self._lock:
                replica.managed = True
                replica.stop()
        if not self.targets.resolve().is_relative_to(self.folder.resolve()):
            self.targets.unlink(missing_ok=True)  # Prometheus stops scraping what is gone
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def roll(self) -> None:
        """Restart the replicas one at a time, losing no request: each is drained in the proxy (no new requests),
        waited on until it holds none, put in maintenance, restarted, waited ready and put back."""
        for replica in self.replicas:
            if self._stopping.is_set():
                return
            name = replica.replica.name
            self.say(f"rolling {name}: draining")
            self.api.set_state(name, "drain")
            self._wait_idle(name)
            self.api.set_state(name, "maint")
            try:
                with self._lock:
                    replica.managed = True
                    replica.stop()
                    replica.start()
                replica.wait_ready()
            finally:  # from here the health checks decide, and the supervisor restarts it if it died
                with self._lock:
                    replica.managed = False
                self.api.set_state(name, "ready")
            self._wait_up([name])
            self.say(f"rolling {name}: back in rotation")

    def states(self) -> dict[str, str]:
        """Each replica's state as the proxy sees it (UP, DOWN, DRAIN, MAINT, ...)."""
        return {name: row["status"] for name, row in self.api.servers().items()}

    def _supervise(self) -> None:
        while not self._stopping.wait(SUPERVISE_INTERVAL_S):
            for replica in self.replicas:
                with self._lock:
                    process = replica.process
                    if replica.managed or self._stopping.is_set() or process is None or process.poll() is None:
                        continue
                    # the proxy's health checks have taken it out (or will within their fall); it comes back
                    # into rotation by itself when the checks see the new process ready
                    self.say(f"replica {replica.replica.name} exited with status {process.returncode}; restarting")
                    replica.restarts += 1
                    replica.start()

    def _wait_up(self, names: list[str]) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if self.proxy is not None and self.proxy.poll() is not None:
                tail = (self.folder / "haproxy.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"haproxy exited with status {self.proxy.returncode}:\n{tail}")
            try:
                states = self.states()
            except (FileNotFoundError, ConnectionRefusedError):  # the proxy has not opened its socket yet
                states = {}
            if all(states.get(name) == "UP" for name in names):  # "UP 1/2": not checked yet, or failing
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"haproxy does not see {names} up: {states}")
            time.sleep(0.1)

    def _wait_idle(self, name: str) -> None:
        """Until the proxy holds no request on `name` (in flight or queued for it); bounded by the proxy's own
        server timeout, past which no request can still be waiting on it."""
        deadline = time.monotonic() + SERVER_TIMEOUT_S
        while time.monotonic() < deadline:
            row = self.api.servers()[name]
            if int(row["scur"] or 0) == 0 and int(row["qcur"] or 0) == 0:
                return
            time.sleep(0.05)
