"""The watch hub: one XREAD BLOCK loop per reader serves every watcher of every job.

How a watcher joins without a gap or a duplicate (``Watch._sync``):
  1. it reads the stream's history with XRANGE (from the start, or right after
     ``last_event_id``) and keeps it to yield first;
  2. synchronously after the last page, it attaches to the hub with the id of the last entry it
     read. A stream new to the hub starts its cursor there. A stream the hub already follows
     keeps its cursor C; if C is ahead of the watcher, the watcher reads ``(last, C]`` with XRANGE
     (every entry up to C was delivered before it attached, so it exists in Redis), while the hub
     queues everything after C for it;
  3. it yields history, catch-up, then its queue, dropping any id not above the last it yielded.

The hub's XREAD names every followed stream with its cursor. When a new stream joins while the
XREAD is blocked, the hub interrupts it with ``CLIENT UNBLOCK <id>`` (sent on the reader's normal
pool, retried until the blocked call returns), so the new stream is included at once; where
``CLIENT UNBLOCK`` is not allowed (ACLs) the new stream waits at most one ``block`` timeout.

Liveness: every ``liveness_interval`` seconds (and right after a new stream joins) the hub reads
``status`` and the liveness key's PTTL of every followed job in one pipeline. A job that is
RUNNING without its liveness key is STALE: the hub flushes the stream's remaining entries with
XRANGE and, unless they hold a terminal entry, hands each watcher a synthetic ``stale`` event
(status ``STALE``) and stops following the stream. A job whose status is terminal but whose
``end`` entry is gone (trimmed, deleted) ends with a synthetic ``end`` the same way.

Overflow: each watcher has a bounded queue (``queue_size`` events). The hub never waits for a
watcher: when a queue is full, the hub drops that watcher from the stream; the watcher drains
what it has and then resyncs from the stream by id (steps 1-3 again, after the last id it
yielded) — it lags, it loses nothing (unless ``MAXLEN`` trimmed the entries meanwhile), and the
other watchers never notice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any

from redis.exceptions import ResponseError

from .._protocol.codec import TERMINAL_STATUSES, parse_stream_id, to_text
from .._protocol.errors import is_redis_fault
from .._protocol.keys import KeySchema
from ..errors import ProtocolError
from .backoff import Backoff
from .event import Event, decode_event

__all__ = ["HubStatistics", "Watch", "WatchHub"]

log = logging.getLogger("jobpulse")

_PAGE = 500
"""Entries per XRANGE page when reading history."""

_Item = Event | BaseException | None
"""What a watcher's queue holds: an event, an error to raise, or None (a wake-up)."""


@dataclass(frozen=True, slots=True)
class HubStatistics:
    """Counters of one watch hub.

    Attributes:
        streams: streams followed now.
        watchers: watchers attached now.
        xreads: XREAD calls sent.
        unblocks: CLIENT UNBLOCK calls sent.
        liveness_checks: liveness pipelines sent.
        overflows: watchers dropped because their queue was full (they resync by id).
    """

    streams: int
    watchers: int
    xreads: int
    unblocks: int
    liveness_checks: int
    overflows: int


class _Watcher:
    """The hub's side of one watcher: its bounded queue and where it is attached."""

    __slots__ = ("failure", "overflowed", "queue", "stream")

    def __init__(self, queue_size: int) -> None:
        self.queue: asyncio.Queue[_Item] = asyncio.Queue(queue_size)
        self.stream: _Stream | None = None
        self.overflowed = False
        self.failure: BaseException | None = None

    def offer(self, item: Event | BaseException) -> bool:
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            self.overflowed = True
            self.stream = None
            return False
        return True

    def fail(self, exc: BaseException) -> None:
        self.failure = exc
        self.stream = None
        if self.queue.empty():
            self.queue.put_nowait(None)


@dataclass(eq=False, slots=True)
class _Stream:
    key: str
    state_key: str
    alive_key: str
    cursor: str
    watchers: set[_Watcher]


def _entries(reply: Any) -> list[tuple[str, list[Any]]]:
    """XREAD's reply (RESP2 list or RESP3 map, bytes or str) as ``[(key, entries)]``."""
    if not reply:
        return []
    pairs = reply.items() if isinstance(reply, dict) else reply
    return [(to_text(key) or "", list(entries or ())) for key, entries in pairs]


