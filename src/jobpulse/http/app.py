"""The ASGI app: job status as JSON (ETag / 304), job events as SSE, the job list, a dashboard.

A thin adapter over a :class:`~jobpulse.StatusReader`: every status comes from ``reader.get``
(so the reader's cache and single flight sit in front of Redis), every event stream is a
``reader.watch`` (so all SSE clients of the process share the reader's one XREAD loop). The
app keeps its state on itself (``app.state.jobpulse``), never in module globals, so any number
of apps can live in one process.

Job ids may hold ``/`` and ``:``. ``GET /jobs/{job_id}/events`` is the event stream of the job
whose id is the part before the literal ``/events``; a client that must name a job whose own id
ends in ``/events`` percent-encodes its slashes (``encodeURIComponent``), which the app decodes
after routing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import random
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .._checks import check_number, check_seconds
from .._protocol.codec import parse_stream_id
from .._protocol.keys import check_job_id
from .._reader.event import Event
from .._reader.reader import StatusReader
from .._reader.status import JobState, JobStatus, live_statuses
from ..errors import InvalidJobId
from . import operate
from .auth import check_token
from .longpoll import Crowded, LongPollHub, parse_wait, until_disconnect
from .responses import error as _error
from .responses import failure as _failure
from .responses import fault_message
from .responses import http_error as _http_error
from .responses import internal_error as _internal_error
from .responses import json as _json
from .retry import RETRY_MIN, cache_control, retry_after
from .sse import EventStream, encode_event

__all__ = ["Authorize", "HttpConfig", "create_app"]

Authorize = Callable[[Request, str], bool | Awaitable[bool]]
"""``authorize(request, job_id)``: True to allow; a plain function or a coroutine function."""

_STATIC = ("dashboard.html", "dashboard.js", "dashboard.css")
_MEDIA = {
    "html": "text/html; charset=utf-8",
    "js": "text/javascript; charset=utf-8",
    "css": "text/css; charset=utf-8",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpConfig:
    """Options of :func:`create_app`. Every field is checked.

    Attributes:
        keepalive: seconds of silence on an event stream before a ``: keep-alive`` comment (> 0).
        retry: reconnection delay suggested to SSE clients, in seconds (>= 0).
        index_shards: shards of the running-jobs index, as the workers were started with (>= 1).
        max_jobs: most jobs ``GET /jobs`` lists (>= 1).
        max_wait: the longest long poll (``?wait=``) in seconds; longer asks are cut to it (> 0).
        max_waiters: long polls parked at once in this process (>= 1); past it, 503.
        wait_interval: seconds between two reads of a job that long polls wait on (> 0).
        stale_while_revalidate: ``stale-while-revalidate`` of status responses, seconds (>= 0).
    """

    keepalive: float = 15.0
    retry: float = 2.0
    index_shards: int = 1
    max_jobs: int = 500
    max_wait: float = 30.0
    max_waiters: int = 10_000
    wait_interval: float = 0.25
    stale_while_revalidate: float = 1.0

    def __post_init__(self) -> None:
        positive = ("keepalive", "max_wait", "wait_interval")
        for name in (*positive, "retry", "stale_while_revalidate"):
            check_seconds(name, getattr(self, name), positive=name in positive)
        for name in ("index_shards", "max_jobs", "max_waiters"):
            check_number(name, getattr(self, name), integer=True, minimum=1, strict=False)


def create_app(
    reader: StatusReader,
    *,
    authorize: Authorize | None = None,
    token: str | None = None,
    keepalive: float = 15.0,
    retry: float = 2.0,
    index_shards: int = 1,
    max_jobs: int = 500,
    max_wait: float = 30.0,
    max_waiters: int = 10_000,
    wait_interval: float = 0.25,
    stale_while_revalidate: float = 1.0,
) -> Starlette:
    """An ASGI app serving job status, job events and a dashboard from ``reader``.

    Routes: ``GET /`` (the dashboard), ``GET /jobs`` (running and stale jobs),
    ``GET /jobs/{job_id}`` (JSON status, ``ETag``, 304, ``Retry-After`` while it runs; with
    ``?wait=N`` and ``If-None-Match``, a long poll), ``GET /jobs/{job_id}/events`` (SSE),
    ``GET /metrics`` (Prometheus, the ``prometheus`` extra), ``POST /jobs/{job_id}/cancel``.
    Mount it anywhere (``app.mount("/jobpulse", create_app(reader))``); the dashboard uses
    relative URLs. The reader stays the caller's: the app never closes it.

    Args:
        reader: the :class:`~jobpulse.StatusReader` every request goes through.
        authorize: ``authorize(request, job_id) -> bool`` (sync or async), asked for each job
            a request would show or cancel, and with ``""`` for ``GET /metrics``; False answers
            403 (and leaves the job out of ``GET /jobs``).
        token: the operator token: ``POST /jobs/{job_id}/cancel`` and ``GET /metrics`` then
            answer 401 unless the request carries ``Authorization: Bearer <token>`` (checked
            before ``authorize``). Status, events and the job list stay open to ``authorize``.
        keepalive: seconds between ``: keep-alive`` comments on an idle event stream.
        retry: reconnection delay suggested to EventSource clients (``retry:``), in seconds.
        index_shards: the ``index_shards`` the workers use (for ``GET /jobs``).
        max_jobs: most jobs ``GET /jobs`` answers.
        max_wait: the longest long poll in seconds (``?wait=`` above it is cut to it).
        max_waiters: long polls parked at once in this process; past it they are answered
            503 with ``Retry-After``.
        wait_interval: seconds between two reads (through the reader's cache) of a job that
            long polls wait on: one read per job, whatever the number of parked requests.
        stale_while_revalidate: the ``stale-while-revalidate`` of status responses, seconds.

    Returns:
        A Starlette application.

    Raises:
        ValueError: an option is out of range (the message names it).
        TypeError: an option has the wrong type, or ``authorize`` is not callable.
    """
    if authorize is not None and not callable(authorize):
        raise TypeError(f"authorize must be callable, got {authorize!r}")
    secret = check_token(token)
    config = HttpConfig(
        keepalive=keepalive, retry=retry, index_shards=index_shards, max_jobs=max_jobs,
        max_wait=max_wait, max_waiters=max_waiters, wait_interval=wait_interval,
        stale_while_revalidate=stale_while_revalidate,
    )  # fmt: skip
    service = _Service(reader, authorize, config)
    service.token = secret
    app = Starlette(
        routes=[
            Route("/", service.dashboard, methods=["GET"]),
            Route("/dashboard.js", service.static, methods=["GET"]),
            Route("/dashboard.css", service.static, methods=["GET"]),
            Route("/jobs", service.list_jobs, methods=["GET"]),
            Route("/jobs/{rest:path}", service.job, methods=["GET"]),
            Route("/jobs/{rest:path}", service.cancel, methods=["POST"]),
            Route("/metrics", service.metrics, methods=["GET"]),
        ],
        exception_handlers={HTTPException: _http_error, Exception: _internal_error},
    )
    app.state.jobpulse = service
    return app


# -- responses -------------------------------------------------------------------------------


def etag_of(status: JobStatus) -> str:
    """A weak ETag naming the snapshot version: fence, seq, the state (STALE has the same seq
    as the RUNNING it was) and ``.cancel`` while a cancel request waits (``cancel.lua`` sets a
    flag without a new seq). Fences grow over a job id's whole life, so no two runs share one."""
    cancel = ".cancel" if status.cancel_requested else ""
    return f'W/"{status.fence or 0}.{status.seq or 0}.{status.state.name}{cancel}"'


def _matches(if_none_match: str, etag: str) -> bool:
    """Weak comparison of ``If-None-Match`` (a list of tags, or ``*``) with ``etag``."""
    opaque = etag.removeprefix("W/")
    for tag in if_none_match.split(","):
        tag = tag.strip()
        if tag == "*" or tag.removeprefix("W/") == opaque:
            return True
    return False


_EVENT_FIELDS = tuple(f.name for f in dataclasses.fields(Event))


def event_data(job_id: str, event: Event) -> dict[str, Any]:
    """The ``data:`` JSON of one event: ``job_id`` and every field of :class:`Event`."""
    return {"job_id": job_id, **{name: getattr(event, name) for name in _EVENT_FIELDS}}


class _FrameCache:
    """Encoded SSE frames of recent events, shared by every client of the app.

    The watch hub hands the same event to every watcher of a job; encoding it once instead of
    once per client is what keeps a fan-out to thousands of clients cheap. Bounded (FIFO).
    """

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._frames: OrderedDict[tuple[str, str, str, bool], bytes] = OrderedDict()

    def frame(self, job_id: str, event: Event) -> bytes:
        key = (job_id, event.id, event.kind, event.synthetic)
        frame = self._frames.get(key)
        if frame is None:
            data = orjson.dumps(event_data(job_id, event)).decode()
            frame = encode_event(data, event=event.kind, id=event.id)
            self._frames[key] = frame
            if len(self._frames) > self._size:
                self._frames.popitem(last=False)
        return frame


# -- the service -----------------------------------------------------------------------------


class _Service:
    """The app's state and handlers (one per app)."""

    def __init__(
        self, reader: StatusReader, authorize: Authorize | None, config: HttpConfig
    ) -> None:
        self.reader = reader
        self.authorize = authorize
        self.config = config
        self.token: bytes | None = None  # the operator token (never in a repr or a log)
        package = resources.files(__package__) / "static"
        self.files = {name: (package / name).read_bytes() for name in _STATIC}
        self.frames = _FrameCache()
        self.rng = random.Random()
        self.longpoll = LongPollHub(
            reader.get, interval=config.wait_interval, max_waiters=config.max_waiters
        )
        # Set when the server shuts down (``jobpulse serve`` on SIGTERM): event streams end and
        # parked long polls answer at once, so the graceful shutdown never has to cancel them.
        self.draining = asyncio.Event()

    def drain(self) -> None:
        """End every event stream and long poll now, and those that start from now on."""
        self.draining.set()

    def __repr__(self) -> str:
        return f"<jobpulse http namespace={self.reader.namespace} {self.config}>"

    # -- helpers --

    async def allowed(self, request: Request, job_id: str) -> bool:
        if self.authorize is None:
            return True
        verdict = self.authorize(request, job_id)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        return bool(verdict)

    def _headers(self, status: JobStatus, *, store: bool = True) -> dict[str, str]:
        """ETag, Cache-Control and (while the job may change) Retry-After of a status."""
        cfg = self.reader.config
        headers = {
            "etag": etag_of(status),
            "cache-control": cache_control(
                status, ttl=cfg.cache_ttl, terminal_ttl=cfg.terminal_seconds,
                stale=self.config.stale_while_revalidate,
            ) if store else "no-store",
        }  # fmt: skip
        delay = retry_after(status, self.rng)
        if delay is not None:
            headers["retry-after"] = str(delay)
        return headers

    # -- routes --

    async def metrics(self, request: Request) -> Response:
        """``GET /metrics`` (see ``operate.py``)."""
        return await operate.metrics(
            request,
            self.allowed,
            self.reader,
            token=self.token,
            index_shards=self.config.index_shards,
        )

    async def cancel(self, request: Request) -> Response:
        """``POST /jobs/{job_id}/cancel`` (see ``operate.py``)."""
        return await operate.cancel(request, self.allowed, self.reader, token=self.token)

    async def dashboard(self, request: Request) -> Response:
        return Response(self.files["dashboard.html"], media_type=_MEDIA["html"])

    async def static(self, request: Request) -> Response:
        name = request.url.path.rsplit("/", 1)[-1]
        return Response(
            self.files[name],
            media_type=_MEDIA[name.rsplit(".", 1)[-1]],
            headers={"cache-control": "max-age=60"},
        )

    async def job(self, request: Request) -> Response:
        rest: str = request.path_params["rest"]
        raw = request.scope.get("raw_path")
        tail = raw.endswith(b"/events") if isinstance(raw, bytes) else True
        if tail and rest.endswith("/events"):
            return await self.events(request, rest[: -len("/events")])
        return await self.status(request, rest)

    async def status(self, request: Request, job_id: str) -> Response:
        """``GET /jobs/{job_id}``: the status as JSON, with an ETag; ``?wait=N`` long-polls."""
        try:
            check_job_id(job_id)
        except InvalidJobId:
            return _error(400, "invalid job id")
        wait = request.query_params.get("wait")
        timeout = None if wait is None else parse_wait(wait, self.config.max_wait)
        if wait is not None and timeout is None:
            return _error(400, "invalid wait: seconds, a number >= 0")
        if not await self.allowed(request, job_id):
            return _error(403, "forbidden")
        try:
            status = await self.reader.get(job_id)
        except Exception as exc:
            return _failure(exc)
        if status.state is JobState.UNKNOWN:
            return _error(404, "no such job")
        match = request.headers.get("if-none-match")
        if match is None or not _matches(match, etag_of(status)):
            return _json(status.as_dict(), headers=self._headers(status, store=wait is None))
        if not timeout or status.state.is_terminal:
            return Response(status_code=304, headers=self._headers(status, store=wait is None))
        return await self._long_poll(request, job_id, status, timeout)

    async def _long_poll(
        self, request: Request, job_id: str, status: JobStatus, seconds: float
    ) -> Response:
        """Park until the version moves past ``status`` (200) or ``seconds`` pass (304).

        A client that goes away unparks its request at once (the server would not tell the
        handler otherwise, and a parked request holds one of ``max_waiters`` places).
        """
        parked = asyncio.ensure_future(self.longpoll.wait(job_id, status, seconds))
        gone = asyncio.ensure_future(until_disconnect(request.receive))
        drained = asyncio.ensure_future(self.draining.wait())
        try:
            await asyncio.wait((parked, gone, drained), return_when=asyncio.FIRST_COMPLETED)
        finally:
            drained.cancel()
            gone.cancel()
            if gone.done() and not gone.cancelled():
                gone.exception()  # retrieved: a receive() that failed means the client left
            if not parked.done():
                parked.cancel()
                await asyncio.wait((parked,))  # its finally unparks it before we answer
        try:
            moved = None if parked.cancelled() else parked.result()
        except Crowded:
            response = _error(503, "too many waiting requests")
            response.headers["retry-after"] = str(retry_after(status, self.rng) or RETRY_MIN)
            return response
        except Exception as exc:
            return _failure(exc)
        if moved is None:
            return Response(status_code=304, headers=self._headers(status, store=False))
        return _json(moved.as_dict(), headers=self._headers(moved, store=False))

    async def events(self, request: Request, job_id: str) -> Response:
        """``GET /jobs/{job_id}/events``: the job's events as SSE, resumable."""
        try:
            check_job_id(job_id)
        except InvalidJobId:
            return _error(400, "invalid job id")
        last = request.headers.get("last-event-id") or request.query_params.get("last_event_id")
        if last is not None:
            try:
                parse_stream_id(last)
            except (ValueError, TypeError):
                return _error(400, "invalid last event id")
        if not await self.allowed(request, job_id):
            return _error(403, "forbidden")
        try:
            status = await self.reader.get(job_id)
            gap = last is not None and await self.reader.trimmed_after(job_id, last)
        except Exception as exc:
            return _failure(exc)
        if status.state is JobState.UNKNOWN:
            return _error(404, "no such job")
        snapshot = {"gap": True, **status.as_dict()} if gap else None
        frames = self._frames(job_id, last, snapshot)
        return EventStream(
            frames,
            keepalive=self.config.keepalive,
            retry=int(self.config.retry * 1000),
            until=self.draining,
        )

    async def _frames(
        self, job_id: str, last: str | None, snapshot: dict[str, Any] | None
    ) -> AsyncIterator[bytes]:
        watch = self.reader.watch(job_id, last_event_id=last)
        try:
            if snapshot is not None:
                # No id: the client keeps its Last-Event-ID until the first real entry.
                yield encode_event(orjson.dumps(snapshot).decode(), event="snapshot")
            async for event in watch:
                yield self.frames.frame(job_id, event)
        except Exception as exc:
            message = fault_message(exc, f"event stream of {job_id}")
            yield encode_event(orjson.dumps({"error": message}).decode(), event="fault")
        finally:
            await watch.aclose()

    async def list_jobs(self, request: Request) -> Response:
        """``GET /jobs``: running and stale jobs, from the running-jobs index (never SCAN)."""
        try:
            ids, truncated = await self.reader.running_ids(
                index_shards=self.config.index_shards, limit=self.config.max_jobs
            )
        except Exception as exc:
            return _failure(exc)
        allowed = []
        for job_id in ids:
            if await self.allowed(request, job_id):
                allowed.append(job_id)
        results = await asyncio.gather(
            *(self.reader.get(job_id) for job_id in allowed), return_exceptions=True
        )
        try:
            jobs = [status.as_dict() for status in live_statuses(results)]
        except Exception as exc:
            return _failure(exc)
        return _json({"jobs": jobs, "truncated": truncated}, headers={"cache-control": "no-store"})
