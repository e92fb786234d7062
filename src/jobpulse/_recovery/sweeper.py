"""The sweeper: find stale jobs through the running-jobs index and claim each exactly once.

A sweep reads the server clock, takes from each index shard the entries whose deadline has
passed (``ZRANGEBYSCORE shard -inf now LIMIT 0 batch``: O(log n + batch), never SCAN or KEYS)
and runs ``claim.lua`` on every candidate, all claims of a batch pipelined in one round trip.
The index only names *candidates*; the claim script decides, atomically, on the job's own keys:

* claimed (RUNNING, no liveness, no lease): the job is now LOST with a bumped fence and is
  returned as a :class:`StaleJob`; its index entry is removed;
* not running (ended, unknown, or its snapshot expired): its index entry is removed;
* alive (the worker still renews it; its index refresh was late): the entry is re-scored to
  when it could become stale at the earliest, so it is not re-checked on every sweep.

Index entries are removed with ``unindex.lua``, which spares an entry re-scored since it was
read (a new attempt of the job started meanwhile). Exactly once holds for any number of
sweepers in any number of processes because ``claim.lua`` checks RUNNING and writes LOST in one
atomic script: a second claim of the same attempt sees LOST and answers "not running".
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import os
import random
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._protocol.codec import load_json
from .._protocol.deadline import cancellable
from .._protocol.errors import is_noscript, is_redis_fault
from .._protocol.keys import KeySchema
from .._protocol.scripts import SCRIPTS
from .._worker.ratelimit import RateLimitedLog
from ..errors import InvalidJobId

__all__ = ["OnStale", "StaleJob", "Sweeper", "SweeperConfig", "SweeperStatistics"]

log = logging.getLogger("jobpulse")

ERROR_BACKOFF_MS = 60_000
"""An entry whose state key is not a Hash (WRONGTYPE: a foreign key) is pushed this far into
the future, so it cannot keep the front of the index busy."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StaleJob:
    """A stale job that this sweeper claimed: it is now LOST and nobody else got it.

    Start it again with ``heartbeat(redis, job.job_id, ...)``: the new attempt gets
    ``attempt + 1``, a higher fence and ``resume_from`` = :attr:`checkpoint`.

    Attributes:
        job_id: the job.
        attempt: the attempt that went stale (1 for a first run).
        fence: the fence the claim set; the stale attempt's writes are refused from now on.
        stale_for: seconds between the stale attempt's last heartbeat and the claim (server clock).
        claimed_at_ms: when the claim happened, in ms of the Redis server's clock.
        checkpoint: the details of the stale attempt's last checkpoint (decoded JSON), or None.
        snapshot: the job's snapshot fields as they were just before the claim (``status`` is
            ``"RUNNING"``), decoded to ``str``.
    """

    job_id: str
    attempt: int
    fence: int
    stale_for: float
    claimed_at_ms: int
    checkpoint: Any = field(default=None, hash=False)
    snapshot: Mapping[str, str] = field(default_factory=dict, hash=False, repr=False)

    @property
    def worker(self) -> str:
        """The stale attempt's worker name (``host:pid`` by default)."""
        return self.snapshot.get("worker", "")

    @property
    def stage(self) -> str:
        """The stale attempt's last stage ('' when it never named one)."""
        return self.snapshot.get("stage", "")


