"""Runs the app under Granian, a Rust-based WSGI server (chosen by measurement: see the README)."""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import shutil
import signal
from pathlib import Path
from typing import Callable, Iterable

from flask import Flask

from latlab.common.settings import admitted_bound
from latlab.server.config import (
    AUTH_TOKEN_ENV,
    FRONTENDS_ENV,
    ServerConfig,
    engine_groups,
    served_config,
    served_interface,
)
from latlab.server.errors import ConfigError
from latlab.server.http.app import create_app
from latlab.server.http.observer import Observer, observer_port
from latlab.server.http.rsgi import RsgiApp
from latlab.server.processes.frontend import create_frontend_app
from latlab.server.processes.shared import CONFIG_ENV, LOG_FORMAT, RUN_DIR_ENV
from latlab.server.processes.supervisor import EngineFailed, Supervisor, run_folder
from latlab.server.runtime.preflight import check_deployments

OBSERVER_ENV = "LATLAB_OBSERVER_ADDRESS"
"""host:port of the observer listener, chosen by serve() for the worker process it starts."""
FRONTEND_RESPAWN_S = 0.5
"""How soon Granian replaces a front-end process that died."""
MAX_CONNECTIONS = 4096
"""Connections held open at once (Granian's backpressure): far more than any deployment admits requests, so
that admission, which refuses, bounds first, not this, which leaves a connection waiting unaccepted."""
log = logging.getLogger("latlab.server.processes.wsgi")
WSGIApp = Callable[[dict, Callable], Iterable[bytes]]


