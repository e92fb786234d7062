"""``jobpulse.sync.StatusReader``: the reader for sync code (Django and Flask views, scripts).

The same reads, decode, cache ordering (never back in time) and verdicts as the asyncio
:class:`~jobpulse.StatusReader`: the read is the same :class:`~jobpulse._reader.fetch.ReadRequest`
(the same bytes, the same decode), and answers go through the same
:class:`~jobpulse._reader.cache.SnapshotCache` (its ``hit``/``admit``, under a lock: threads
share the cache, not the reads in flight). ``watch()`` is a plain iterator over the stream
(``XREAD BLOCK`` on the caller's thread) under the asyncio watch's follow rules (``follow.py``);
``wait()`` follows it, polling ``Backoff`` otherwise.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from redis.cluster import RedisCluster

from .._checks import check_seconds
from .._protocol.clients import SyncClient
from .._protocol.errors import tolerate_faults
from .._protocol.keys import KeySchema, check_job_id
from ..errors import ProtocolError
from .backoff import Backoff
from .cache import SnapshotCache
from .event import Event, decode_event
from .fetch import (
    Read,
    ReadClock,
    ReadRequest,
    exchange_sync,
    fast_client,
    fields_to_read,
    merge,
    served,
)
from .follow import (
    ends_watch,
    follow_from,
    resume_point,
    superseded,
    synthetic_event,
    verdict_of,
    wait_step,
)
from .reader import ReaderConfig
from .status import JobState, JobStatus

__all__ = ["SyncStatusReader"]

log = logging.getLogger("jobpulse")


class SyncStatusReader:
    """Reads job status from sync code: ``jobpulse.sync.StatusReader(client)``.

    Args:
        redis: a ``redis.Redis`` or ``redis.cluster.RedisCluster``.
        namespace: the key prefix (default ``"jobpulse"``).
        cache_ttl: seconds a snapshot is served from memory (default 0.5; 0 disables).
        terminal_ttl: seconds a terminal snapshot is served from memory (default
            ``10 * cache_ttl``).
        max_entries: jobs kept in the cache (default 10,000).
        watch_block: XREAD BLOCK timeout in seconds (default 1.0); after each one without an
            entry, ``watch()`` checks the job's liveness.
        clock: monotonic clock (a seam for tests).

    Raises:
        InvalidJobId: ``namespace`` is invalid.
        ValueError: an option is out of range (the message names it).
    """

    def __init__(
        self,
        redis: SyncClient,
        *,
        namespace: str = "jobpulse",
        cache_ttl: float = 0.5,
        terminal_ttl: float | None = None,
        max_entries: int = 10_000,
        watch_block: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._schema = KeySchema(namespace)
        self.config = ReaderConfig(
            cache_ttl=cache_ttl,
            terminal_ttl=terminal_ttl,
            max_entries=max_entries,
            watch_block=watch_block,
        )
        self._redis: Any = redis
        self._cluster = isinstance(redis, RedisCluster)
        self._fast = fast_client(redis)
        self._time = ReadClock(redis)
        self._lock = threading.Lock()
        self._cache: SnapshotCache[Read] = SnapshotCache(
            ttl=self.config.cache_ttl,
            terminal_ttl=self.config.terminal_seconds,
            max_entries=self.config.max_entries,
            merge=merge,
            clock=clock,
        )

    def __repr__(self) -> str:
        return f"<SyncStatusReader namespace={self._schema.namespace!r} cached={len(self._cache)}>"

    def get(self, job_id: str, fields: Iterable[str] | None = None) -> JobStatus:
        """The job's status, in one Redis round trip (or none, from the cache).

        Args:
            job_id: the job.
            fields: snapshot field names to read; None reads all.

        Returns:
            The :class:`~jobpulse.JobStatus`; ``state`` is UNKNOWN when there is no snapshot.

        Raises:
            InvalidJobId: ``job_id`` is invalid (before any Redis call).
            ValueError: ``fields`` names something that is not a snapshot field.
            ProtocolError: the snapshot is corrupt or foreign.
            redis.exceptions.RedisError: Redis could not be reached.
        """
        return self._get(job_id, fields, fresh=False)

    def _get(self, job_id: str, fields: Iterable[str] | None, *, fresh: bool) -> JobStatus:
        check_job_id(job_id)
        want = fields_to_read(fields)
        with self._lock:
            cached = self._cache.hit(job_id, want, fresh=fresh)
        if cached is None:
            fetched = self._fetch(job_id, want)
            with self._lock:
                cached = self._cache.admit(job_id, fetched)
        return served(*cached)

    def _fetch(self, job_id: str, want: frozenset[str]) -> Read:
        request = ReadRequest(job_id, self._schema.job(job_id), want, self._time)
        try:
            if self._fast:
                replies = exchange_sync(self._redis, request.packed(), request.count)
            else:
                pipe = self._redis.pipeline(transaction=False)
                commands, options = request.commands(self._redis, cluster=self._cluster)
                for args, kwargs in zip(commands, options, strict=True):
                    pipe.execute_command(*args, **kwargs)
                replies = pipe.execute(raise_on_error=False)
        except UnicodeDecodeError:
            raise ProtocolError(f"job {job_id!r}: a snapshot value is not UTF-8") from None
        return request.result(list(replies))

    def wait(
        self, job_id: str, *, timeout: float | None = None, backoff: Backoff | None = None
    ) -> JobStatus:
        """Block until the job reaches a terminal state or STALE, and return its status.

        A RUNNING job is followed through its stream; a job not started yet (UNKNOWN) and any
        Redis fault fall back to polling :meth:`get` on the ``backoff`` schedule.

        Raises:
            TimeoutError: the job did not settle within ``timeout`` seconds.
            InvalidJobId: ``job_id`` is invalid.
            ProtocolError: the job's keys are corrupt.
            ValueError: ``timeout`` is negative or not finite.
        """
        check_job_id(job_id)
        if timeout is not None:
            check_seconds("timeout", timeout)
        delays = backoff if backoff is not None else Backoff()
        end = None if timeout is None else time.monotonic() + timeout
        fresh = False
        while True:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"job {job_id!r} did not settle within {timeout} s")
            # a Redis fault falls back to polling; a corrupt key (ProtocolError) propagates
            with tolerate_faults(lambda exc: log.debug("wait(%s): polling: %r", job_id, exc)):
                status = self._get(job_id, None, fresh=fresh)
                step = wait_step(status.state)
                if step == "settled":
                    return status
                fresh = True
                if step == "follow":
                    for _event in self._follow(job_id, left):
                        pass
                    delays.reset()
                    continue
            pause = next(delays)
            time.sleep(pause if left is None else max(0.0, min(pause, left)))

    def watch(self, job_id: str, *, last_event_id: str | None = None) -> Iterator[Event]:
        """The job's events: from the stream's start (or right after ``last_event_id``), then
        live ones, ending after the terminal event of the job's last attempt, or with a
        synthetic ``stale`` event when the worker's liveness key is gone, or a synthetic ``end``
        when the job ended but its ``end`` entry is gone; the asyncio reader's rules
        (``follow.py``). A job not started yet is waited for.

        Raises:
            InvalidJobId: ``job_id`` is invalid.
            ValueError: ``last_event_id`` is not a stream entry id.
            ProtocolError: a stream entry is not jobpulse's.
        """
        check_job_id(job_id)
        _, after = resume_point(last_event_id)
        return self._events(job_id, after, None)

    def _follow(self, job_id: str, limit: float | None) -> Iterator[Event]:
        # Start just before the newest entry: an attempt that already ended ends at once.
        tail = self._redis.xrevrange(self._schema.job(job_id).events, count=2)
        return self._events(job_id, follow_from(tail), limit)

    def _events(self, job_id: str, after: str | None, limit: float | None) -> Iterator[Event]:
        # The follow rules (superseded runs, the liveness verdict, the synthetic end) are
        # follow.py's, the asyncio watch's own; this driver only reads, blocks and yields.
        keys = self._schema.job(job_id)
        end = None if limit is None else time.monotonic() + limit
        cursor = after or "0-0"
        history = self._range(keys.events, "-" if after is None else f"({after}")
        old = superseded(history)
        for event in history:
            cursor = event.id
            yield event
            if ends_watch(event, old):
                return
        block_ms = max(1, int(self.config.watch_block * 1000))
        while True:
            if end is not None and time.monotonic() >= end:
                return
            reply = self._redis.xread({keys.events: cursor}, block=block_ms, count=100)
            for _stream, entries in reply or ():
                for eid, raw in entries:
                    event = decode_event(eid, raw)
                    cursor = event.id
                    yield event
                    if ends_watch(event, ()):
                        return
            if reply:
                continue
            verdict, server_ms = self._liveness(job_id)
            if verdict is None:
                continue
            # Entries written before the verdict's read first (none is lost), then the
            # verdict, resumable after them (see follow.synthetic_event).
            for event in self._range(keys.events, f"({cursor}"):
                cursor = event.id
                yield event
                if ends_watch(event, ()):
                    return
            yield synthetic_event(verdict, cursor=cursor, server_ms=server_ms, wall=time.time())
            return

    def _range(self, key: str, start: str) -> list[Event]:
        return [decode_event(eid, raw) for eid, raw in self._redis.xrange(key, start, "+")]

    def _liveness(self, job_id: str) -> tuple[JobState | None, int | None]:
        """The liveness check (``follow.verdict_of``) on a fresh read of the snapshot, and the
        server's time of that read (None where the server refuses ``TIME``: the host's clock
        gives no resumable id). A snapshot jobpulse cannot read says nothing, as in the hub."""
        try:
            status = self._get(job_id, None, fresh=True)
        except ProtocolError:
            return None, None
        server_ms = status.server_ms if self._time.command() is not None else None
        return verdict_of(status.state), server_ms