OnStale = Callable[[StaleJob], Awaitable[object] | object]
"""A callback for :meth:`Sweeper.run`: plain function or coroutine function of one StaleJob."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SweeperConfig:
    """How a sweeper claims. Every field is checked on construction.

    Attributes:
        batch: candidates read (and claims pipelined) per index shard per round (>= 1).
        retention: seconds a claimed job's snapshot, stream and fence are kept (> 0).
        maxlen: the events stream cap for the ``stale`` entry (>= 1).
    """

    batch: int = 100
    retention: float = 3600.0
    maxlen: int = 1000

    def __post_init__(self) -> None:
        for name in ("batch", "maxlen"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value!r}")
        _check_positive("retention", self.retention)


@dataclass(frozen=True, slots=True)
class SweeperStatistics:
    """Counters of one sweeper since it was created.

    Attributes:
        sweeps: completed sweeps.
        claimed: jobs claimed (returned as StaleJob).
        alive: candidates found alive and re-scored.
        dropped: candidates not running (ended or expired) whose entries were removed.
        errors: sweeps that failed on a Redis fault.
        round_trips: pipelines and single commands sent to Redis.
        commands: Redis commands sent (a pipeline counts each of its commands).
    """

    sweeps: int
    claimed: int
    alive: int
    dropped: int
    errors: int
    round_trips: int
    commands: int


@dataclass(slots=True)
class _Round:
    """What one round of claims decided, per index shard."""

    claimed: list[StaleJob] = field(default_factory=list)
    unindex: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    rescore: dict[str, dict[str, int]] = field(default_factory=dict)
    unresolved: set[str] = field(default_factory=set)


class Sweeper:
    """Finds stale jobs through the running-jobs index and claims each one exactly once.

    Args:
        redis: a ``redis.asyncio.Redis`` or ``RedisCluster``.
        namespace: the key prefix (default ``"jobpulse"``).
        index_shards: the number of index shards the workers use (default 1).
        batch: candidates read and claimed per shard per round trip (default 100).
        retention: seconds a claimed job's snapshot and stream are kept (default 3600).
        maxlen: the events stream cap (default 1000).
        name: recorded in the LOST snapshot's ``error`` (default ``host:pid``).
        clock: a monotonic clock in seconds (for the loop's pacing and log rate limits).

    Raises:
        InvalidJobId: the namespace is invalid.
        ValueError, TypeError: an argument is out of range (the message names it).
    """

    def __init__(
        self,
        redis: Any,
        *,
        namespace: str = "jobpulse",
        index_shards: int = 1,
        batch: int = 100,
        retention: float = 3600.0,
        maxlen: int = 1000,
        name: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._schema = KeySchema(namespace, index_shards)
        self._cfg = SweeperConfig(batch=batch, retention=retention, maxlen=maxlen)
        self.name = name if name is not None else f"{socket.gethostname()}:{os.getpid()}"
        if not isinstance(self.name, str) or not 1 <= len(self.name) <= 200:
            raise ValueError(f"name must be a str of 1 to 200 characters, got {name!r}")
        self._redis = redis
        self._clock = clock
        self._warn = RateLimitedLog(log, clock)
        self._sweeps = self._claimed = self._alive = self._dropped = self._errors = 0
        self._round_trips = self._commands = 0

    def statistics(self) -> SweeperStatistics:
        """The sweeper's counters."""
        return SweeperStatistics(
            self._sweeps,
            self._claimed,
            self._alive,
            self._dropped,
            self._errors,
            self._round_trips,
            self._commands,
        )

    def __repr__(self) -> str:
        return (
            f"<Sweeper namespace={self._schema.namespace} shards={self._schema.index_shards} "
            f"sweeps={self._sweeps} claimed={self._claimed}>"
        )

    # -- one sweep -----------------------------------------------------------------------------

    async def sweep(self) -> list[StaleJob]:
        """Claim every job of the namespace that is stale now; return the ones this call won.

        Reads the server clock, then per index shard the entries whose deadline has passed, in
        batches, claiming each candidate with one atomic script. Costs O(log n + candidates),
        a handful of round trips when nothing is stale.

        Returns:
            The jobs this call claimed. Among all concurrent sweepers, each stale attempt of a
            job is returned by exactly one call.

        Raises:
            redis.exceptions.RedisError, OSError, TimeoutError: Redis failed before anything
                was claimed. A fault after some claims is logged and the claimed jobs are
                returned (their index entries are cleaned up by a later sweep).
        """
        claimed: list[StaleJob] = []
        try:
            now_ms = await self._server_ms()
            pending = self._schema.indexes()
            while pending:
                candidates = await self._read(pending, now_ms)
                decided = await self._claim(candidates, now_ms)
                claimed += decided.claimed
                await self._cleanup(decided)
                # Go on with a shard only when its batch was full and every entry of it left
                # the range read (removed or re-scored); else a next read would see the same.
                pending = [
                    shard
                    for shard, entries in candidates.items()
                    if len(entries) >= self._cfg.batch and shard not in decided.unresolved
                ]
        except Exception as exc:
            if not is_redis_fault(exc):
                raise
            self._errors += 1
            if not claimed:
                raise
            self._warn.warning(
                "jobpulse sweeper: Redis failed after claiming %d job(s); returning them: %r",
                len(claimed),
                exc,
            )
        self._sweeps += 1
        self._claimed += len(claimed)
        return claimed

    async def _server_ms(self) -> int:
        self._round_trips += 1
        self._commands += 1
        seconds, micros = await cancellable(self._redis.time())
        return int(seconds) * 1000 + int(micros) // 1000

    async def _read(self, shards: list[str], now_ms: int) -> dict[str, list[tuple[str, float]]]:
        ops = [_zrangebyscore(shard, now_ms, self._cfg.batch) for shard in shards]
        replies = await self._execute(ops)
        out: dict[str, list[tuple[str, float]]] = {}
        for shard, reply in zip(shards, replies, strict=True):
            if isinstance(reply, Exception):
                raise reply
            out[shard] = [(_text(entry[0]), float(entry[1])) for entry in reply]
        return out

    async def _claim(self, candidates: dict[str, list[tuple[str, float]]], now_ms: int) -> _Round:
        decided = _Round()
        calls: list[tuple[str, str, float]] = []
        ops: list[Callable[[Any], object]] = []
        error = f"stale: no heartbeat within the lease; claimed by sweeper {self.name}"
        args = [self._cfg.maxlen, math.ceil(self._cfg.retention * 1000), error]
        for shard, entries in candidates.items():
            for member, score in entries:
                try:
                    keys = self._schema.job(member).all()
                except InvalidJobId:
                    # Not a job id: never a jobpulse entry. Remove it rather than re-read it.
                    self._warn.warning("jobpulse sweeper: dropping index entry %r", member)
                    decided.unindex.setdefault(shard, []).append((member, score))
                    continue
                calls.append((shard, member, score))
                ops.append(_evalsha(SCRIPTS.claim.sha, keys, args))
        replies = await self._execute(ops)
        for (shard, member, score), reply in zip(calls, replies, strict=True):
            if isinstance(reply, Exception):
                # An error reply for this command only (other claims of the pipeline stand).
                self._warn.warning("jobpulse sweeper: claim of %r failed: %r", member, reply)
                if "WRONGTYPE" in str(reply):  # a foreign key: it will not heal by itself
                    decided.rescore.setdefault(shard, {})[member] = now_ms + ERROR_BACKOFF_MS
                else:  # OOM, READONLY, ...: try again on the next sweep
                    decided.unresolved.add(shard)
                continue
            code = int(reply[0])
            if code == 1:
                decided.claimed.append(_stale_job(member, reply))
                decided.unindex.setdefault(shard, []).append((member, score))
            elif code == 0:
                self._dropped += 1
                decided.unindex.setdefault(shard, []).append((member, score))
            else:
                self._alive += 1
                left = int(reply[1]) if len(reply) > 1 else 0
                decided.rescore.setdefault(shard, {})[member] = now_ms + max(left, 1)
        return decided

    async def _cleanup(self, decided: _Round) -> None:
        ops: list[Callable[[Any], object]] = []
        shards: list[str] = []
        for shard, entries in decided.unindex.items():
            pairs = [x for member, score in entries for x in (member, repr(score))]
            ops.append(_evalsha(SCRIPTS.unindex.sha, (shard,), pairs))
            shards.append(shard)
        for shard, members in decided.rescore.items():
            # XX: never re-add an entry the worker removed at its end; GT: never move back a
            # deadline a worker (re)started meanwhile has pushed further.
            ops.append(_zadd_later(shard, members))
            shards.append(shard)
        replies = await self._execute(ops)
        for shard, reply in zip(shards, replies, strict=True):
            if isinstance(reply, Exception):  # the entries stay; a later sweep drops them
                self._warn.warning("jobpulse sweeper: index cleanup of %s failed: %r", shard, reply)
                decided.unresolved.add(shard)

    async def _execute(self, ops: list[Callable[[Any], object]]) -> list[Any]:
        """Send ``ops`` (each queues one command) as one pipeline; after a NOSCRIPT, load the
        scripts and send the refused commands again. Per-command errors are returned."""
        replies = await self._pipeline(ops)
        redo = [i for i, reply in enumerate(replies) if is_noscript(reply)]
        if redo:
            for script in (SCRIPTS.claim, SCRIPTS.unindex):
                self._round_trips += 1
                self._commands += 1
                await cancellable(self._redis.script_load(script.text))
            again = await self._pipeline([ops[i] for i in redo])
            for i, reply in zip(redo, again, strict=True):
                replies[i] = reply
        return replies

    async def _pipeline(self, ops: list[Callable[[Any], object]]) -> list[Any]:
        if not ops:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for op in ops:
            op(pipe)
        self._round_trips += 1
        self._commands += len(ops)
        return list(await cancellable(pipe.execute(raise_on_error=False)))

    # -- the loop ------------------------------------------------------------------------------

    def run(
        self,
        *,
        period: float = 1.0,
        on_stale: OnStale | None = None,
        jitter: float = 0.1,
        timeout: float = 30.0,
    ) -> contextlib.AbstractAsyncContextManager[Sweeper]:
        """Sweep every ``period`` seconds while the ``async with`` block runs.

        ``async with sweeper.run(period=1.0, on_stale=restart): ...`` starts a background task
        that sweeps at once and then every period (with jitter, so many sweepers do not move in
        lockstep), and hands each claimed job to ``on_stale``. An exception in the callback is
        logged and the loop goes on; a Redis fault is logged (rate-limited) and the next sweep
        tries again. Leaving the block lets the current sweep finish and deliver its jobs.

        Args:
            period: seconds between sweeps (> 0).
            on_stale: called with each :class:`StaleJob`, plain or coroutine function; the
                loop awaits it, so a long job should be handed to another task. None only
                marks stale jobs LOST (readers see them).
            jitter: each pause is ``period`` times a random factor in ``1 ± jitter``
                (0 <= jitter < 1).
            timeout: seconds one sweep may take before it is abandoned (> 0).

        Returns:
            An async context manager yielding this sweeper.

        Raises:
            ValueError, TypeError: an argument is out of range (the message names it).
        """
        _check_positive("period", period)
        _check_positive("timeout", timeout)
        if isinstance(jitter, bool) or not isinstance(jitter, int | float):
            raise TypeError(f"jitter must be a number, got {jitter!r}")
        if not 0 <= jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {jitter!r}")
        if on_stale is not None and not callable(on_stale):
            raise TypeError(f"on_stale must be callable or None, got {on_stale!r}")
        return self._running(float(period), on_stale, float(jitter), float(timeout))

    @contextlib.asynccontextmanager
    async def _running(
        self, period: float, on_stale: OnStale | None, jitter: float, limit: float
    ) -> AsyncIterator[Sweeper]:
        # A task of our own rather than a TaskGroup around the caller's block: a TaskGroup would
        # turn the block's own exceptions into ExceptionGroups. The task never outlives the block.
        stop = asyncio.Event()
        task = asyncio.create_task(
            self._loop(period, on_stale, jitter, limit, stop), name="jobpulse-sweeper"
        )
        clean = False
        try:
            yield self
            clean = True
        finally:
            stop.set()
            if not clean:
                task.cancel()
            try:
                await asyncio.wait([task])
            except asyncio.CancelledError:
                task.cancel()
                raise
            failure = None if task.cancelled() else task.exception()
            if clean and failure is not None:
                raise failure

    async def _loop(
        self,
        period: float,
        on_stale: OnStale | None,
        jitter: float,
        limit: float,
        stop: asyncio.Event,
    ) -> None:
        while not stop.is_set():
            started = self._clock()
            jobs: list[StaleJob] = []
            try:
                async with asyncio.timeout(limit):
                    jobs = await self.sweep()
            except Exception as exc:
                if not is_redis_fault(exc):
                    raise
                self._warn.warning("jobpulse sweeper: sweep failed, retrying: %r", exc)
            for job in jobs:
                await self._deliver(on_stale, job)
            pause = period * (1 + jitter * random.uniform(-1, 1)) - (self._clock() - started)
            if pause > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):
                        await stop.wait()

    async def _deliver(self, on_stale: OnStale | None, job: StaleJob) -> None:
        if on_stale is None:
            return
        try:
            result = on_stale(job)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("jobpulse sweeper: on_stale failed for job %s", job.job_id)


