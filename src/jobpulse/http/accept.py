"""``accepted()``: the ``202 Accepted`` a route returns after starting a job.

The async request-reply pattern: a request that starts heavy work is answered at once, with
where to ask about it (``Location``) and when (``Retry-After``); the work goes on behind it.
"""

from __future__ import annotations

from urllib.parse import quote

import orjson
from starlette.requests import Request
from starlette.responses import Response

from .._protocol.keys import check_job_id
from .retry import RETRY_MIN

__all__ = ["accepted", "status_path"]


def status_path(request: Request, job_id: str, *, mount: str = "") -> str:
    """The path of ``GET /jobs/{job_id}`` of a jobpulse app mounted at ``mount``, as the client
    must request it: behind the server's ``root_path`` (``uvicorn --root-path``, a proxy's
    prefix), with the id percent-encoded (its ``/`` too, so an id ending in ``/events`` still
    names the status and not the event stream).

    Args:
        request: the request being answered (for its ``root_path``).
        job_id: the job.
        mount: where the jobpulse app is mounted in the app serving ``request``
            (``app.mount("/jobpulse", create_app(reader))`` → ``"/jobpulse"``); ``""`` when the
            jobpulse app is the app itself.

    Raises:
        InvalidJobId: ``job_id`` is invalid.
        ValueError: ``mount`` is neither empty nor a path starting with ``/``.
    """
    check_job_id(job_id)
    if mount and not mount.startswith("/"):
        raise ValueError(f"mount must be empty or start with '/', got {mount!r}")
    root = str(request.scope.get("root_path", "")).rstrip("/")
    return f"{root}{mount.rstrip('/')}/jobs/{quote(job_id, safe=':')}"


def accepted(request: Request, job_id: str, *, mount: str = "") -> Response:
    """``202 Accepted`` for a job just started: ``Location`` is its status URL, ``Retry-After``
    when to ask first, and a small JSON body naming the job and its URLs.

    Return it from a Starlette or FastAPI route once the job's ``heartbeat()`` holds its lease
    (so the status URL answers at once)::

        @app.post("/reports")
        async def start(request: Request) -> Response:
            job_id = await start_report_in_background()
            return accepted(request, job_id, mount="/jobpulse")

    The body is ``{"job_id": ..., "status": <status path>, "events": <status path>/events}``.
    ``Retry-After`` is 1: the seed's first step, 0.5 s, in whole seconds.
    The response is never cached (``Cache-Control: no-store``).

    Args:
        request: the request that started the job.
        job_id: the job.
        mount: where the jobpulse app is mounted (see :func:`status_path`).

    Returns:
        A Starlette ``Response`` (FastAPI returns it as is).

    Raises:
        InvalidJobId: ``job_id`` is invalid.
        ValueError: ``mount`` is not a path.
    """
    status = status_path(request, job_id, mount=mount)
    body = {"job_id": job_id, "status": status, "events": f"{status}/events"}
    return Response(
        orjson.dumps(body),
        status_code=202,
        media_type="application/json",
        headers={
            "location": status,
            "retry-after": str(RETRY_MIN),
            "cache-control": "no-store",
        },
    )
