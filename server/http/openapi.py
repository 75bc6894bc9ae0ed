"""The OpenAPI 3 description of the server's HTTP API, served at /v2/openapi.json."""

from __future__ import annotations

import latlab
from latlab.server.protocol import DATATYPES, HEADER_LENGTH, MAX_ID_LENGTH, MAX_RANK

OPENAPI_PATH = "/v2/openapi.json"
_REF = "#/components/schemas/"

_ERRORS = {
    "400": "Bad request: malformed body, or inputs that do not match the model; the message names the problem.",
    "401": "The route needs `Authorization: Bearer <token>` (only when the server has an auth_token).",
    "404": "No deployment of that name or version.",
    "413": "Body over the server's max_body_bytes; refused before it is read whole.",
    "415": "Content-Type other than application/json, or application/octet-stream with the binary header.",
    "500": "The batch this request was in failed in ONNX Runtime; only that batch's requests get this.",
    "503": "Queue full (with Retry-After), deployment failed to load, or shutting down.",
    "504": "The request waited past its timeout and was never computed.",
}


def _error(code: str) -> dict:
    return {"description": _ERRORS[code], "content": {"application/json": {"schema": {"$ref": _REF + "Error"}}}}


def _json(description: str, schema: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": {"$ref": _REF + schema}}}}


def _path_params(versioned: bool) -> list[dict]:
    params = [
        {
            "name": "name",
            "in": "path",
            "required": True,
            "description": "The deployment's name.",
            "schema": {"type": "string", "minLength": 1, "pattern": "^[^/]+$"},
        }
    ]
    if versioned:
        params.append(
            {
                "name": "version",
                "in": "path",
                "required": True,
                "description": "Only '1' exists.",
                "schema": {"type": "string", "minLength": 1, "pattern": "^[^/]+$"},
            }
        )
    return params


def _model_routes(auth: bool) -> dict:
    security = {"security": [{"bearerAuth": []}]} if auth else {}
    protected_errors = {"401": _error("401")} if auth else {}
    routes = {}
    for versioned in (False, True):
        base = "/v2/models/{name}" + ("/versions/{version}" if versioned else "")
        params = _path_params(versioned)
        routes[base] = {
            "get": {
                "summary": "Model metadata: inputs and outputs with datatype and shape (-1: any).",
                "parameters": params,
                "responses": {
                    "200": _json("The model's metadata.", "ModelMetadata"),
                    "404": _error("404"),
                    "503": _error("503"),
                },
            }
        }
        routes[base + "/ready"] = {
            "get": {
                "summary": "Whether this deployment takes requests (200) or not (400).",
                "parameters": params,
                "responses": {
                    "200": {"description": "Ready."},
                    "400": {"description": "Not ready."},
                    "404": _error("404"),
                    "503": _error("503"),
                },
            }
        }
        routes[base + "/config"] = {
            "get": {
                "summary": "The deployment's settings (provider, batcher, CPU options).",
                **security,
                "parameters": params,
                "responses": {
                    "200": _json("The deployment's settings.", "DeploymentConfig"),
                    **protected_errors,
                    "404": _error("404"),
                    "503": _error("503"),
                },
            }
        }
        routes[base + "/infer"] = {
            "post": {
                "summary": "Run the model on the request's inputs (batched with other requests).",
                **security,
                "parameters": [
                    *params,
                    {
                        "name": HEADER_LENGTH,
                        "in": "header",
                        "required": False,
                        "description": "Binary tensor extension: length of the JSON header that starts the body.",
                        "schema": {"type": "integer", "minimum": 0},
                    },
                ],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": {"$ref": _REF + "InferRequest"}},
                        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                    },
                },
                "responses": {
                    "200": {
                        "description": "The outputs; binary ones follow the JSON header "
                        f"(its length in {HEADER_LENGTH}).",
                        "content": {
                            "application/json": {"schema": {"$ref": _REF + "InferResponse"}},
                            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                        },
                    },
                    **{code: _error(code) for code in ("400", "404", "413", "415", "500", "503", "504")},
                    **protected_errors,
                },
            }
        }
    return routes