class WatchHub:
    """One reader's shared XREAD loop. Created by :class:`StatusReader`; not public.

    Args:
        redis: the reader's client; the hub takes one dedicated connection from its pool.
        schema: key names.
        block: XREAD BLOCK timeout in seconds (kept under the client's socket timeout).
        liveness_interval: seconds between liveness checks of the followed jobs.
        queue_size: events buffered per watcher before it is dropped to resync.
        slots: bounds the reader's calls in flight on the client's pool (history reads).
        count: XREAD COUNT per stream and call.
        clock: monotonic clock.
    """

    def __init__(
        self,
        redis: Any,
        schema: KeySchema,
        *,
        block: float,
        liveness_interval: float,
        queue_size: int,
        slots: asyncio.Semaphore,
        count: int = 100,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._redis = redis
        self._schema = schema
        timeout = getattr(getattr(redis, "connection_pool", None), "connection_kwargs", {}).get(
            "socket_timeout"
        )
        if timeout:
            block = min(block, timeout / 2)
        self._block_ms = max(int(block * 1000), 1)
        self._interval = liveness_interval
        self.queue_size = queue_size
        self.slots = slots
        self._count = count
        self._clock = clock
        self._streams: dict[str, _Stream] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._unblocker: asyncio.Task[None] | None = None
        self._client_id: int | None = None
        self._unblock_allowed = True
        self._reading = False
        self._sent: frozenset[str] = frozenset()
        self._next_liveness = 0.0
        self._closed = False
        self._xreads = self._unblocks = self._checks = self._overflows = 0

    def statistics(self) -> HubStatistics:
        watchers = sum(len(s.watchers) for s in self._streams.values())
        return HubStatistics(
            len(self._streams), watchers, self._xreads, self._unblocks, self._checks,
            self._overflows,
        )  # fmt: skip

    def __repr__(self) -> str:
        s = self.statistics()
        return f"<WatchHub streams={s.streams} watchers={s.watchers} xreads={s.xreads}>"

    # -- attach and detach (synchronous: no await may split them) -----------------------------

    def attach(self, watcher: _Watcher, job_id: str, last_id: str) -> str | None:
        """Attach ``watcher`` to the job's stream; it has read every entry up to ``last_id``.

        Returns:
            The hub's cursor when it is ahead of ``last_id`` (the watcher reads up to it with
            XRANGE), else None.

        Raises:
            RuntimeError: the reader is closed.
        """
        if self._closed:
            raise RuntimeError("the StatusReader is closed")
        keys = self._schema.job(job_id)
        stream = self._streams.get(keys.events)
        ahead = None
        if stream is None:
            stream = _Stream(keys.events, keys.state, keys.alive, last_id, set())
            self._streams[keys.events] = stream
            self._next_liveness = 0.0  # check the new job's liveness right away
        elif parse_stream_id(stream.cursor) > parse_stream_id(last_id):
            ahead = stream.cursor
        stream.watchers.add(watcher)
        watcher.stream = stream
        watcher.overflowed = False
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="jobpulse-watch")
        self._wake.set()
        if stream.key not in self._sent:
            self._request_unblock()
        return ahead

    def detach(self, watcher: _Watcher) -> None:
        stream, watcher.stream = watcher.stream, None
        if stream is not None:
            stream.watchers.discard(watcher)
            if not stream.watchers:
                self._drop(stream)

    def _drop(self, stream: _Stream) -> None:
        if self._streams.get(stream.key) is stream:
            del self._streams[stream.key]

    async def aclose(self) -> None:
        """Stop the loop; attached watchers raise ``RuntimeError`` once they drained."""
        self._closed = True
        error = RuntimeError("the StatusReader was closed")
        for stream in list(self._streams.values()):
            for watcher in list(stream.watchers):
                watcher.fail(error)
        self._streams.clear()
        for task in (self._unblocker, self._task):
            if task is not None and not task.done():
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        raise

    # -- the loop ------------------------------------------------------------------------------

    async def _run(self) -> None:
        conn = self._redis.client()
        backoff: Backoff | None = None
        try:
            while not self._closed:
                if not self._streams:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                try:
                    await self._step(conn)
                    backoff = None
                except ResponseError as exc:
                    if "WRONGTYPE" not in str(exc):
                        raise
                    await self._fail_foreign_keys()
                except UnicodeDecodeError:  # decode_responses and a foreign, non-UTF-8 entry
                    await self._fail_undecodable()
                except Exception as exc:
                    if not is_redis_fault(exc):
                        raise
                    self._client_id = None
                    log.warning("jobpulse watch: XREAD failed, retrying: %r", exc)
                    backoff = backoff or Backoff(0.05, 2.0, 2.0, 0.1)
                    await asyncio.sleep(next(backoff))
        except Exception as exc:  # a bug, not a Redis fault: end the watchers instead of hanging
            log.exception("jobpulse watch hub crashed; ending its watchers")
            for stream in list(self._streams.values()):
                for watcher in list(stream.watchers):
                    watcher.fail(exc)
            self._streams.clear()
        finally:
            self._reading = False
            await asyncio.shield(conn.aclose())

    async def _step(self, conn: Any) -> None:
        if self._client_id is None:
            self._client_id = int(await conn.client_id())
        request = {s.key: s.cursor for s in self._streams.values()}
        self._sent = frozenset(request)
        self._reading = True
        self._xreads += 1
        try:
            reply = await conn.xread(request, count=self._count, block=self._block_ms)
        finally:
            self._reading = False
            self._sent = frozenset()
        for key, entries in _entries(reply):
            stream = self._streams.get(key)
            if stream is not None:
                self._deliver(stream, entries)
        if self._clock() >= self._next_liveness:
            self._next_liveness = self._clock() + self._interval
            await self._check_liveness()

    def _deliver(self, stream: _Stream, entries: list[Any]) -> bool:
        """Hand ``entries`` to the stream's watchers; True when the stream ended."""
        for entry_id, raw in entries:
            item: Event | BaseException
            try:
                item = decode_event(entry_id, raw)
            except ProtocolError as exc:
                item = exc
            stream.cursor = to_text(entry_id) or stream.cursor
            self._offer(stream, item)
            if not isinstance(item, Event) or item.terminal:
                self._drop(stream)
                return True
        return False

    def _offer(self, stream: _Stream, item: Event | BaseException) -> None:
        for watcher in list(stream.watchers):
            if not watcher.offer(item):
                stream.watchers.discard(watcher)
                self._overflows += 1
        if not stream.watchers:
            self._drop(stream)

    async def _check_liveness(self) -> None:
        streams = list(self._streams.values())
        self._checks += 1
        async with self._redis.pipeline(transaction=False) as pipe:
            for s in streams:
                pipe.hget(s.state_key, "status")
                pipe.pttl(s.alive_key)
            replies = await pipe.execute(raise_on_error=False)
        for i, stream in enumerate(streams):
            status, pttl = replies[2 * i], replies[2 * i + 1]
            if isinstance(status, Exception) or isinstance(pttl, Exception):
                continue
            try:
                status = to_text(status)
            except UnicodeDecodeError:
                continue
            if status == "RUNNING" and pttl == -2:
                verdict, kind = "STALE", "stale"
            elif status in TERMINAL_STATUSES:
                verdict, kind = status, "end"
            else:
                continue
            if self._streams.get(stream.key) is not stream:
                continue
            # Entries may be in the stream that no XREAD returned yet: deliver them first.
            try:
                rest = await self._redis.xrange(stream.key, min=f"({stream.cursor}", max="+")
            except UnicodeDecodeError:
                self._fail(stream, ProtocolError(f"{stream.key} holds text that is not UTF-8"))
                continue
            if self._streams.get(stream.key) is not stream or self._deliver(stream, rest):
                continue
            synthetic = Event(id=stream.cursor, kind=kind, status=verdict, synthetic=True)
            self._offer(stream, synthetic)
            self._drop(stream)

    async def _fail_foreign_keys(self) -> None:
        """XREAD said WRONGTYPE: end the watchers of every key that is not a stream."""
        streams = list(self._streams.values())
        async with self._redis.pipeline(transaction=False) as pipe:
            for s in streams:
                pipe.type(s.key)
            types = await pipe.execute()
        for stream, kind in zip(streams, types, strict=True):
            if to_text(kind) not in ("stream", "none"):
                self._fail(
                    stream, ProtocolError(f"{stream.key} is a {to_text(kind)}, not a stream")
                )

    async def _fail_undecodable(self) -> None:
        """XREAD could not decode its reply as UTF-8: end the watchers of the streams at fault."""
        for stream in list(self._streams.values()):
            try:
                await self._redis.xrange(stream.key, min=f"({stream.cursor}", max="+", count=100)
            except UnicodeDecodeError:
                self._fail(stream, ProtocolError(f"{stream.key} holds text that is not UTF-8"))

    def _fail(self, stream: _Stream, error: BaseException) -> None:
        for watcher in list(stream.watchers):
            watcher.fail(error)
        self._drop(stream)

    # -- interrupting a blocked XREAD ----------------------------------------------------------

    def _request_unblock(self) -> None:
        if (
            self._reading
            and self._unblock_allowed
            and self._client_id is not None
            and (self._unblocker is None or self._unblocker.done())
        ):
            self._unblocker = asyncio.get_running_loop().create_task(self._unblock())

    async def _unblock(self) -> None:
        # Retried: CLIENT UNBLOCK answers 0 when the XREAD has not reached the server yet (or
        # has just returned); stop once the call in flight names every stream, or none is.
        try:
            for _ in range(1000):
                if not self._reading or self._sent.issuperset(self._streams):
                    return
                client_id = self._client_id
                if client_id is None:
                    return
                self._unblocks += 1
                await self._redis.client_unblock(client_id)
                await asyncio.sleep(0.002)
        except Exception as exc:
            if not is_redis_fault(exc):
                raise
            if isinstance(exc, ResponseError):
                self._unblock_allowed = False  # e.g. NOPERM: rely on the block timeout
            log.warning("jobpulse watch: CLIENT UNBLOCK failed: %r", exc)


