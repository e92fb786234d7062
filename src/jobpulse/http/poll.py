"""``poll()``: wait on a job through its HTTP status URL, from another service.

It follows the server's pacing instead of inventing one: ``If-None-Match`` with the last ETag
and ``?wait=`` (a long poll: the server answers when the version moves, or 304 after ``wait``
seconds), then asks again at once; where the server does not hold the request (a plain
``GET``, or a server without long polls) it sleeps ``Retry-After`` (the seed's ``Backoff``
when there is none). 503 and 429 (the store is down, too many parked requests) are retried
after their ``Retry-After``; any other error status raises :class:`PollError`.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from typing import Any

import httpx

from .._reader.backoff import Backoff
from .._reader.status import JobState
from ..errors import JobpulseError

__all__ = ["PollError", "poll"]

_SETTLED = frozenset(state.value for state in JobState if state.is_settled)
_RETRIED = frozenset({429, 503})


class PollError(JobpulseError):
    """:func:`poll` got an answer it cannot go on from.

    Attributes:
        url: the status URL.
        status_code: the HTTP status (404: no such job), or None when the server could not be
            reached or answered something that is not a job status.
    """

    def __init__(self, message: str, *, url: str, status_code: int | None) -> None:
        super().__init__(message)
        self.url = url
        self.status_code = status_code

    def __reduce__(self) -> tuple[Any, ...]:
        rebuild = functools.partial(type(self), url=self.url, status_code=self.status_code)
        return (rebuild, self.args, self.__dict__)


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    try:
        seconds = float(value)
    except ValueError:
        return None  # absent, or an HTTP date (jobpulse never sends one)
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


async def poll(
    url: str,
    *,
    client: httpx.AsyncClient | None = None,
    wait: float = 30.0,
    timeout: float | None = None,  # noqa: ASYNC109 - a total deadline, documented
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Poll a jobpulse status URL until the job settles; return its last status.

    Settled means a terminal state (COMPLETED, FAILED, CANCELLED, LOST) or STALE (the worker
    died and nobody claimed the job yet), as :meth:`jobpulse.StatusReader.wait` returns.

    Args:
        url: the job's status URL (``GET /jobs/{job_id}``, e.g. a 202's ``Location``); relative
            to ``client``'s ``base_url`` when ``client`` has one.
        client: the ``httpx.AsyncClient`` to use (its auth, headers, base URL); None opens one
            for this call.
        wait: the long poll asked of the server (``?wait=``), in seconds; 0 polls plainly,
            following ``Retry-After``.
        timeout: seconds to wait in all (None: no limit).
        headers: extra request headers (e.g. authorisation).

    Returns:
        The job's status as the server's JSON (``JobStatus`` field names; ``state`` a name).

    Raises:
        PollError: 404 (no such job), another error status than 429 / 503, a body that is not
            a job status, or the server could not be reached.
        TimeoutError: the job did not settle within ``timeout``.
        ValueError: ``wait`` or ``timeout`` is negative or not finite.
    """
    if not (math.isfinite(wait) and wait >= 0):
        raise ValueError(f"wait must be a finite number >= 0, got {wait!r}")
    if timeout is not None and not (math.isfinite(timeout) and timeout >= 0):
        raise ValueError(f"timeout must be a finite number >= 0, got {timeout!r}")
    try:
        async with asyncio.timeout(timeout):
            if client is not None:
                return await _poll(client, url, wait, dict(headers or {}))
            async with httpx.AsyncClient() as own:
                return await _poll(own, url, wait, dict(headers or {}))
    except TimeoutError:
        raise TimeoutError(f"job at {url} did not settle within {timeout} s") from None


async def _poll(
    client: httpx.AsyncClient, url: str, wait: float, headers: dict[str, str]
) -> dict[str, Any]:
    delays = Backoff()
    etag: str | None = None
    body: dict[str, Any] | None = None
    request_timeout = httpx.Timeout(10.0, read=wait + 10.0)
    while True:
        long_poll = etag is not None and wait > 0
        params = {"wait": f"{wait:g}"} if long_poll else None
        sent = time.monotonic()
        try:
            response = await client.get(
                url, params=params, headers=headers, timeout=request_timeout
            )
        except httpx.TransportError as exc:
            raise PollError(f"cannot reach {url}: {exc!r}", url=url, status_code=None) from exc
        pause = _retry_after(response)
        if response.status_code == 200:
            body = _status_body(response, url)
            if body["state"] in _SETTLED:
                return body
            etag = response.headers.get("etag")
            headers["if-none-match"] = etag or ""
            if not etag:
                headers.pop("if-none-match")
        elif response.status_code == 304 and body is not None:
            pass
        elif response.status_code in _RETRIED:
            await asyncio.sleep(pause if pause is not None else next(delays))
            continue
        else:
            raise PollError(_describe(response, url), url=url, status_code=response.status_code)
        # The server held a long poll for us: ask again at once. Otherwise (a plain GET, or a
        # server that answered a long poll early without a change) follow its Retry-After.
        held = long_poll and (response.status_code == 200 or time.monotonic() - sent >= wait / 2)
        if not held:
            await asyncio.sleep(pause if pause is not None else next(delays))


def _status_body(response: httpx.Response, url: str) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("state"), str):
        raise PollError(f"{url} did not answer a job status", url=url, status_code=None)
    return body


def _describe(response: httpx.Response, url: str) -> str:
    if response.status_code == 404:
        return f"no such job: {url} (404)"
    if response.status_code == 304:
        return f"{url} answered 304 to a request without If-None-Match"
    try:
        detail = response.json().get("error")
    except (ValueError, AttributeError):
        detail = None
    return f"{url} answered {response.status_code}" + (f": {detail}" if detail else "")
