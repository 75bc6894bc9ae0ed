"""HAProxy for a fleet: its config written from a FleetSpec (the one writer), `haproxy -c` on it, and its runtime
API (a Unix socket) for server states and counts."""

from __future__ import annotations

import csv
import shutil
import socket
import subprocess
from pathlib import Path

from latlab.common.user_input import UserError
from latlab.fleet.spec import READY_PATH, FleetSpec

BACKEND = "replicas"
FRONTEND = "fleet"
SERVER_TIMEOUT_S = 60
"""Longest a replica may take to answer: above the server's own request bound (batcher timeout_ms, 10 s by
default), so a slow answer is the server's timeout error, not the proxy's 504; a dead replica's requests end
sooner, when their connection closes."""
CHECK_INTERVAL_MS = 500
"""Health checks per replica: a dead one is out of rotation after FALL failed checks, a new one in after RISE."""
FALL, RISE = 2, 2
RETRY_AFTER_S = 1
"""The rate limit's period: a refused client may try again after it."""


def haproxy_config(spec: FleetSpec) -> str:
    """The HAProxy config of the fleet: a client frontend (optionally rate limited per client IP), one backend of
    the replicas with readiness checks, and a stats frontend with the Prometheus exporter."""
    return "\n".join([*_global(spec), *_frontend(spec), *_backend(spec), *_stats(spec)]) + "\n"


def _global(spec: FleetSpec) -> list[str]:
    return [
        "global",
        f"    stats socket {spec.admin_socket} mode 600 level admin",
        "    stats timeout 10s",
        # a soft stop (SIGUSR1) lets requests in flight finish, but never longer than this
        f"    hard-stop-after {int(spec.drain_s * 1000)}ms",
        "",
        "defaults",
        "    mode http",
        "    timeout connect 2s",
        "    timeout client 60s",
        f"    timeout server {SERVER_TIMEOUT_S}s",
        "    timeout queue 10s",
        "    timeout http-request 10s",
        "    timeout http-keep-alive 10s",
        "    timeout check 2s",
        # retry only a connection that failed (nothing was sent): an infer request is never sent twice
        "    retries 2",
        "    retry-on conn-failure",
        "    option redispatch 1",
        "",
    ]


def _frontend(spec: FleetSpec) -> list[str]:
    lines = [f"frontend {FRONTEND}", f"    bind {spec.host}:{spec.port}"]
    if spec.rate_limit:
        message = f'{{"error": "more than {spec.rate_limit} requests per second from this client"}}'
        lines += [
            "    stick-table type ip size 100k expire 30s store http_req_rate(1s)",
            "    http-request track-sc0 src",
            f"    http-request return status 429 content-type application/json string '{message}' "
            f"hdr Retry-After {RETRY_AFTER_S} if {{ sc_http_req_rate(0) gt {spec.rate_limit} }}",
        ]
    return [*lines, f"    default_backend {BACKEND}", ""]


def _backend(spec: FleetSpec) -> list[str]:
    lines = [
        f"backend {BACKEND}",
        f"    balance {spec.balance}",
        "    option httpchk",
        f"    http-check send meth GET uri {READY_PATH}",
        "    http-check expect status 200",
        # idle connections to a replica are shared between clients, but never for a client's first request,
        # which could not be retried if the replica closed that connection meanwhile
        "    http-reuse safe",
        f"    default-server check inter {CHECK_INTERVAL_MS}ms fall {FALL} rise {RISE}",
    ]
    # checks go to the observer port: a replica busy with infer requests still answers them at once
    lines += [f"    server {r.name} 127.0.0.1:{r.port} port {r.metrics_port}" for r in spec.replicas]
    return [*lines, ""]


def _stats(spec: FleetSpec) -> list[str]:
    return [
        "frontend stats",
        f"    bind 127.0.0.1:{spec.stats_port}",
        "    http-request use-service prometheus-exporter if { path /metrics }",
        "    stats enable",
        "    stats uri /stats",
        "    stats refresh 5s",
    ]


def haproxy_binary() -> str:
    """The haproxy executable, or a UserError saying how to get it."""
    binary = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
    if not binary:
        raise UserError("haproxy not found: install Debian's haproxy (apt-get install haproxy; `make test` tries)")
    return binary


def check_config(path: Path) -> None:
    """`haproxy -c -f path`; a UserError with haproxy's own words when it refuses the config."""
    result = subprocess.run([haproxy_binary(), "-c", "-f", str(path)], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise UserError(f"haproxy refused {path}:\n{result.stdout}{result.stderr}")


class RuntimeApi:
    """HAProxy's runtime API on its admin socket: one command per connection."""

    def __init__(self, path: Path, timeout_s: float = 5.0) -> None:
        self.path, self.timeout_s = path, timeout_s

    def command(self, line: str) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(self.timeout_s)
            sock.connect(str(self.path))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def servers(self) -> dict[str, dict[str, str]]:
        """`show stat` of the replicas' backend, by server name: status (UP, DOWN, DRAIN, MAINT, ...), scur
        (requests in flight), qcur (queued), and HAProxy's other columns."""
        text = self.command("show stat").lstrip("# ")
        rows = csv.DictReader(text.splitlines())
        return {row["svname"]: row for row in rows if row["pxname"] == BACKEND and row["svname"] != "BACKEND"}

    def set_state(self, server: str, state: str) -> None:
        """`set server replicas/<server> state ready|drain|maint`."""
        answer = self.command(f"set server {BACKEND}/{server} state {state}").strip()
        if answer:
            raise RuntimeError(f"haproxy refused to set {server} {state}: {answer}")
