"""Error kinds raised while serving; `app.py` is the one place that maps them to HTTP."""


class ServingError(Exception):
    """Base class of every error the server answers a client with."""


class BadRequest(ServingError):
    """The request is malformed or does not match the model's signature."""


class ModelNotFound(ServingError):
    """No deployment has that name (or version)."""


class ModelNotReady(ServingError):
    """The deployment exists but cannot take requests (not loaded, or draining)."""


class QueueFull(ServingError):
    """The deployment's bounded queue is full; the client should retry later."""


class RequestTimeout(ServingError):
    """The request waited longer than its timeout and was never computed."""


class ComputeError(ServingError):
    """The model run itself failed; only the requests of that batch get this."""


class ConfigError(Exception):
    """A configuration file or model file is unusable; the command exits with this message."""