class Watch:
    """An async iterator of a job's :class:`Event`s; see :meth:`StatusReader.watch`.

    Also an async context manager: leaving it (or :meth:`aclose`) detaches the watcher.
    """

    def __init__(
        self, hub: WatchHub, redis: Any, job_id: str, events_key: str, last_event_id: str | None
    ) -> None:
        if last_event_id is not None:
            try:
                self._last = parse_stream_id(last_event_id)
            except (ValueError, TypeError, AttributeError):
                raise ValueError(
                    f"last_event_id must be a stream entry id like '1700000000000-0', "
                    f"got {last_event_id!r}"
                ) from None
            last_event_id = f"{self._last[0]}-{self._last[1]}"
        else:
            self._last = (0, 0)
        self._last_id = last_event_id
        self._hub = hub
        self._redis = redis
        self.job_id = job_id
        self._key = events_key
        self._watcher = _Watcher(hub.queue_size)
        self._pending: deque[Event | BaseException] = deque()
        self._started = False
        self._done = False

    def __repr__(self) -> str:
        return f"<Watch job={self.job_id} last={self._last_id} done={self._done}>"

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> Event:
        while not self._done:
            if self._pending:
                event = self._accept(self._pending.popleft())
                if event is not None:
                    return event
                continue
            if not self._started:
                self._started = True
                await self._guarded(self._sync())
                continue
            watcher = self._watcher
            if watcher.queue.empty():
                if watcher.failure is not None:
                    self._finish()
                    raise watcher.failure
                if watcher.overflowed or watcher.stream is None:
                    await self._guarded(self._sync())
                    continue
            try:
                item = await watcher.queue.get()
            except asyncio.CancelledError:
                self._suspend()
                raise
            if item is not None:
                event = self._accept(item)
                if event is not None:
                    return event
        raise StopAsyncIteration

    async def _guarded(self, step: Any) -> None:
        try:
            await step
        except asyncio.CancelledError:
            self._suspend()
            raise
        except BaseException:
            self._finish()
            raise

    def _suspend(self) -> None:
        """The consumer was cancelled: leave the hub (a consumer that never comes back must not
        stay attached); a later ``__anext__`` resyncs from the last yielded id, losing nothing."""
        self._hub.detach(self._watcher)
        self._watcher = _Watcher(self._hub.queue_size)
        self._started = False

    def _accept(self, item: Event | BaseException) -> Event | None:
        if isinstance(item, BaseException):
            self._finish()
            raise item
        if item.synthetic:
            item = replace(item, id=self._last_id or "0-0")
        else:
            key = parse_stream_id(item.id)
            if key <= self._last:
                return None  # already yielded (history, catch-up and live overlap)
            self._last, self._last_id = key, item.id
        if item.terminal:
            self._finish()
        return item

    def _finish(self) -> None:
        self._done = True
        self._hub.detach(self._watcher)

    async def _sync(self) -> None:
        """Read the stream after the last yielded id, then (re)attach to the hub."""
        start = "-" if self._last_id is None else f"({self._last_id}"
        history = await self._read(start, "+")
        self._pending.extend(history)
        if any(not isinstance(e, Event) or e.terminal for e in history):
            return
        last = history[-1].id if history else (self._last_id or "0-0")  # type: ignore[union-attr]
        ahead = self._hub.attach(self._watcher, self.job_id, last)
        if ahead is not None:
            self._pending.extend(await self._read(f"({last}", ahead))

    async def _read(self, start: str, end: str) -> list[Event | BaseException]:
        out: list[Event | BaseException] = []
        while True:
            try:
                async with self._hub.slots:
                    page = await self._redis.xrange(self._key, min=start, max=end, count=_PAGE)
            except ResponseError as exc:
                if "WRONGTYPE" in str(exc):
                    raise ProtocolError(f"{self._key} is not a stream") from None
                raise
            except UnicodeDecodeError:
                raise ProtocolError(f"{self._key} holds text that is not UTF-8") from None
            for entry_id, raw in page:
                try:
                    out.append(decode_event(entry_id, raw))
                except ProtocolError as exc:
                    out.append(exc)
                    return out
            if len(page) < _PAGE:
                return out
            start = f"({to_text(page[-1][0])}"

    async def aclose(self) -> None:
        """Stop watching (idempotent)."""
        self._finish()

    async def __aenter__(self) -> Watch:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
