"""The Flask application factory: Open Inference Protocol routes, error mapping and /metrics."""

from __future__ import annotations

import functools
import logging
import time
from typing import Callable

import orjson
from flask import Blueprint, Flask, Response, current_app, request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from werkzeug.exceptions import HTTPException

import latlab
from latlab.server.config import DeploymentConfig, ServerConfig
from latlab.server.deployment import Deployment
from latlab.server.errors import (BadRequest, ComputeError, ConfigError, ModelNotFound, ModelNotReady,
                                  PayloadTooLarge, QueueFull, RequestTimeout, ServingError, Unauthorized,
                                  UnsupportedMediaType, public_message)
from latlab.server.guards import binary_header_length, check_bearer, check_content_type, check_length, read_body
from latlab.server.metrics import ServerMetrics
from latlab.server.openapi import OPENAPI_PATH, openapi_spec
from latlab.server.protocol import (HEADER_LENGTH, InferRequest, decode_request, encode_error, encode_response,
                                    shown)

log = logging.getLogger("latlab.server")
routes = Blueprint("v2", __name__)

_STATUS = {BadRequest: 400, Unauthorized: 401, ModelNotFound: 404, PayloadTooLarge: 413,
           UnsupportedMediaType: 415, ModelNotReady: 503, QueueFull: 503, RequestTimeout: 504, ComputeError: 500}
_OUTCOME = {BadRequest: "bad_request", PayloadTooLarge: "bad_request", UnsupportedMediaType: "bad_request",
            ModelNotReady: "not_ready", QueueFull: "rejected", RequestTimeout: "timeout", ComputeError: "error"}


class ServerState:
    """What the routes need: the deployments by name, those that failed to load, and the metrics."""

    def __init__(self, config: ServerConfig, registry: CollectorRegistry) -> None:
        self.config = config
        self.registry = registry
        self.metrics = ServerMetrics(registry)
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
        if not self.deployments:
            raise ConfigError("no deployment could be loaded: " + "; ".join(self.failed.values()))

    def _load(self, deployment: DeploymentConfig) -> None:
        try:
            self.deployments[deployment.name] = Deployment(deployment, self.metrics)
        except ConfigError as exc:
            if self.config.on_load_failure == "fail":
                raise
            log.error("%s; serving the other deployments (on_load_failure = \"skip\")", exc)
            self.failed[deployment.name] = str(exc)

    @property
    def ready(self) -> bool:
        return not self.failed and all(d.ready for d in self.deployments.values())

    def get(self, name: str, version: str | None = None) -> Deployment:
        if name in self.failed:
            raise ModelNotReady(f"{public_message(self.failed[name])} (failed to load at start; not served)")
        deployment = self.deployments.get(name)
        if deployment is None or version not in (None, deployment.version):
            raise ModelNotFound(f"unknown model '{shown(name)}'" + (f" version '{shown(version)}'" if version else "")
                                + f"; serving {sorted(self.deployments)}")
        return deployment

    def close(self) -> None:
        for deployment in self.deployments.values():
            deployment.close()


def create_app(config: ServerConfig, registry: CollectorRegistry | None = None) -> Flask:
    """Build the server app: loads every deployment's model and starts its batcher."""
    app = Flask("latlab.server")
    # One byte of slack: werkzeug cannot tell a chunked body of exactly the limit from a longer one;
    # read_body enforces the limit itself.
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes + 1
    app.extensions["latlab"] = ServerState(config, registry or CollectorRegistry())
    app.register_blueprint(routes)
    app.register_error_handler(ServingError, _serving_error)
    app.register_error_handler(HTTPException, _http_error)
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
    return _json({"name": "latlab", "version": latlab.__version__, "extensions": ["binary_tensor_data"]})


@routes.get(OPENAPI_PATH)
def openapi() -> Response:
    return Response(_state().openapi, content_type="application/json")


@routes.get("/v2/models/<name>")
@routes.get("/v2/models/<name>/versions/<version>")
def model_metadata(name: str, version: str | None = None) -> Response:
    return _json(_state().get(name, version).model.metadata())


@routes.get("/v2/models/<name>/ready")
@routes.get("/v2/models/<name>/versions/<version>/ready")
def model_ready(name: str, version: str | None = None) -> Response:
    return Response(status=200 if _state().get(name, version).ready else 400)


@routes.get("/v2/models/<name>/config")
@routes.get("/v2/models/<name>/versions/<version>/config")
@protected
def model_config(name: str, version: str | None = None) -> Response:
    return _json(_state().get(name, version).describe())


@routes.post("/v2/models/<name>/infer")
@routes.post("/v2/models/<name>/versions/<version>/infer")
@protected
def infer(name: str, version: str | None = None) -> Response:
    started = time.perf_counter()
    deployment = _state().get(name, version)
    deployment.observer.inflight.inc()
    outcome = "ok"
    try:
        infer_request = _decode_body()
        outputs = deployment.infer(infer_request)
        body, header_length = encode_response(name, deployment.version, infer_request, outputs)
    except ServingError as exc:
        outcome = _OUTCOME.get(type(exc), "error")
        raise
    except Exception:
        outcome = "error"
        raise
    finally:
        deployment.observer.inflight.dec()
        deployment.observer.answered(outcome, time.perf_counter() - started)
    if header_length is None:
        return Response(body, content_type="application/json")
    response = Response(body, content_type="application/octet-stream")
    response.headers[HEADER_LENGTH] = str(header_length)
    return response


def _decode_body() -> InferRequest:
    """Size, then content type, then the body itself: nothing is read before the cheap checks pass."""
    limit = _state().config.max_body_bytes
    check_length(request.content_length, limit)
    binary_length = binary_header_length(request.headers.get(HEADER_LENGTH))
    check_content_type(request.mimetype, request.mimetype_params, binary_length is not None)
    return decode_request(read_body(request.stream, limit), binary_length)


@routes.get("/metrics")
def metrics() -> Response:
    return Response(generate_latest(_state().registry), content_type=CONTENT_TYPE_LATEST)


def _serving_error(exc: ServingError) -> Response:
    response = Response(encode_error(str(exc)), status=_STATUS.get(type(exc), 500),
                        content_type="application/json")
    if isinstance(exc, QueueFull):
        response.headers["Retry-After"] = "1"
    if isinstance(exc, Unauthorized):
        response.headers["WWW-Authenticate"] = 'Bearer realm="latlab"'
    return response


def _http_error(exc: HTTPException) -> Response:
    return Response(encode_error(exc.description or exc.name), status=exc.code or 500,
                    content_type="application/json")


def _unexpected_error(exc: Exception) -> Response:
    log.exception("unexpected error while serving %s", request.path)  # the trace goes to the log only
    return Response(encode_error("internal server error"), status=500, content_type="application/json")
