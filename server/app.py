"""The Flask application factory: Open Inference Protocol routes, error mapping and /metrics."""

from __future__ import annotations

import logging
import time

import orjson
from flask import Blueprint, Flask, Response, current_app, request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from werkzeug.exceptions import HTTPException

import latlab
from latlab.server.config import ServerConfig
from latlab.server.deployment import Deployment
from latlab.server.errors import (BadRequest, ComputeError, ModelNotFound, ModelNotReady, QueueFull,
                                  RequestTimeout, ServingError)
from latlab.server.metrics import ServerMetrics
from latlab.server.protocol import HEADER_LENGTH, decode_request, encode_error, encode_response

log = logging.getLogger("latlab.server")
routes = Blueprint("v2", __name__)

_STATUS = {BadRequest: 400, ModelNotFound: 404, ModelNotReady: 503, QueueFull: 503,
           RequestTimeout: 504, ComputeError: 500}
_OUTCOME = {BadRequest: "bad_request", ModelNotReady: "not_ready", QueueFull: "rejected",
            RequestTimeout: "timeout", ComputeError: "error"}


class ServerState:
    """What the routes need: the deployments by name and the metrics; built once per app."""

    def __init__(self, config: ServerConfig, registry: CollectorRegistry) -> None:
        self.config = config
        self.registry = registry
        self.metrics = ServerMetrics(registry)
        self.deployments: dict[str, Deployment] = {}
        try:
            for deployment in config.deployments:
                self.deployments[deployment.name] = Deployment(deployment, self.metrics)
        except Exception:
            self.close()
            raise

    def get(self, name: str, version: str | None = None) -> Deployment:
        deployment = self.deployments.get(name)
        if deployment is None or version not in (None, deployment.version):
            raise ModelNotFound(f"unknown model '{name}'" + (f" version '{version}'" if version else "")
                                + f"; serving {sorted(self.deployments)}")
        return deployment

    def close(self) -> None:
        for deployment in self.deployments.values():
            deployment.close()


def create_app(config: ServerConfig, registry: CollectorRegistry | None = None) -> Flask:
    """Build the server app: loads every deployment's model and starts its batcher."""
    app = Flask("latlab.server")
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
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


@routes.get("/v2/health/live")
def live() -> Response:
    return Response(status=200)


@routes.get("/v2/health/ready")
def ready() -> Response:
    deployments = _state().deployments.values()
    return Response(status=200 if all(d.ready for d in deployments) else 400)


@routes.get("/v2")
def server_metadata() -> Response:
    return _json({"name": "latlab", "version": latlab.__version__, "extensions": ["binary_tensor_data"]})


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
def model_config(name: str, version: str | None = None) -> Response:
    return _json(_state().get(name, version).describe())


@routes.post("/v2/models/<name>/infer")
@routes.post("/v2/models/<name>/versions/<version>/infer")
def infer(name: str, version: str | None = None) -> Response:
    started = time.perf_counter()
    deployment = _state().get(name, version)
    deployment.observer.inflight.inc()
    outcome = "ok"
    try:
        header = request.headers.get(HEADER_LENGTH)
        if header is not None and not (header.isascii() and header.isdigit()):
            raise BadRequest(f"{HEADER_LENGTH} must be a non-negative integer, got {header!r}")
        infer_request = decode_request(request.get_data(cache=False), int(header) if header else None)
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


@routes.get("/metrics")
def metrics() -> Response:
    return Response(generate_latest(_state().registry), content_type=CONTENT_TYPE_LATEST)


def _serving_error(exc: ServingError) -> Response:
    response = Response(encode_error(str(exc)), status=_STATUS.get(type(exc), 500),
                        content_type="application/json")
    if isinstance(exc, QueueFull):
        response.headers["Retry-After"] = "1"
    return response


def _http_error(exc: HTTPException) -> Response:
    return Response(encode_error(exc.description or exc.name), status=exc.code or 500,
                    content_type="application/json")


def _unexpected_error(exc: Exception) -> Response:
    log.exception("unexpected error while serving %s", request.path)  # the trace goes to the log only
    return Response(encode_error("internal server error"), status=500, content_type="application/json")