def app_from_env() -> Flask | WSGIApp | RsgiApp:
    """Granian's factory target: each worker process builds its own app from the config file, and starts the
    observer listener beside it (serve() chose its address). A deployment that fails here (past the parent's
    checks), or an observer port taken since, ends the worker with one logged line."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    try:
        config = served_config(os.environ[CONFIG_ENV])
        if os.environ.get(RUN_DIR_ENV):  # a front end of a multi-front-end server: the engine holds the models
            return create_frontend_app(config, Path(os.environ[RUN_DIR_ENV]))
        host, port = _observer_address(config)
        app = create_app(dataclasses.replace(config, metrics_port=port))
        try:
            app.extensions["latlab.observer"] = Observer(app, host, port, main=(config.host, config.port))
        except OSError as exc:
            app.extensions["latlab"].close()
            raise ConfigError(f"cannot listen for /metrics and health on {host}:{port}: {exc.strerror}") from None
    except ConfigError as exc:
        log.error("%s", exc)
        raise SystemExit(2) from None
    log.info("/metrics, /v2/health/* and the other GET routes also on http://%s:%d (their own threads)", host, port)
    return RsgiApp(app) if config.interface == "rsgi" else app


def _observer_address(config: ServerConfig) -> tuple[str, int]:
    """Where serve() said the observer listens; without serve() (Granian started by hand), from the config."""
    chosen = os.environ.get(OBSERVER_ENV)
    if chosen:
        host, _, port = chosen.rpartition(":")
        return host, int(port)
    return config.host, observer_port(config.host, config.port, config.metrics_port)


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


def serve(
    config_path: str | Path,
    host: str | None = None,
    port: int | None = None,
    metrics_port: int | None = None,
    frontends: int | None = None,
    separate_engine: bool = False,
) -> None:
    """Start the server in the foreground until SIGINT/SIGTERM; `metrics_port` and `frontends` override [server].
    One front end: one process does everything. More: Granian runs them as its workers, and a supervisor
    (server/processes/supervisor.py) runs the engine process they feed, started before them and stopped after them.
    `separate_engine`: an engine process even behind one front end (benchmarks/frontends.py measures the hop so)."""
    from granian import Granian
    from granian.constants import Interfaces

    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    config = served_config(config_path, frontends)
    os.environ[FRONTENDS_ENV] = str(config.frontends)  # what the front ends and the engine serve with
    interface = served_interface(config, separate_engine)
    if interface != config.interface:
        log.info('interface "rsgi" applies to one process (frontends = 1): the front ends serve WSGI')
    check_deployments(config)
    address = host or config.host
    port = config.port if port is None else port
    observer = observer_port(address, port, metrics_port or config.metrics_port)
    warning = bind_warning(address, bool(config.auth_token))
    if warning:
        log.warning(warning)
    log.info("%s", admission_summary(config))
    os.environ[CONFIG_ENV] = str(Path(config_path).resolve())
    os.environ[OBSERVER_ENV] = f"{address}:{observer}"  # the worker process inherits it
    supervisors = []
    if config.frontends > 1 or separate_engine:
        engines = engine_groups(config.deployments)
        run_dir = run_folder(len(config.deployments), len(engines))
        os.environ[RUN_DIR_ENV] = str(run_dir)
        supervisors = [
            Supervisor(os.environ[CONFIG_ENV], run_dir, os.environ[OBSERVER_ENV], index)
            for index in range(len(engines))
        ]
        try:
            for supervisor in supervisors:
                supervisor.start()
        except EngineFailed as exc:
            if exc.code != 2:  # 2: the engine logged its one line
                log.error("%s", exc)
            stop_engines(supervisors, run_dir)
            raise SystemExit(2) from None
        log.info(
            "%d front-end processes feed %s",
            config.frontends,
            ", ".join(f"the {key} engine process {s.process.pid}" for key, s in zip(engines, supervisors)),
        )
    if interface == "native" and not supervisors:
        serve_native(address, port)
        return
    try:
        if interface == "native":
            from latlab.server.processes.native_frontend import serve_native_frontends

            serve_native_frontends(address, port, config.frontends)
            return
        Granian(
            "latlab.server.processes.wsgi:app_from_env",
            factory=True,
            interface=Interfaces.RSGI if interface == "rsgi" else Interfaces.WSGI,
            address=address,
            port=port,
            # one process, or N front ends: the batcher (here, or in the engine) sees every request
            workers=config.frontends,
            respawn_failed_workers=config.frontends > 1,  # a front end that dies is replaced, the others serve
            respawn_interval=FRONTEND_RESPAWN_S,
            # RSGI: one event loop holds the infer requests (Granian allows it one blocking thread)
            blocking_threads=1 if interface == "rsgi" else config.threads,
            # Granian's backpressure caps open connections, not requests: one past it is not refused but left
            # unaccepted, waiting unseen. Admission (server/batching/admission.py) bounds requests; this only has to
            # stay out of its way.
            backpressure=max(MAX_CONNECTIONS, config.threads),
            log_access=False,
        ).serve()
    finally:
        if supervisors:  # after the front ends drained: the engines answer what they still wait on
            stop_engines(supervisors, run_dir)


def serve_native(address: str, port: int) -> None:
    """One process under the native interface (server/http/native.py) until SIGINT/SIGTERM: the app as Granian's
    worker would build it (app_from_env), its dispatcher on this thread; stopping answers what it holds first."""
    from latlab.server.http.native import NativeServer, listening_socket

    try:
        sock = listening_socket(address, port)
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", address, port, exc.strerror)
        raise SystemExit(2) from None
    app = app_from_env()
    try:
        server = NativeServer(app.extensions["latlab"], app.wsgi_app, sock)
    except ConfigError as exc:
        log.error("%s", exc)
        app.extensions["latlab"].close()
        raise SystemExit(2) from None
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: server.stop())
    log.info("serving on http://%s:%d (native interface)", address, port)
    try:
        server.serve_forever()
    finally:
        server.close()
        sock.close()
        observer = app.extensions.get("latlab.observer")
        if observer is not None:
            observer.close()
        app.extensions["latlab"].close()


def stop_engines(supervisors: list, run_dir: Path) -> None:
    """Stop every engine (each answers what it holds), then remove the run folder."""
    for supervisor in supervisors:
        supervisor.stop()
    shutil.rmtree(run_dir, ignore_errors=True)


def admission_summary(config: ServerConfig) -> str:
    """One log line: what each deployment admits and the request threads that holds."""
    if not config.admission:
        return (
            f"admission off: {config.threads} request threads, no bound at the door (requests past the threads "
            "wait unseen in Granian's queue)"
        )
    bounds = ", ".join(f"{d.name} {admitted_bound(d.batcher)}" for d in config.deployments)
    door = (
        f"infer requests admitted at once: {bounds} (max_queue_size + instances x max_batch_size; one more is "
        "refused with 503 + Retry-After)"
    )
    if config.interface == "native":
        return f"{door}; no thread waits on a request (native interface)"
    return (
        f"{door}; {config.threads} request threads, most of them waiting on a batch "
        "without using the CPU (Granian may warn about their number: expected)"
    )