def _schemas() -> dict:
    datatype = {"type": "string", "enum": list(DATATYPES)}
    shape = {"type": "array", "maxItems": MAX_RANK, "items": {"type": "integer", "minimum": -1}}
    tensor_meta = {
        "type": "object",
        "required": ["name", "datatype", "shape"],
        "properties": {"name": {"type": "string"}, "datatype": datatype, "shape": shape},
    }
    return {
        "Error": {
            "type": "object",
            "required": ["error"],
            "additionalProperties": False,
            "properties": {"error": {"type": "string", "minLength": 1}},
        },
        "ServerMetadata": {
            "type": "object",
            "required": ["name", "version", "extensions"],
            "properties": {
                "name": {"type": "string"},
                "version": {"type": "string"},
                "extensions": {"type": "array", "items": {"type": "string"}},
                "metrics_port": {
                    "type": "integer",
                    "description": "Where /metrics, health, metadata and config also "
                    "answer, on threads of their own (latlab's addition; absent when not served).",
                },
            },
        },
        "ModelMetadata": {
            "type": "object",
            "required": ["name", "versions", "platform", "inputs", "outputs"],
            "properties": {
                "name": {"type": "string"},
                "versions": {"type": "array", "items": {"type": "string"}},
                "platform": {"type": "string"},
                "inputs": {"type": "array", "items": tensor_meta},
                "outputs": {"type": "array", "items": tensor_meta},
            },
        },
        "DeploymentConfig": {
            "type": "object",
            "required": ["name", "model", "provider", "batcher", "cpu"],
            "properties": {
                "name": {"type": "string"},
                "model": {"type": "string"},
                "provider": {"type": "string", "enum": ["cpu", "cuda"]},
                "model_path": {"type": "string"},
                "allow_non_finite": {"type": "boolean"},
                "batcher": {"type": "object"},
                "cpu": {"type": "object"},
            },
        },
        "InferRequest": {
            "type": "object",
            "required": ["inputs"],
            "properties": {
                "id": {"type": "string", "maxLength": MAX_ID_LENGTH},
                "parameters": {
                    "type": "object",
                    "properties": {
                        "timeout": {
                            "type": "integer",
                            "minimum": 0,
                            "description": "µs; may only shorten the server's",
                        },
                        "priority": {
                            "type": "integer",
                            "minimum": 0,
                            "description": "1 = highest .. the deployment's priority_levels; 0 or absent: its default",
                        },
                        "binary_data_output": {"type": "boolean"},
                    },
                },
                "inputs": {"type": "array", "minItems": 1, "items": {"$ref": _REF + "RequestInput"}},
                "outputs": {"type": "array", "items": {"$ref": _REF + "RequestOutput"}},
            },
        },
        "RequestInput": {
            "type": "object",
            "required": ["name", "shape", "datatype"],
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "shape": {"type": "array", "maxItems": MAX_RANK, "items": {"type": "integer", "minimum": 0}},
                "datatype": datatype,
                "parameters": {"type": "object", "properties": {"binary_data_size": {"type": "integer", "minimum": 0}}},
                "data": {"type": "array", "description": "Row-major, flat or nested to the shape."},
            },
        },
        "RequestOutput": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string"},
                "parameters": {"type": "object", "properties": {"binary_data": {"type": "boolean"}}},
            },
        },
        "InferResponse": {
            "type": "object",
            "required": ["model_name", "model_version", "outputs"],
            "properties": {
                "model_name": {"type": "string"},
                "model_version": {"type": "string"},
                "id": {"type": "string"},
                "outputs": {
                    "type": "array",
                    "items": {
                        **tensor_meta,
                        "properties": {
                            **tensor_meta["properties"],
                            "data": {"type": "array"},
                            "parameters": {
                                "type": "object",
                                "properties": {"binary_data_size": {"type": "integer", "minimum": 0}},
                            },
                        },
                    },
                },
            },
        },
    }


def openapi_spec(auth: bool) -> dict:
    """The API description; with `auth`, infer and config require the bearer token."""
    health = {"200": {"description": "Yes."}, "400": {"description": "No: a deployment failed to load."}}
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "latlab inference server",
            "version": latlab.__version__,
            "description": "Open Inference Protocol (KServe v2) REST over ONNX Runtime with dynamic batching. "
            'Every error body is {"error": "..."}.',
        },
        "paths": {
            "/v2/health/live": {
                "get": {"summary": "The process is up.", "responses": {"200": {"description": "Live."}}}
            },
            "/v2/health/ready": {"get": {"summary": "Every configured deployment is loaded.", "responses": health}},
            "/v2": {
                "get": {
                    "summary": "Server metadata.",
                    "responses": {"200": _json("Name, version, extensions.", "ServerMetadata")},
                }
            },
            OPENAPI_PATH: {
                "get": {
                    "summary": "This description.",
                    "responses": {
                        "200": {
                            "description": "OpenAPI 3 document.",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        }
                    },
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics.",
                    "responses": {
                        "200": {
                            "description": "Text exposition format.",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        }
                    },
                }
            },
            **_model_routes(auth),
        },
        "components": {"schemas": _schemas(), "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}}},
    }
