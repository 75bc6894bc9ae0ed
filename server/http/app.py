"""The Flask application factory: Open Inference Protocol routes, error mapping and /metrics."""

from __future__ import annotations

import functools
import logging
from typing import Callable

import orjson
from flask import Blueprint, Flask, Response, current_app, request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from werkzeug.exceptions import HTTPException

import latlab
from latlab.server.config import DeploymentConfig, ServerConfig, served_interface
from latlab.server.errors import ConfigError, ModelNotFound, ModelNotReady, ServingError, public_message
from latlab.server.http.fastpath import InferRoute, error_answer, flask_infer_view
from latlab.server.http.guards import check_bearer
from latlab.server.http.openapi import OPENAPI_PATH, openapi_spec
from latlab.server.metrics import ServerMetrics
from latlab.server.protocol import shown
from latlab.server.runtime.deployment import Deployment

log = logging.getLogger("latlab.server")
routes = Blueprint("v2", __name__)


class ServerState:
    """What the routes need: the deployments by name, those that failed to load, and the metrics."""

    def __init__(
        self,
        config: ServerConfig,
        registry: CollectorRegistry,
        shown: CollectorRegistry | None = None,
        require_one: bool = True,
    ) -> None:
        """`shown`: what /metrics serves when it is not `registry` (a multi-front-end server's engine records
        its metrics in `registry` and shows those of every process: server/processes/engine.py). `require_one`: a server
        none of whose deployments loads is refused (an engine of several may hold only failed ones)."""
        self.config = config
        self.registry = registry if shown is None else shown
        self.metrics = ServerMetrics(registry, process=shown is None)
        self.openapi = orjson.dumps(openapi_spec(auth=bool(config.auth_token)))
        self.deployments: dict[str, Deployment] = {}
        self.failed: dict[str, str] = {}
        """Deployments that could not load (on_load_failure = "skip"), with the reason."""
        try:
            for deployment in config.deployments:
                self._load(deployment)
        except Exception:
            self.close()
            raise
        if not self.deployments and require_one:
            raise ConfigError("no deployment could be loaded: " + "; ".join(self.failed.values()))

    def _load(self, deployment: DeploymentConfig) -> None:
        try:
            self.deployments[deployment.name] = Deployment(deployment, self.metrics, self.config.admission)
        except ConfigError as exc:
            if self.config.on_load_failure == "fail":
                raise
            log.error('%s; serving the other deployments (on_load_failure = "skip")', exc)
            self.failed[deployment.name] = str(exc)

    @property
    def ready(self) -> bool:
        return not self.failed and all(d.ready for d in self.deployments.values())

    def get(self, name: str, version: str | None = None) -> Deployment:
        if name in self.failed:
            raise ModelNotReady(f"{public_message(self.failed[name])} (failed to load at start; not served)")
        deployment = self.deployments.get(name)
        if deployment is None or version not in (None, deployment.version):
            raise ModelNotFound(
                f"unknown model '{shown(name)}'"
                + (f" version '{shown(version)}'" if version else "")
                + f"; serving {sorted(self.deployments)}"
            )
        return deployment

    def close(self) -> None:
        for deployment in self.deployments.values():
            deployment.close()


def create_app(
    config: ServerConfig,
    registry: CollectorRegistry | None = None,
    shown: CollectorRegistry | None = None,
    require_one: bool = True,
) -> Flask:
    """Build the server app: loads every deployment's model and starts its batcher.
    POST .../infer is answered by a WSGI layer in front of Flask (fastpath.py); the rest by Flask's routes."""
    app = Flask("latlab.server")
    # One byte of slack: werkzeug cannot tell a chunked body of exactly the limit from a longer one;
    # read_body enforces the limit itself.
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes + 1
    state = app.extensions["latlab"] = ServerState(config, registry or CollectorRegistry(), shown, require_one)
    app.register_blueprint(routes)
    infer_route = InferRoute(app.wsgi_app, state)
    app.wsgi_app = infer_route  # type: ignore[method-assign]  # Flask's documented middleware hook
    infer = flask_infer_view(infer_route)
    app.add_url_rule("/v2/models/<name>/infer", "infer", infer, methods=["POST"])
    app.add_url_rule("/v2/models/<name>/versions/<version>/infer", "infer", infer, methods=["POST"])
    app.register_error_handler(ServingError, _error_response)
    app.register_error_handler(HTTPException, _error_response)
    app.register_error_handler(Exception, _unexpected_error)
    return app


def _state() -> ServerState:
    return current_app.extensions["latlab"]


def _json(doc: dict, status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status=status, content_type="application/json")


def protected(view: Callable[..., Response]) -> Callable[..., Response]:
    """Routes that need the bearer token when one is configured: infer and the deployment's settings.
    Health, metadata, /metrics and the API description stay open (probes and Prometheus need them)."""

    @functools.wraps(view)
    def checked(*args: str, **kwargs: str) -> Response:
        check_bearer(_state().config.auth_token, request.headers.get("Authorization"))
        return view(*args, **kwargs)

    return checked


@routes.get("/v2/health/live")
def live() -> Response:
    return Response(status=200)


@routes.get("/v2/health/ready")
def ready() -> Response:
    return Response(status=200 if _state().ready else 400)


@routes.get("/v2")
def server_metadata() -> Response:
    doc = {"name": "latlab", "version": latlab.__version__, "extensions": ["binary_tensor_data"]}
    port = _state().config.metrics_port
    if port:  # known once the server resolved it (processes/wsgi.py): where load generators and probes should look
        doc["metrics_port"] = port
    return _json(doc)


@routes.get(OPENAPI_PATH)
def openapi() -> Response:
    return Response(_state().openapi, content_type="application/json")


@routes.get("/v2/models/<name>")
@routes.get("/v2/models/<name>/versions/<version>")
def model_metadata(name: str, version: str | None = None) -> Response:
    return _json(_state().get(name, version).metadata())


@routes.get("/v2/models/<name>/ready")
@routes.get("/v2/models/<name>/versions/<version>/ready")
def model_ready(name: str, version: str | None = None) -> Response:
    return Response(status=200 if _state().get(name, version).ready else 400)


@routes.get("/v2/models/<name>/config")
@routes.get("/v2/models/<name>/versions/<version>/config")
@protected
def model_config(name: str, version: str | None = None) -> Response:
    state = _state()
    config = state.config
    return _json(
        {
            **state.get(name, version).describe(),
            "frontends": config.frontends,
            "interface": served_interface(config),
        }
    )


@routes.get("/metrics")
def metrics() -> Response:
    return Response(generate_latest(_state().registry), content_type=CONTENT_TYPE_LATEST)


def _error_response(exc: BaseException) -> Response:
    """Flask's side of the one error mapping (fastpath.error_answer)."""
    status, headers, body = error_answer(exc)
    return Response(body, status=status, headers=headers)


def _unexpected_error(exc: Exception) -> Response:
    log.exception("unexpected error while serving %s", request.path)  # the trace goes to the log only
    return _error_response(exc)
