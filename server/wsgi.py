"""Runs the app under Granian, a Rust-based WSGI server (chosen by measurement: see the README)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from flask import Flask

from latlab.server.app import create_app
from latlab.server.config import ServerConfig, load_config
from latlab.server.errors import ConfigError

CONFIG_ENV = "LATLAB_CONFIG"


def app_from_env() -> Flask:
    """Granian's factory target: each worker process builds its own app from the config file."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = load_config(os.environ[CONFIG_ENV])
    return create_app(config)


def check_models(config: ServerConfig) -> None:
    """Fail in the parent, with one line, before any worker starts on a missing model file."""
    for deployment in config.deployments:
        if not Path(deployment.model_path).is_file():
            raise ConfigError(f"deployment '{deployment.name}': model file {deployment.model_path} does not exist")


def serve(config_path: str | Path, host: str | None = None, port: int | None = None) -> None:
    """Start the server in the foreground until SIGINT/SIGTERM."""
    from granian import Granian
    from granian.constants import Interfaces

    config = load_config(config_path)
    check_models(config)
    os.environ[CONFIG_ENV] = str(Path(config_path).resolve())
    Granian(
        "latlab.server.wsgi:app_from_env",
        factory=True,
        interface=Interfaces.WSGI,
        address=host or config.host,
        port=config.port if port is None else port,
        workers=1,  # one process: the batcher must see every request to form batches
        blocking_threads=config.threads,
        log_access=False,
    ).serve()
