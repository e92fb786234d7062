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

The follow rules (which attempt's end ends a watch, the liveness verdict, the synthetic end)
are ``follow.py``'s, shared with the sync reader's watch.

Attempts: a job id's stream holds every attempt (each opens with a ``start`` entry; entries
carry the attempt's ``fence``). A terminal entry (``end``, ``stale``) that a later ``start``
follows belongs to an earlier attempt: it is yielded, but the watch goes on, so a watch follows
the job's last attempt to its end.

The hub's XREAD names every followed stream with its cursor. When a new stream joins while the
XREAD is blocked, the hub interrupts it with ``CLIENT UNBLOCK <id>`` (sent on the reader's normal
pool, retried until the blocked call returns), so the new stream is included at once; where
``CLIENT UNBLOCK`` is not allowed (ACLs) the new stream waits at most one ``block`` timeout.

On a Redis Cluster (see ``routing.py``) there is one such loop per master, over the streams whose
slots it owns. Redis refuses a multi-key command whose keys are in different slots (CROSSSLOT),
even on one node, so a node's loop blocks (XREAD BLOCK) while its streams share one slot, and
otherwise polls them: one pipeline of non-blocking XREADs, one per slot, every ``poll`` seconds
(cut short when a stream joins).

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
from collections import deque
from dataclasses import replace
from types import TracebackType
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from .._protocol.codec import TERMINAL_EVENT_KINDS, parse_stream_id, to_text
from .._protocol.errors import is_wrongtype
from ..errors import ProtocolError
from .event import Event, decode_event
from .follow import ends_watch, resume_point, superseded
from .hubtypes import EntryKey, Item, Watcher

if TYPE_CHECKING:
    from .routing import WatchHub

__all__ = ["Watch"]

log = logging.getLogger("jobpulse")

_PAGE = 500
"""Entries per XRANGE page when reading history."""


class Watch:
    """An async iterator of a job's :class:`Event`s; see :meth:`StatusReader.watch`.

    Also an async context manager: leaving it (or :meth:`aclose`) detaches the watcher.
    """

    def __init__(
        self, hub: WatchHub, redis: Any, job_id: str, events_key: str, last_event_id: str | None
    ) -> None:
        self._last, self._last_id = resume_point(last_event_id)
        self._hub = hub
        self._redis = redis
        self.job_id = job_id
        self._key = events_key
        self._watcher = Watcher(hub.queue_size)
        self._pending: deque[Event | BaseException] = deque()
        self._started = False
        self._done = False
        # Terminal entries of earlier attempts (a later ``start`` follows them in the stream):
        # yielded, but the watch goes on to the end of the job's last attempt.
        self._superseded: set[str] = set()

    def __repr__(self) -> str:
        return f"<Watch job={self.job_id} last={self._last_id} done={self._done}>"

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> Event:
        # The hot path (a live entry the hub parsed, nothing else pending): 1,000 watchers of
        # one job run it 1,000 times per entry.
        items = self._watcher.items
        if items and not self._pending and not self._done:
            item, key = items[0]
            if (
                key is not None
                and key > self._last
                and isinstance(item, Event)
                and item.kind not in TERMINAL_EVENT_KINDS
            ):
                items.popleft()
                self._last, self._last_id = key, item.id
                return item
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
            if watcher.items:
                item, key = watcher.items.popleft()
                event = self._accept(item, key)
                if event is not None:
                    return event
                continue
            if watcher.failure is not None:
                self._finish()
                raise watcher.failure
            if watcher.overflowed or watcher.stream is None:
                await self._guarded(self._sync())
                continue
            try:
                await watcher.wait()
            except asyncio.CancelledError:
                self._suspend()
                raise
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
        self._watcher = Watcher(self._hub.queue_size)
        self._started = False

    def _accept(self, item: Item, key: EntryKey = None) -> Event | None:
        if isinstance(item, BaseException):
            self._finish()
            raise item
        if item.synthetic:
            # The hub's resume point (see synthetic_event), never below what this watcher
            # yielded: its history may have run ahead of the hub's cursor.
            if self._last_id is not None and parse_stream_id(item.id) < self._last:
                item = replace(item, id=self._last_id)
        else:
            if key is None:
                key = parse_stream_id(item.id)
            if key <= self._last:
                return None  # already yielded (history, catch-up and live overlap)
            self._last, self._last_id = key, item.id
        if ends_watch(item, self._superseded):
            self._finish()
        return item

    def _finish(self) -> None:
        self._done = True
        self._hub.detach(self._watcher)

    async def _sync(self) -> None:
        """Read the stream after the last yielded id, then (re)attach to the hub."""
        start = "-" if self._last_id is None else f"({self._last_id}"
        history = await self._read(start, "+")
        self._superseded |= superseded(history)
        self._pending.extend(history)
        if any(not isinstance(e, Event) or ends_watch(e, self._superseded) for e in history):
            return
        last = history[-1].id if history else (self._last_id or "0-0")  # type: ignore[union-attr]
        ahead = self._hub.attach(self._watcher, self.job_id, last)
        if ahead is not None:
            catch_up = await self._read(f"({last}", ahead)
            self._superseded |= superseded(catch_up)
            self._pending.extend(catch_up)

    async def _read(self, start: str, end: str) -> list[Event | BaseException]:
        out: list[Event | BaseException] = []
        while True:
            try:
                async with self._hub.slots:
                    page = await self._redis.xrange(self._key, min=start, max=end, count=_PAGE)
            except ResponseError as exc:
                if is_wrongtype(exc):
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