# -- helpers (pure) ------------------------------------------------------------------------------


def _check_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None


def _stale_job(job_id: str, reply: list[Any]) -> StaleJob:
    """Build the StaleJob from a successful claim reply ``{1, fence, now_ms, field, value...}``."""
    fence, now_ms = int(reply[1]), int(reply[2])
    flat = [_text(x) for x in reply[3:]]
    snapshot = dict(zip(flat[::2], flat[1::2], strict=True))
    last = _int(snapshot.get("heartbeat_ms")) or _int(snapshot.get("started_ms"))
    try:
        checkpoint = load_json(snapshot.get("checkpoint"))
    except ValueError:  # orjson.JSONDecodeError is a ValueError: a corrupt field is no checkpoint
        checkpoint = None
    return StaleJob(
        job_id=job_id,
        attempt=_int(snapshot.get("attempt")) or 0,
        fence=fence,
        stale_for=0.0 if last is None else max(0.0, (now_ms - last) / 1000),
        claimed_at_ms=now_ms,
        checkpoint=checkpoint,
        snapshot=snapshot,
    )


def _zrangebyscore(shard: str, now_ms: int, batch: int) -> Callable[[Any], object]:
    return lambda pipe: pipe.zrangebyscore(
        shard, "-inf", now_ms, start=0, num=batch, withscores=True
    )


def _evalsha(sha: str, keys: tuple[str, ...], args: list[Any]) -> Callable[[Any], object]:
    # execute_command: redis-py blocks pipe.evalsha() on RedisCluster pipelines; EVALSHA is
    # routed by its keys (one slot: a job's keys, or one index shard) all the same.
    return lambda pipe: pipe.execute_command("EVALSHA", sha, len(keys), *keys, *args)


def _zadd_later(shard: str, members: dict[str, int]) -> Callable[[Any], object]:
    return lambda pipe: pipe.zadd(shard, members, xx=True, gt=True)
