"""The fleet as one typed value (FleetSpec): every replica's ports, device and threads, the proxy's ports and
policy. The HAProxy config, the Prometheus targets and the replicas' server configs are all written from it."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from latlab.common.user_input import UserError

BALANCES = ("roundrobin", "leastconn", "random(2)")
"""HAProxy's algorithms the fleet offers: round robin, least connections, and power of two choices (random(2))."""
DEVICE_PROVIDERS = ("cuda", "tensorrt")
READY_PATH = "/v2/health/ready"
"""The Open Inference Protocol's readiness route, which the server answers on its observer port too."""


@dataclass(frozen=True)
class Replica:
    """One `latlab serve` of the fleet."""

    name: str
    """HAProxy's server name and the replica's label in metrics targets: r0, r1, ..."""
    port: int
    """Its main port: infer requests, proxied."""
    metrics_port: int
    """Its observer port: /metrics and health on threads of their own (health checks and scrapes go here)."""
    device: str = "cpu"
    """"cpu", or "cuda:N" for the GPU its CUDA and TensorRT deployments run on."""
    cpu_threads: int = 0
    """ORT intra-op threads given to CPU deployments that do not set their own; 0: left as the config says."""


@dataclass(frozen=True)
class FleetSpec:
    """The fleet: its replicas and the proxy in front of them."""

    replicas: tuple[Replica, ...]
    port: int
    """Where the proxy listens for clients."""
    stats_port: int
    """The proxy's observer frontend: its Prometheus exporter on /metrics and its stats page on /stats."""
    admin_socket: Path
    """HAProxy's runtime API (a Unix socket, admin level): drain, maintenance, server states."""
    host: str = "127.0.0.1"
    """The address the proxy's client frontend binds; the replicas and the stats frontend stay on loopback."""
    balance: str = "leastconn"
    rate_limit: int = 0
    """Requests per second allowed per client IP, answered 429 with Retry-After beyond it; 0: no limit."""
    drain_s: float = 30.0
    """How long a soft stop may let requests in flight finish before the proxy closes them (hard-stop-after)."""

    def __post_init__(self) -> None:
        if self.balance not in BALANCES:
            raise UserError(f"--balance must be one of {', '.join(BALANCES)}, got {self.balance!r}")
        if not self.replicas:
            raise UserError("a fleet needs at least one replica")
        if self.rate_limit < 0:
            raise UserError(f"--rate-limit must be >= 0 requests per second, got {self.rate_limit}")


def plan_replicas(count: int, ports: list[int], cores: int, gpus: int = 0) -> tuple[Replica, ...]:
    """`count` replicas on the given ports (two per replica: main, observer): each gets an equal share of `cores`
    for its CPU deployments (at least one thread) and, with `gpus`, GPU i mod gpus for its device deployments."""
    if count < 1:
        raise UserError(f"--replicas must be >= 1, got {count}")
    if gpus < 0:
        raise UserError(f"--gpus must be >= 0, got {gpus}")
    if len(ports) != 2 * count:
        raise ValueError(f"{count} replicas need {2 * count} ports, got {len(ports)}")
    return tuple(
        Replica(
            name=f"r{i}",
            port=ports[2 * i],
            metrics_port=ports[2 * i + 1],
            device=f"cuda:{i % gpus}" if gpus else "cpu",
            cpu_threads=max(1, cores // count),
        )
        for i in range(count)
    )


def read_config_document(path: Path) -> dict[str, Any]:
    """A server config file as a document whose paths hold wherever a replica's copy is written (made absolute
    against the file's folder, as the loader would read them)."""
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"config file {path} is not valid TOML: {exc}") from None
    base = path.resolve().parent
    server = dict(doc.get("server", {}))
    if "model_dir" in server:
        server["model_dir"] = str((base / server["model_dir"]).resolve())
    deployments = []
    for raw in doc.get("deployments", []):
        deployment = dict(raw)
        if "model_path" in deployment:
            deployment["model_path"] = str((base / deployment["model_path"]).resolve())
        if isinstance(deployment.get("tokenizer"), dict) and "file" in deployment["tokenizer"]:
            deployment["tokenizer"] = {
                **deployment["tokenizer"],
                "file": str((base / deployment["tokenizer"]["file"]).resolve()),
            }
        deployments.append(deployment)
    return {**doc, "server": server, "deployments": deployments}


def replica_document(doc: dict[str, Any], replica: Replica, gpus: int) -> dict[str, Any]:
    """The server config one replica serves: the fleet's config on the replica's loopback ports, its CPU
    deployments on its share of the cores (unless they set intra_op_threads) and its device deployments on its
    GPU (when the fleet was given GPUs)."""
    server = {**doc.get("server", {}), "host": "127.0.0.1", "port": replica.port, "metrics_port": replica.metrics_port}
    deployments = []
    for raw in doc.get("deployments", []):
        deployment = dict(raw)
        provider = deployment.get("provider", "cpu")
        if provider == "cpu" and replica.cpu_threads and not deployment.get("cpu", {}).get("intra_op_threads"):
            deployment["cpu"] = {**deployment.get("cpu", {}), "intra_op_threads": replica.cpu_threads}
        if provider in DEVICE_PROVIDERS and gpus:
            deployment["cuda"] = {**deployment.get("cuda", {}), "device_id": int(replica.device.split(":")[1])}
        deployments.append(deployment)
    return {**doc, "server": server, "deployments": deployments}
