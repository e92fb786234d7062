"""User-style gateway code (202 + a status URL, a Python client), checked by ``mypy --strict``."""

from __future__ import annotations

from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route

from jobpulse import StatusReader
from jobpulse.http import PollError, accepted, create_app, poll, serve


def build(reader: StatusReader) -> Starlette:
    async def start(request: Request) -> Response:
        return accepted(request, "report-1", mount="/jobpulse")

    jobpulse_app = create_app(
        reader, max_wait=20.0, max_waiters=5000, wait_interval=0.5, stale_while_revalidate=2.0
    )
    return Starlette(routes=[Route("/reports", start, methods=["POST"]),
                             Mount("/jobpulse", jobpulse_app)])  # fmt: skip


async def follow(client: httpx.AsyncClient, location: str) -> dict[str, Any] | None:
    try:
        status: dict[str, Any] = await poll(location, client=client, wait=30, timeout=600)
    except PollError as exc:
        code: int | None = exc.status_code
        return None if code == 404 else {"error": str(exc), "url": exc.url}
    return status


def operated(reader: StatusReader, token: str) -> Starlette:
    """An app whose cancels and /metrics need ``Authorization: Bearer <token>``."""
    return create_app(reader, token=token)


def served_on_every_interface(url: str, token: str | None) -> None:
    """``serve`` beyond loopback: with a token, or explicitly insecure."""
    if token is not None:
        serve(url, "0.0.0.0", 8000, token=token)
    else:
        serve(url, "0.0.0.0", 8000, insecure=True)
