"""The operator's routes: ``GET /metrics`` (Prometheus) and ``POST /jobs/{job_id}/cancel``.

With an operator token (``create_app(token=...)``, ``jobpulse serve --token``) both answer 401
with ``WWW-Authenticate: Bearer`` unless the request carries ``Authorization: Bearer <token>``,
before anything else is looked at. Then both go through the app's ``authorize(request, job_id)``
hook: ``/metrics`` asks it with the job id ``""`` (no job), the cancel route with the job's id
and ``request.method == "POST"``, so a hook can allow reading a job and refuse cancelling it.
``POST .../cancel?dry_run=1`` asks the token check and the hook and cancels nothing: the
dashboard shows its cancel button only when that answers 200.

The app (``app.py``) hands each route what it needs (the token, the hook, the reader); this
module knows nothing of the app, and answers a failed Redis call through the one error map
(``responses.failure``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from .._protocol.keys import check_job_id
from .._reader.reader import StatusReader, client_of, fresh_status
from .._reader.status import JobState
from .._recovery.control import request_cancel
from ..errors import InvalidJobId
from .auth import bearer_allows
from .responses import error, failure, json

__all__ = ["Allowed", "cancel", "metrics"]

_SUFFIX = "/cancel"

Allowed = Callable[[Request, str], Awaitable[bool]]
"""The app's ``authorize`` hook, awaited: ``allowed(request, job_id)``."""

_NO_STORE = {"cache-control": "no-store"}


def _unauthenticated(token: bytes | None, request: Request) -> Response | None:
    """401 when the app has a token and the request does not carry it, else None."""
    if bearer_allows(request.headers.get("authorization"), token):
        return None
    response = error(401, "unauthorized: this route needs the operator token")
    response.headers["www-authenticate"] = 'Bearer realm="jobpulse"'
    return response


async def metrics(
    request: Request,
    allowed: Allowed,
    reader: StatusReader,
    *,
    token: bytes | None,
    index_shards: int,
) -> Response:
    """``GET /metrics``: the census of the namespace and this process's worker counters."""
    refused = _unauthenticated(token, request)
    if refused is not None:
        return refused
    if not await allowed(request, ""):
        return error(403, "forbidden")
    try:
        from ..metrics.prometheus import CONTENT_TYPE, scrape
    except ImportError:  # prometheus_client is missing
        return error(501, "metrics need the jobpulse[prometheus] extra")
    try:
        body = await scrape(
            client_of(reader), namespace=reader.namespace, index_shards=index_shards
        )
    except Exception as exc:
        return failure(exc)
    return Response(body, media_type=CONTENT_TYPE, headers=_NO_STORE)


async def cancel(
    request: Request, allowed: Allowed, reader: StatusReader, *, token: bytes | None
) -> Response:
    """``POST /jobs/{job_id}/cancel``: ask the job's worker to stop (``request_cancel``).

    Answers 200 ``{"cancelled": true}`` when the request is recorded; 409
    ``{"error": ..., "state": STATE}`` when the job is not RUNNING: STALE (its worker stopped
    beating, so no worker would act on the request: nothing is recorded, and a sweeper ends the
    job LOST), ended or unknown; 401 without the operator token, 403 when ``authorize`` refuses,
    400 for an invalid id; with ``?dry_run=1``, 200 ``{"allowed": true}`` and nothing cancelled.
    (A job that goes STALE between the route's read and its request is cancelled as the RUNNING
    job it was read: the request waits for its worker, should that come back.)
    """
    rest: str = request.path_params["rest"]
    if not rest.endswith(_SUFFIX):
        return error(405, "method not allowed")
    refused = _unauthenticated(token, request)
    if refused is not None:
        return refused
    job_id = rest[: -len(_SUFFIX)]
    try:
        check_job_id(job_id)
    except InvalidJobId:
        return error(400, "invalid job id")
    if not await allowed(request, job_id):
        return error(403, "forbidden")
    if request.query_params.get("dry_run") in ("1", "true"):
        return json({"allowed": True}, headers=_NO_STORE)
    try:
        state = (await fresh_status(reader, job_id)).state
        if state is JobState.RUNNING:
            if await request_cancel(client_of(reader), job_id, namespace=reader.namespace):
                return json({"cancelled": True}, headers=_NO_STORE)
            state = (await fresh_status(reader, job_id)).state  # it ended meanwhile
    except Exception as exc:
        return failure(exc)
    return _not_running(state)


def _not_running(state: JobState) -> Response:
    """409 for a cancel of a job that is not RUNNING, with its state."""
    if state is JobState.STALE:
        message = "job is STALE: its worker stopped beating, no worker would act on a cancel"
    else:
        message = "job is not running"
    return json({"error": message, "state": state.name}, 409, _NO_STORE)
