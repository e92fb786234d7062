"""The operator's routes: ``GET /metrics`` (Prometheus) and ``POST /jobs/{job_id}/cancel``.

With an operator token (``create_app(token=...)``, ``jobpulse serve --token``) both answer 401
with ``WWW-Authenticate: Bearer`` unless the request carries ``Authorization: Bearer <token>``,
before anything else is looked at. Then both go through the app's ``authorize(request, job_id)``
hook: ``/metrics`` asks it with the job id ``""`` (no job), the cancel route with the job's id
and ``request.method == "POST"``, so a hook can allow reading a job and refuse cancelling it.
``POST .../cancel?dry_run=1`` asks the token check and the hook and cancels nothing: the
dashboard shows its cancel button only when that answers 200.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from .._protocol.keys import check_job_id
from .._recovery.control import request_cancel
from ..errors import InvalidJobId
from .auth import bearer_allows

if TYPE_CHECKING:
    from .app import _Service

__all__ = ["cancel", "metrics"]

_SUFFIX = "/cancel"


def _json(body: Any, status: int = 200) -> Response:
    return Response(
        orjson.dumps(body),
        status_code=status,
        media_type="application/json",
        headers={"cache-control": "no-store"},
    )


def _unauthenticated(service: _Service, request: Request) -> Response | None:
    """401 when the app has a token and the request does not carry it, else None."""
    if bearer_allows(request.headers.get("authorization"), service.token):
        return None
    response = _json({"error": "unauthorized: this route needs the operator token"}, 401)
    response.headers["www-authenticate"] = 'Bearer realm="jobpulse"'
    return response


async def metrics(service: _Service, request: Request) -> Response:
    """``GET /metrics``: the census of the namespace and this process's worker counters."""
    refused = _unauthenticated(service, request)
    if refused is not None:
        return refused
    if not await service._allowed(request, ""):
        return _json({"error": "forbidden"}, 403)
    try:
        from ..metrics.prometheus import CONTENT_TYPE, scrape
    except ImportError:  # prometheus_client is missing
        return _json({"error": "metrics need the jobpulse[prometheus] extra"}, 501)
    reader = service.reader
    try:
        body = await scrape(
            reader._redis, namespace=reader.namespace, index_shards=service.config.index_shards
        )
    except Exception as exc:
        from .app import _failure

        return _failure(exc)
    return Response(body, media_type=CONTENT_TYPE, headers={"cache-control": "no-store"})


async def cancel(service: _Service, request: Request) -> Response:
    """``POST /jobs/{job_id}/cancel``: ask the job's worker to stop (``request_cancel``).

    Answers 200 ``{"cancelled": true}`` when the request is recorded, 409 when the job is not
    running, 401 without the operator token, 403 when ``authorize`` refuses, 400 for an invalid
    id; with ``?dry_run=1``, 200 ``{"allowed": true}`` and nothing cancelled.
    """
    rest: str = request.path_params["rest"]
    if not rest.endswith(_SUFFIX):
        return _json({"error": "method not allowed"}, 405)
    refused = _unauthenticated(service, request)
    if refused is not None:
        return refused
    job_id = rest[: -len(_SUFFIX)]
    try:
        check_job_id(job_id)
    except InvalidJobId:
        return _json({"error": "invalid job id"}, 400)
    if not await service._allowed(request, job_id):
        return _json({"error": "forbidden"}, 403)
    if request.query_params.get("dry_run") in ("1", "true"):
        return _json({"allowed": True})
    reader = service.reader
    try:
        done = await request_cancel(reader._redis, job_id, namespace=reader.namespace)
    except Exception as exc:
        from .app import _failure

        return _failure(exc)
    if not done:
        return _json({"error": "job is not running"}, 409)
    return _json({"cancelled": True})
