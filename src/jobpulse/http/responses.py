"""The HTTP adapter's responses: JSON bodies, short errors and the one error map.

Every route (``app.py``, ``operate.py``) answers a failed read through :func:`failure`, and an
event stream tells its client of one through :func:`fault_message`; both take the failure's
meaning from ``_protocol/errors.failure_of`` (the CLI's exit codes use the same one): corrupt job
data is 502, an unreachable store is 503, anything else is a bug for the 500 handler. An error
body is ``{"error": "..."}``: never a stack trace, never what Redis said.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from .._protocol.errors import Failure, failure_of

__all__ = ["error", "failure", "fault_message", "http_error", "internal_error", "json"]

log = logging.getLogger("jobpulse")

_ANSWERS: dict[Failure, tuple[int, str]] = {
    "corrupt": (502, "job data is corrupt"),
    "unavailable": (503, "status store unavailable"),
}


def json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``body`` as a JSON response."""
    return Response(
        orjson.dumps(body), status_code=status, headers=headers, media_type="application/json"
    )


def error(status: int, message: str) -> Response:
    """A short JSON error (``{"error": message}``), never cached."""
    return json({"error": message}, status, {"cache-control": "no-store"})


def failure(exc: Exception) -> Response:
    """The response for a failed read of Redis (a bug is re-raised, for the 500 handler)."""
    kind = failure_of(exc)
    if kind is None:
        raise exc
    _log(kind, exc)
    return error(*_ANSWERS[kind])


def fault_message(exc: Exception, what: str) -> str:
    """The ``error`` of the ``fault`` event that ends an event stream after ``exc``; ``what``
    names the stream in the log of a bug."""
    kind = failure_of(exc)
    if kind is None:
        log.error("jobpulse http: %s failed", what, exc_info=exc)
        return "internal error"
    return _ANSWERS[kind][1]


def _log(kind: Failure, exc: Exception) -> None:
    if kind == "corrupt":
        log.warning("jobpulse http: corrupt job data: %s", exc)
    else:
        log.warning("jobpulse http: redis unavailable: %r", exc)


async def http_error(request: Request, exc: Exception) -> Response:
    """The app's handler of Starlette's ``HTTPException`` (404 of an unknown route…)."""
    if not isinstance(exc, HTTPException):  # pragma: no cover - Starlette routes by type
        return await internal_error(request, exc)
    return error(exc.status_code, str(exc.detail).lower())


async def internal_error(request: Request, exc: Exception) -> Response:
    """The app's handler of any other exception: logged, answered 500."""
    log.error("jobpulse http: %s %s failed", request.method, request.url.path, exc_info=exc)
    return error(500, "internal error")
