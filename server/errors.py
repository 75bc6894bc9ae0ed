"""Error kinds raised while serving; `fastpath.error_answer` is the one place that maps them to HTTP."""

from __future__ import annotations

import re

# An absolute path of two or more components, with an optional :line suffix (ORT's errors carry the
# source file they came from), and a C++ signature ORT puts after it: never shown to a client.
_PATH = re.compile(r"(?<![\w.])/(?:[\w.+-]+/)+[\w.+-]*(?::\d+)?")
_CPP_SIGNATURE = re.compile(r"\b[\w:~]+::[\w~]+\([^()]*\)\s*")


class ServingError(Exception):
    """Base class of every error the server answers a client with."""


class BadRequest(ServingError):
    """The request is malformed or does not match the model's signature."""


class Unauthorized(ServingError):
    """The route needs the server's bearer token and the request did not carry it."""


class PayloadTooLarge(ServingError):
    """The body is longer than the server's `max_body_bytes`; refused before it is read whole."""


class UnsupportedMediaType(ServingError):
    """The body's Content-Type is not one the infer route decodes."""


class ModelNotFound(ServingError):
    """No deployment has that name (or version)."""


class ModelNotReady(ServingError):
    """The deployment exists but cannot take requests (failed to load, or draining)."""


class QueueFull(ServingError):
    """The deployment's bounded queue is full; the client should retry later."""


class RequestTimeout(ServingError):
    """The request waited longer than its timeout and was never computed."""


class ComputeError(ServingError):
    """The model run itself failed; only the requests of that batch get this."""


class ConfigError(Exception):
    """A configuration file or model file is unusable; the command exits with this message."""


def one_line(text: object) -> str:
    """A message on one line (ONNX Runtime's end in newlines), so that a log line or a CLI error is one line."""
    return " ".join(str(text).split())


def public_message(exc: BaseException | str, limit: int = 300) -> str:
    """An error's text fit for a client: one line, file paths and C++ signatures removed, bounded in length.
    The full text and trace belong in the server's log."""
    text = _CPP_SIGNATURE.sub("", _PATH.sub("<path>", one_line(exc))) or type(exc).__name__
    return text if len(text) <= limit else text[:limit] + "..."
