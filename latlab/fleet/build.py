"""A Fleet from `latlab fleet`'s options (or the lab's): free ports for the replicas, their share of the cores."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Callable

from latlab.common import procs
from latlab.common.user_input import UserError
from latlab.fleet.run import Fleet
from latlab.fleet.spec import FleetSpec, plan_replicas

MAX_SOCKET_PATH = 97
"""Longest runtime socket path HAProxy takes (sun_path's 108 bytes, less the temporary suffix it binds under)."""


def build_fleet(
    config: Path,
    folder: Path,
    cores: int,
    replicas: int = 2,
    port: int = 8000,
    stats_port: int | None = None,
    host: str = "127.0.0.1",
    balance: str = "leastconn",
    rate_limit: int = 0,
    gpus: int = 0,
    targets: Path | None = None,
    say: Callable = print,
) -> Fleet:
    """The fleet the options describe (not started): replicas on free loopback ports, each with an equal share
    of `cores` for the CPU deployments that do not set their threads; the proxy on `port`, its exporter on
    `stats_port` (default port + 1); the Prometheus targets at `targets` (default: in `folder`)."""
    stats_port = port + 1 if stats_port is None else stats_port
    for wanted in (port, stats_port):
        if not procs.port_free(wanted):
            raise UserError(f"port {wanted} is taken: choose another with --port / --stats-port")
    socket, scratch = folder.resolve() / "haproxy.sock", None
    if len(str(socket).encode()) > MAX_SOCKET_PATH:  # a deep folder (a lab's run folder): a private one of its own
        scratch = Path(tempfile.mkdtemp(prefix="latlab-fleet-"))
        socket = scratch / "haproxy.sock"
    ports = _free_ports(2 * replicas, taken={port, stats_port}) if replicas >= 1 else []
    try:
        spec = FleetSpec(
            replicas=plan_replicas(replicas, ports, cores, gpus),
            port=port,
            stats_port=stats_port,
            admin_socket=socket,
            host=host,
            balance=balance,
            rate_limit=rate_limit,
        )
        return Fleet(spec, config, folder, gpus=gpus, targets=targets, say=say, scratch=scratch)
    except BaseException:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        raise


def _free_ports(count: int, taken: set[int]) -> list[int]:
    """`count` distinct free ports, none of `taken` (the OS may hand out a port twice between calls)."""
    ports: list[int] = []
    while len(ports) < count:
        port = procs.free_port()
        if port not in taken and port not in ports:
            ports.append(port)
    return ports
