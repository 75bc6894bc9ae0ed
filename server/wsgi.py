"""Runs the app under Granian, a Rust-based WSGI server (chosen by measurement: see the README)."""

from __future__ import annotations

import ipaddress
import logging
import os
from pathlib import Path

from flask import Flask

from latlab.server.app import create_app
from latlab.server.config import AUTH_TOKEN_ENV, load_config
from latlab.server.errors import ConfigError
from latlab.server.preflight import check_deployments

CONFIG_ENV = "LATLAB_CONFIG"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
log = logging.getLogger("latlab.server.wsgi")


def app_from_env() -> Flask:
    """Granian's factory target: each worker process builds its own app from the config file.
    A deployment that fails here (past the parent's checks) ends the worker with one logged line."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    try:
        return create_app(load_config(os.environ[CONFIG_ENV]))
    except ConfigError as exc:
        log.error("%s", exc)
        raise SystemExit(2) from None


def bind_warning(host: str, auth: bool) -> str | None:
    """What to warn about when listening beyond this machine; None for loopback addresses."""
    try:
        loopback = ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if loopback:
        return None
    advice = "" if auth else f"; infer is open to them: set [server] auth_token or {AUTH_TOKEN_ENV}"
    return f"listening on {host}: reachable from other machines{advice}"


def serve(config_path: str | Path, host: str | None = None, port: int | None = None) -> None:
    """Start the server in the foreground until SIGINT/SIGTERM."""
    from granian import Granian
    from granian.constants import Interfaces

    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    config = load_config(config_path)
    check_deployments(config)
    address = host or config.host
    warning = bind_warning(address, bool(config.auth_token))
    if warning:
        log.warning(warning)
    os.environ[CONFIG_ENV] = str(Path(config_path).resolve())
    Granian(
        "latlab.server.wsgi:app_from_env",
        factory=True,
        interface=Interfaces.WSGI,
        address=address,
        port=config.port if port is None else port,
        workers=1,  # one process: the batcher must see every request to form batches
        blocking_threads=config.threads,
        log_access=False,
    ).serve()
