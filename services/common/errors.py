"""Typed errors that cross service boundaries.

Each error maps to one gRPC status code, so a server turns it into a status with a message that tells
the caller what to fix. Internal invariants use ``assert``; user input is validated with ``if ... raise``.
"""

from __future__ import annotations


class SeawallError(Exception):
    """Base of all errors Seawall reports to a caller. ``grpc_code`` names a ``grpc.StatusCode`` member."""

    grpc_code = "INTERNAL"
    http_status = 500


class InvalidArgument(SeawallError):
    """The caller sent something wrong: the message says which field and what would be accepted."""

    grpc_code = "INVALID_ARGUMENT"
    http_status = 400


class NotFound(SeawallError):
    """A named thing (model directory, request id, worker) does not exist."""

    grpc_code = "NOT_FOUND"
    http_status = 404


class ResourceExhausted(SeawallError):
    """Overload: the queue or the KV pool is full. The caller may retry later."""

    grpc_code = "RESOURCE_EXHAUSTED"
    http_status = 429


class FailedPrecondition(SeawallError):
    """The call cannot work in the service's configuration (e.g. a NIXL call where NIXL is off)."""

    grpc_code = "FAILED_PRECONDITION"
    http_status = 400


class ModelLoadError(SeawallError):
    """A checkpoint directory exists but cannot be loaded (missing or malformed files)."""

    grpc_code = "FAILED_PRECONDITION"
    http_status = 400


class Unauthenticated(SeawallError):
    """The mesh asks for an API key and the call carried none, or another."""

    grpc_code = "UNAUTHENTICATED"
    http_status = 401


class Unavailable(SeawallError):
    """A worker or service cannot be reached; the request may be retried elsewhere."""

    grpc_code = "UNAVAILABLE"
    http_status = 503


class PortInUse(Unavailable):
    """A service was told to listen on a port that another process holds. Its process exits with
    ``EXIT_PORT_IN_USE`` so that a launcher that picked the port can pick another and start it again."""


# A process exit status, distinct from 1 (a crash) and 2 (a bad flag or model).
EXIT_PORT_IN_USE = 3


def error_for_code(grpc_code: str, message: str) -> SeawallError:
    """The error a ``grpc.StatusCode`` name stands for (``SeawallError`` itself for codes without a class of
    their own): how an error that crossed the wire as a status becomes one again."""
    kinds = (InvalidArgument, NotFound, ResourceExhausted, ModelLoadError, Unauthenticated, Unavailable)
    kind = next((k for k in kinds if k.grpc_code == grpc_code), SeawallError)
    return kind(message)
