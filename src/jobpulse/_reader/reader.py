"""``StatusReader``: one-round-trip status, a single-flight cache, watch and wait."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from .._checks import check_number, check_seconds
from .._protocol.cluster import pipelined
from .._protocol.codec import parse_stream_id, to_text
from .._protocol.deadline import cancellable
from .._protocol.errors import is_no_such_key, tolerate_faults
from .._protocol.keys import KeySchema, check_job_id
from ..errors import InvalidJobId, ProtocolError
from .backoff import Backoff
from .cache import CacheStatistics, SnapshotCache
from .fetch import (
    Read,
    ReadClock,
    ReadRequest,
    exchange,
    fast_client,
    fields_to_read,
    merge,
    served,
)
from .follow import follow_from, wait_step
from .hubtypes import HubStatistics
from .routing import WatchHub
from .status import JobStatus, live_statuses
from .watch import Watch

__all__ = ["ReaderConfig", "ReaderStatistics", "StatusReader", "client_of"]

log = logging.getLogger("jobpulse")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReaderConfig:
    """How a :class:`StatusReader` caches and watches. Every field is checked.

    Attributes:
        cache_ttl: seconds a snapshot answers ``get()`` from memory (0 disables the cache).
        terminal_ttl: the same for a terminal snapshot (COMPLETED, FAILED, CANCELLED, LOST);
            default ``10 * cache_ttl``. A terminal attempt only changes again if a new attempt
            of the same job id starts.
        max_entries: jobs kept in the cache (least recently used evicted), >= 1.
        watch_queue: events buffered per watcher before it is dropped to resync by id, >= 1.
        watch_block: XREAD BLOCK timeout in seconds (> 0).
        watch_poll: on a Redis Cluster, seconds between polls of a node whose watched streams
            span several hash slots (> 0); see :meth:`StatusReader.watch`.
        liveness_interval: seconds between the watch hub's liveness checks (> 0).
        concurrency: Redis calls this reader has in flight at once on the client's pool
            (reads, history XRANGEs), >= 1; more wait their turn. The watch loop's own
            connection is not counted. Keep it under the pool's ``max_connections``.
    """

    cache_ttl: float = 0.5
    terminal_ttl: float | None = None
    max_entries: int = 10_000
    watch_queue: int = 1000
    watch_block: float = 1.0
    liveness_interval: float = 1.0
    concurrency: int = 32
    watch_poll: float = 0.1

    def __post_init__(self) -> None:
        check_seconds("cache_ttl", self.cache_ttl)
        if self.terminal_ttl is not None:
            check_seconds("terminal_ttl", self.terminal_ttl)
        check_seconds("watch_block", self.watch_block, positive=True)
        check_seconds("watch_poll", self.watch_poll, positive=True)
        check_seconds("liveness_interval", self.liveness_interval, positive=True)
        for name in ("max_entries", "watch_queue", "concurrency"):
            check_number(name, getattr(self, name), integer=True, minimum=1, strict=False)

    @property
    def terminal_seconds(self) -> float:
        return self.cache_ttl * 10 if self.terminal_ttl is None else self.terminal_ttl


@dataclass(frozen=True, slots=True)
class ReaderStatistics:
    """Counters of one reader: its cache and its watch hub."""

    cache: CacheStatistics
    watch: HubStatistics


class StatusReader:
    """Reads job status: cheap enough for an API gateway's hot path, never wrong about a dead
    worker, never back in time.

    Use it as an async context manager (``async with StatusReader(redis) as reader:``), or call
    :meth:`aclose` when done: that stops the shared watch loop.

    Args:
        redis: a ``redis.asyncio.Redis`` or ``RedisCluster`` (with or without
            ``decode_responses``). ``watch`` takes one dedicated connection from its pool for the
            whole reader (on a cluster: one per master that holds a watched job).
        namespace: the key prefix (default ``"jobpulse"``).
        cache_ttl: seconds a snapshot is served from memory (default 0.5; 0 disables).
        terminal_ttl: seconds a terminal snapshot is served from memory (default
            ``10 * cache_ttl``).
        max_entries: jobs kept in the cache (default 10,000).
        watch_queue: events buffered per watcher (default 1000); see :meth:`watch`.
        watch_block: XREAD BLOCK timeout in seconds (default 1.0).
        liveness_interval: seconds between the watch loop's liveness checks (default 1.0).
        concurrency: Redis calls in flight at once on the client's pool (default 32).
        watch_poll: on a cluster, seconds between polls of a node whose watched jobs span
            several hash slots (default 0.1).
        clock: monotonic clock (a seam for tests).

    Raises:
        InvalidJobId: ``namespace`` is invalid.
        ValueError: an option is out of range (the message names it).
    """

    def __init__(
        self,
        redis: Any,
        *,
        namespace: str = "jobpulse",
        cache_ttl: float = 0.5,
        terminal_ttl: float | None = None,
        max_entries: int = 10_000,
        watch_queue: int = 1000,
        watch_block: float = 1.0,
        liveness_interval: float = 1.0,
        concurrency: int = 32,
        watch_poll: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._schema = KeySchema(namespace)
        self.config = ReaderConfig(
            cache_ttl=cache_ttl,
            terminal_ttl=terminal_ttl,
            max_entries=max_entries,
            watch_queue=watch_queue,
            watch_block=watch_block,
            liveness_interval=liveness_interval,
            concurrency=concurrency,
            watch_poll=watch_poll,
        )
        self._redis = redis
        self._cluster = isinstance(redis, RedisCluster)
        self._fast = fast_client(redis)
        self._time = ReadClock(redis)
        self._slots = asyncio.Semaphore(self.config.concurrency)
        self._clock = clock
        self._cache: SnapshotCache[Read] = SnapshotCache(
            ttl=self.config.cache_ttl,
            terminal_ttl=self.config.terminal_seconds,
            max_entries=self.config.max_entries,
            merge=merge,
            clock=clock,
        )
        self._hub = WatchHub(
            redis,
            self._schema,
            block=self.config.watch_block,
            liveness_interval=self.config.liveness_interval,
            poll=self.config.watch_poll,
            queue_size=self.config.watch_queue,
            slots=self._slots,
            clock=clock,
        )

    @property
    def namespace(self) -> str:
        return self._schema.namespace

    def statistics(self) -> ReaderStatistics:
        """Cache and watch counters (hits, fetches, XREADs, overflows, …)."""
        return ReaderStatistics(self._cache.statistics(), self._hub.statistics())

    def __repr__(self) -> str:
        c = self._cache.statistics()
        return (
            f"<StatusReader namespace={self.namespace} cache_ttl={self.config.cache_ttl} "
            f"entries={c.entries} hits={c.hits} fetches={c.fetches} {self._hub!r}>"
        )

    # -- get ----------------------------------------------------------------------------------

    async def get(self, job_id: str, fields: Iterable[str] | None = None) -> JobStatus:
        """The job's status, in one Redis round trip (or none, from the cache).

        One write of three commands (see ``_reader/fetch.py``): ``HMGET`` of the asked fields
        plus what the verdict and the ages need (``status seq fence heartbeat_ms
        progress_ms``), ``PTTL`` of the liveness key, and ``TIME`` (so ages are measured on the
        server's clock alone; on a server that refuses ``TIME``, the host's wall clock).

        Args:
            job_id: the job.
            fields: snapshot field names to read (see ``docs/protocol.md``); None reads all.
                The other fields are not transferred; they are None in the result unless the
                cache already held them from a wider read of the same snapshot.

        Returns:
            The :class:`JobStatus`; ``state`` is UNKNOWN when there is no snapshot.

        Raises:
            InvalidJobId: ``job_id`` is invalid (before any Redis call).
            ValueError: ``fields`` names something that is not a snapshot field.
            ProtocolError: the snapshot is corrupt or foreign (a status outside the protocol,
                a non-numeric number, a ``meta`` that is not JSON, a key of another type).
            redis.exceptions.RedisError: Redis could not be reached (nothing is cached then).
        """
        return await self._get(job_id, fields, fresh=False)

    async def _get(self, job_id: str, fields: Iterable[str] | None, *, fresh: bool) -> JobStatus:
        check_job_id(job_id)
        want = fields_to_read(fields)
        read, age = await self._cache.get(
            job_id, want, lambda f: self._fetch(job_id, f), fresh=fresh
        )
        return served(read, age)

    async def _fetch(self, job_id: str, want: frozenset[str]) -> Read:
        request = ReadRequest(job_id, self._schema.job(job_id), want, self._time)
        try:
            async with self._slots:
                if self._fast:
                    replies = await exchange(self._redis, request.packed(), request.count)
                else:  # a cluster (ASK followed on one connection) or one connection
                    if self._cluster:  # the slot map, before asking it for the job's node
                        await self._redis.initialize()  # (once: then a flag's check)
                    commands, options = request.commands(self._redis, cluster=self._cluster)
                    replies = await pipelined(self._redis, commands, options)
        except UnicodeDecodeError:  # a client with decode_responses, a foreign value
            raise ProtocolError(f"job {job_id!r}: a snapshot value is not UTF-8") from None
        return request.result(replies)

    # -- the running-jobs index and the stream's extent ----------------------------------------

    async def running_ids(
        self, *, index_shards: int = 1, limit: int = 500
    ) -> tuple[list[str], bool]:
        """The job ids in the running-jobs index, sorted, at most ``limit`` of them, and whether
        there were more. One round trip (``ZRANGE`` of every shard, pipelined; never SCAN).

        The index names RUNNING and STALE jobs, and for a moment jobs that just ended (their
        entry is dropped by the final write or by the next sweep). Members that are not valid job
        ids are skipped.

        Args:
            index_shards: the ``index_shards`` the workers use.
            limit: the most ids returned (>= 1).

        Raises:
            TypeError: ``limit`` is not an int.
            ValueError: ``limit`` is below 1.
        """
        check_number("limit", limit, integer=True, minimum=1, strict=False)
        schema = KeySchema(self.namespace, index_shards)
        async with self._slots, self._redis.pipeline(transaction=False) as pipe:
            for key in schema.indexes():
                pipe.zrange(key, 0, limit)
            shards = await pipe.execute()
        members = {to_text(m) or "" for shard in shards for m in shard}
        ids = sorted(m for m in members if _is_job_id(m))
        return ids[:limit], len(ids) > limit or any(len(shard) > limit for shard in shards)

    async def running(self, *, index_shards: int = 1, limit: int = 500) -> list[JobStatus]:
        """The RUNNING and STALE jobs of the running-jobs index, as a dashboard lists them.

        Jobs that just ended, and jobs whose snapshot is corrupt (``ProtocolError``), are left
        out. Reads go through the cache, like :meth:`get`.
        """
        ids, _ = await self.running_ids(index_shards=index_shards, limit=limit)
        results = await asyncio.gather(*(self.get(job) for job in ids), return_exceptions=True)
        return live_statuses(results)

    async def trimmed_after(self, job_id: str, last_event_id: str) -> bool:
        """True when entries after ``last_event_id`` may have been trimmed from the capped
        stream (``MAXLEN ~``): the stream lost entries and its first entry is newer. A watcher
        resuming from that id has a gap; show it the snapshot first."""
        key = self._schema.events(job_id)
        try:
            async with self._slots:
                info = await self._redis.xinfo_stream(key)
        except ResponseError as exc:
            if is_no_such_key(exc):
                return False
            raise
        first = info.get("first-entry") or info.get(b"first-entry")
        added = info.get("entries-added") or info.get(b"entries-added")
        length = info.get("length") or info.get(b"length") or 0
        if not first or added is None or int(added) <= int(length):
            return False
        return parse_stream_id(to_text(first[0]) or "0") > parse_stream_id(last_event_id)

    # -- watch and wait -----------------------------------------------------------------------

    def watch(self, job_id: str, *, last_event_id: str | None = None) -> Watch:
        """Follow the job's events: its history first, then live entries; ends after the
        terminal event (``end``, or ``stale`` when a sweeper claimed the job).

        Every watcher of this reader shares one XREAD BLOCK loop on one dedicated connection,
        whatever the number of jobs. On a Redis Cluster there is one such loop per master that
        holds a watched job; it blocks while its jobs share one hash slot and otherwise polls
        them every ``watch_poll`` seconds (Redis refuses XREAD across slots); MOVED, ASK and a
        failover move the job to its new owner's loop without losing an event. When the worker
        dies and nobody claims the job, the loop's liveness check ends the watch with a
        synthetic ``stale`` event (``synthetic=True``, ``status="STALE"``, ``id`` the last
        entry's id) within about ``liveness_interval`` plus
        the worker's ttl. A watcher that falls ``watch_queue`` events behind is dropped from
        the loop and catches up from the stream by id: it never loses or repeats an event,
        unless the stream's ``MAXLEN`` trimmed entries it had not read.

        Watching a job that has not started yet waits for it to start. Use ``async with
        reader.watch(job) as events:`` (or ``await events.aclose()``) when leaving early.

        Args:
            job_id: the job.
            last_event_id: resume right after this stream entry id (e.g. SSE ``Last-Event-ID``);
                None starts from the first entry.

        Returns:
            An async iterator of :class:`Event`.

        Raises:
            InvalidJobId: ``job_id`` is invalid.
            ValueError: ``last_event_id`` is not a stream entry id.
        """
        keys = self._schema.job(job_id)
        return Watch(self._hub, self._redis, job_id, keys.events, last_event_id)

    async def wait(
        self,
        job_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the contract's signature
        backoff: Backoff | None = None,
    ) -> JobStatus:
        """Wait until the job reaches a terminal state or STALE, and return its status.

        A RUNNING job is followed through its stream (no polling); a job with no snapshot yet
        (UNKNOWN: not started) and any Redis fault while following fall back to polling
        ``get()`` on the ``backoff`` schedule (default ``Backoff()``).

        Args:
            job_id: the job.
            timeout: seconds to wait at most (None: no limit).
            backoff: the polling schedule.

        Raises:
            TimeoutError: the job did not settle within ``timeout``.
            InvalidJobId: ``job_id`` is invalid.
            ProtocolError: the job's keys are corrupt.
        """
        check_job_id(job_id)
        if timeout is not None:
            check_seconds("timeout", timeout)
        delays = backoff if backoff is not None else Backoff()
        try:
            async with asyncio.timeout(timeout):
                return await cancellable(self._wait(job_id, delays))  # holds on 3.11
        except TimeoutError:
            raise TimeoutError(f"job {job_id!r} did not settle within {timeout} s") from None

    async def _wait(self, job_id: str, delays: Backoff) -> JobStatus:
        fresh = False
        while True:
            # a Redis fault falls back to polling; a corrupt key (ProtocolError) propagates
            with tolerate_faults(lambda exc: log.debug("wait(%s): polling: %r", job_id, exc)):
                status = await self._get(job_id, None, fresh=fresh)
                step = wait_step(status.state)
                if step == "settled":
                    return status
                fresh = True
                if step == "follow":
                    await self._follow(job_id)
                    delays.reset()
                    continue  # the stream ended: read the final snapshot, past the cache
            await asyncio.sleep(next(delays))

    async def _follow(self, job_id: str) -> None:
        """Return once the job's stream ends (a terminal or a synthetic event)."""
        keys = self._schema.job(job_id)
        # Start just before the newest entry, so an attempt that has already ended ends the
        # watch at once, without replaying the whole history.
        async with self._slots:
            tail = await self._redis.xrevrange(keys.events, count=2)
        async with self.watch(job_id, last_event_id=follow_from(tail)) as events:
            async for _event in events:
                pass  # the watch ends after the terminal entry of the job's last attempt

    # -- lifecycle ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Stop the watch loop and release its connection; open watches raise RuntimeError.

        The Redis client itself is the caller's and stays open.
        """
        await self._hub.aclose()

    async def __aenter__(self) -> StatusReader:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def client_of(reader: StatusReader) -> Any:
    """The Redis client ``reader`` reads through, for the adapters that write through it too
    (the HTTP app's cancel route, its ``/metrics`` census); not public."""
    return reader._redis


async def fresh_status(reader: StatusReader, job_id: str) -> JobStatus:
    """The job's verdict read from Redis now, never from the cache, for the adapters that act
    on it (the HTTP app's cancel route); not public."""
    return await reader._get(job_id, (), fresh=True)


def _is_job_id(text: str) -> bool:
    try:
        check_job_id(text)
    except InvalidJobId:
        return False
    return True
