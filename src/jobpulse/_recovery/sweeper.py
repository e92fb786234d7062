"""The sweeper: find stale jobs through the running-jobs index and claim each exactly once.

A sweep reads the server clock, takes from each index shard the entries whose deadline has
passed (``ZRANGE shard -inf now BYSCORE LIMIT 0 batch``: O(log n + batch), never SCAN or KEYS)
and runs ``claim.lua`` on every candidate, all claims of a batch pipelined in one round trip.
The index only names *candidates*; the claim script decides, atomically, on the job's own keys:

* claimed (RUNNING, no liveness, no lease): the job is now LOST with a bumped fence and an
  unacknowledged-claim marker, and is returned as a :class:`StaleJob`; its index entry STAYS,
  re-scored to ``redeliver_after`` seconds from now;
* claimed before and not acknowledged (:meth:`Sweeper.ack`) for ``redeliver_after``:
  ``claim.lua`` answers the same claim again (same fence) and it is returned again (earlier,
  it answers "come back then", and the entry is re-scored): a claim is made exactly
  once and delivered at least once, by any sweeper process, until acknowledged. A sweep that
  was cancelled or timed out, a crash, or a lost reply loses no claim;
* not running (ended, unknown, or its snapshot expired): its index entry is removed;
* alive (the worker still renews it; its index refresh was late): the entry is re-scored to
  when it could become stale at the earliest, so it is not re-checked on every sweep.

Index entries are removed with ``unindex.lua``, which spares an entry re-scored since it was
read (a new attempt of the job started meanwhile: ``enroll.lua`` always moves the score on).
Exactly once holds for any number of
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
import secrets
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ConnectionError

from .._checks import check_number
from .._protocol import calls, wire
from .._protocol.calls import ClaimCode
from .._protocol.clock import clock_of
from .._protocol.cluster import pipelined
from .._protocol.codec import load_json
from .._protocol.codec import text as _text
from .._protocol.deadline import cancellable
from .._protocol.errors import is_noscript, is_redis_fault, is_wrongtype, tolerate_faults
from .._protocol.keys import KeySchema
from .._protocol.ratelimit import RateLimitedLog
from .._protocol.scripts import SCRIPTS
from ..errors import InvalidJobId
from .tally import MAX_KINDS, PRUNE_BATCH, Op, forget_ops, prune_bound

_SWEEP_SCRIPTS = (SCRIPTS.claim, SCRIPTS.unindex, SCRIPTS.tally)

__all__ = ["OnStale", "StaleJob", "Sweeper", "SweeperConfig", "SweeperStatistics"]

log = logging.getLogger("jobpulse")

ERROR_BACKOFF_MS = 60_000
PRUNE_EVERY_MS = 60_000  # a sweeper prunes the kinds set at most once a minute (server time)
"""An entry whose state key is not a Hash (WRONGTYPE: a foreign key) is pushed this far into
the future, so it cannot keep the front of the index busy."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StaleJob:
    """A stale job that a sweeper claimed: it is now LOST and the claim is made once.

    Start it again with ``heartbeat(redis, job.job_id, ...)``: the new attempt gets
    ``attempt + 1``, a higher fence and ``resume_from`` = :attr:`checkpoint`.

    Delivery is at least once: until :meth:`Sweeper.ack` acknowledges it (``run()`` does after
    ``on_stale`` returns) or a new attempt starts, the same claim (same ``job_id``, ``attempt``
    and ``fence``) is returned again by a later sweep of any sweeper. ``(job_id, attempt)``
    names the stale attempt, so a handler can be idempotent.

    Attributes:
        job_id: the job.
        attempt: the attempt that went stale (1 for a first run).
        fence: the fence the claim set; the stale attempt's writes are refused from now on.
        stale_for: seconds between the stale attempt's last heartbeat and the claim (server clock).
        claimed_at_ms: when the claim happened, in ms of the Redis server's clock.
        checkpoint: the details of the stale attempt's last checkpoint (decoded JSON), or None.
        snapshot: the job's snapshot fields as they were just before the claim (``status`` is
            ``"RUNNING"``), decoded to ``str``; on a redelivery, ``fence`` and ``seq`` are the
            claim's.
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
        redeliver_after: seconds after which a claim nobody acknowledged is delivered again
            (> 0).
    """

    batch: int = 100
    retention: float = 3600.0
    maxlen: int = 1000
    redeliver_after: float = 60.0

    def __post_init__(self) -> None:
        for name in ("batch", "maxlen"):
            check_number(name, getattr(self, name), integer=True, minimum=1, strict=False)
        _check_positive("retention", self.retention)
        _check_positive("redeliver_after", self.redeliver_after)


@dataclass(frozen=True, slots=True)
class SweeperStatistics:
    """Counters of one sweeper since it was created.

    Attributes:
        sweeps: completed sweeps.
        claimed: jobs claimed (returned as StaleJob).
        alive: candidates found alive (or claimed, waiting for redelivery) and re-scored.
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
        redeliver_after: seconds after which a claim that nobody acknowledged with :meth:`ack`
            is returned again by a sweep (default 60).
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
        redeliver_after: float = 60.0,
        name: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._schema = KeySchema(namespace, index_shards)
        self._cfg = SweeperConfig(
            batch=batch, retention=retention, maxlen=maxlen, redeliver_after=redeliver_after
        )
        self.name = name if name is not None else f"{socket.gethostname()}:{os.getpid()}"
        if not isinstance(self.name, str) or not 1 <= len(self.name) <= 200:
            raise ValueError(f"name must be a str of 1 to 200 characters, got {name!r}")
        self._redis = redis
        self._clock = clock
        self._warn = RateLimitedLog(log, clock)
        self._sweeps = self._claimed = self._alive = self._dropped = self._errors = 0
        self._round_trips = self._commands = 0
        self._next_prune_ms = 0  # server ms of the next prune of the kinds set

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
            The jobs this call claimed, and claims made earlier that nobody acknowledged for
            ``redeliver_after`` seconds. Each stale attempt is claimed exactly once among all
            sweepers; call :meth:`ack` once a job is handled, or it is returned again.

        Raises:
            redis.exceptions.RedisError, OSError, TimeoutError: Redis failed before anything
                was claimed. A fault after some claims is logged and the claimed jobs are
                returned. A sweep cancelled or timed out after claims loses nothing: the
                claims stay in the index and a later sweep returns them.
        """
        claimed: list[StaleJob] = []
        token = f"{self.name}:{secrets.token_hex(6)}"  # this call's: its replays are its own
        try:
            now_ms = await self._server_ms()
            pending = self._schema.indexes()
            while pending:
                candidates = await self._read(pending, now_ms)
                decided = await self._claim(candidates, now_ms, token)
                claimed += decided.claimed
                await self._forget(decided, now_ms)
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
        else:
            await self._prune_kinds(now_ms)
        self._sweeps += 1
        self._claimed += len(claimed)
        return claimed

    async def _server_ms(self) -> int:
        self._round_trips += 1
        self._commands += 1
        # tally.lua: the server's clock, and the mark "a sweeper ran now" (sweep_ms)
        keys = (self._schema.stats(), self._schema.claims_seen())
        return await cancellable(calls.run(self._redis, calls.tally(*keys)))

    async def _read(self, shards: list[str], now_ms: int) -> dict[str, list[tuple[str, float]]]:
        ops = [_zrange_byscore(shard, now_ms, self._cfg.batch) for shard in shards]
        replies = await self._execute(ops)
        out: dict[str, list[tuple[str, float]]] = {}
        for shard, reply in zip(shards, replies, strict=True):
            if isinstance(reply, Exception):
                raise reply
            out[shard] = [(_text(entry[0]), float(entry[1])) for entry in reply]
        return out

    async def _claim(
        self, candidates: dict[str, list[tuple[str, float]]], now_ms: int, token: str
    ) -> _Round:
        decided = _Round()
        pending: list[tuple[str, str, float]] = []
        ops: list[Op] = []
        error = f"stale: no heartbeat within the lease; claimed by sweeper {self.name}"
        redeliver_ms = math.ceil(self._cfg.redeliver_after * 1000)
        args = [self._cfg.maxlen, math.ceil(self._cfg.retention * 1000), error, redeliver_ms]
        args.append(token)
        for shard, entries in candidates.items():
            for member, score in entries:
                try:
                    keys = self._schema.job(member).all()
                except InvalidJobId:
                    # Not a job id: never a jobpulse entry. Remove it rather than re-read it.
                    self._warn.warning("jobpulse sweeper: dropping index entry %r", member)
                    decided.unindex.setdefault(shard, []).append((member, score))
                    continue
                pending.append((shard, member, score))
                ops.append(_command(calls.claim(keys, args)))
        replies = await self._execute(ops)
        # A claim whose reply was lost (a cut connection; a cluster pipeline does not retry)
        # is sent once more with the same token: claim.lua answers a replay with its claim.
        lost = [i for i, reply in enumerate(replies) if isinstance(reply, ConnectionError)]
        if lost:
            again = await self._execute([ops[i] for i in lost])
            for i, reply in zip(lost, again, strict=True):
                replies[i] = reply
        for (shard, member, score), reply in zip(pending, replies, strict=True):
            if isinstance(reply, Exception):
                # An error reply for this command only (other claims of the pipeline stand).
                self._warn.warning("jobpulse sweeper: claim of %r failed: %r", member, reply)
                if is_wrongtype(reply):  # a foreign key: it will not heal by itself
                    decided.rescore.setdefault(shard, {})[member] = now_ms + ERROR_BACKOFF_MS
                else:  # OOM, READONLY, ...: try again on the next sweep
                    decided.unresolved.add(shard)
                continue
            code = int(reply[0])
            if code == ClaimCode.CLAIMED:  # a new claim, or one made earlier and never acknowledged
                decided.claimed.append(_stale_job(member, reply))
                decided.rescore.setdefault(shard, {})[member] = now_ms + redeliver_ms
            elif code == ClaimCode.NOT_RUNNING:
                self._dropped += 1
                decided.unindex.setdefault(shard, []).append((member, score))
            else:
                self._alive += 1
                left = int(reply[1]) if len(reply) > 1 else 0
                decided.rescore.setdefault(shard, {})[member] = now_ms + max(left, 1)
        return decided

    async def _forget(self, decided: _Round, now_ms: int) -> None:
        """Drop claimed and ended jobs from the kind indexes and count the claims (see
        ``tally.py``); on any failure keep every running entry, so a later sweep retries."""
        claimed = {job.job_id for job in decided.claimed}
        ended = [m for v in decided.unindex.values() for m, _ in v if m not in claimed]
        kinds: list[str] = []
        if ended:
            self._round_trips += 1
            self._commands += 1
            # the most recently indexed first: a kind of a job that just ended is among them
            key = self._schema.kinds()
            kinds = [_text(k) for k in await self._redis.zrevrange(key, 0, MAX_KINDS - 1)]
        ops = forget_ops(self._schema, decided.claimed, ended, kinds, now_ms)
        if any(isinstance(reply, Exception) for reply in await self._execute(ops)):
            self._warn.warning("jobpulse sweeper: kind index cleanup failed; retried next sweep")
            decided.unresolved.update(decided.unindex)
            decided.unindex.clear()

    async def _prune_kinds(self, now_ms: int) -> None:
        """Drop kinds not indexed for ``retention`` whose index is empty (see ``tally.py``), at
        most once a minute; a Redis fault is logged, never raised (the next prune retries)."""
        if now_ms < self._next_prune_ms:
            return
        self._next_prune_ms = now_ms + PRUNE_EVERY_MS
        key = self._schema.kinds()
        cutoff = now_ms - math.ceil(self._cfg.retention * 1000)
        try:
            self._round_trips += 1
            self._commands += 1
            raw = await cancellable(
                self._redis.zrange(
                    key, "-inf", cutoff, byscore=True, offset=0, num=PRUNE_BATCH, withscores=True
                )
            )
            scored = [(_text(k), float(score)) for k, score in raw]
            if not scored:
                return
            replies = await self._execute([_zcard(self._schema.kind_index(k)) for k, _ in scored])
            sizes = [None if isinstance(r, Exception) else int(r) for r in replies]
            bound = prune_bound(scored, sizes, cutoff_ms=cutoff, limit=PRUNE_BATCH)
            if bound is not None:
                self._round_trips += 1
                self._commands += 1
                await cancellable(self._redis.zremrangebyscore(key, "-inf", bound))
        except Exception as exc:
            if not is_redis_fault(exc):
                raise
            self._warn.warning("jobpulse sweeper: pruning the kinds failed: %r", exc)

    async def _cleanup(self, decided: _Round) -> None:
        ops: list[Op] = []
        shards: list[str] = []
        for shard, entries in decided.unindex.items():
            pairs = [x for member, score in entries for x in (member, repr(score))]
            ops.append(_command(calls.unindex(shard, pairs)))
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

    async def _execute(self, ops: list[Op]) -> list[Any]:
        """Send ``ops`` (each queues one command) as one pipeline; after a NOSCRIPT, load the
        scripts and send the refused commands again. Per-command errors are returned."""
        replies = await self._pipeline(ops)
        redo = [i for i, reply in enumerate(replies) if is_noscript(reply)]
        if redo:
            clock = clock_of(self._redis)
            for script in calls.scripts_to_load(replies, _SWEEP_SCRIPTS):
                self._round_trips += 1
                self._commands += 1
                await cancellable(self._redis.script_load(clock.script(script).text))
            again = await self._pipeline([ops[i] for i in redo])
            for i, reply in zip(redo, again, strict=True):
                replies[i] = reply
        return replies

    async def _pipeline(self, ops: list[Op]) -> list[Any]:
        if not ops:
            return []
        clock = clock_of(self._redis)
        await cancellable(clock.sample(self._redis))  # argument time only, when due
        # script calls carry the client's script time; on a cluster ASK is followed on one
        # connection (_protocol/cluster.py)
        commands = [clock.stamp(args) if args[0] == "EVALSHA" else args for args, _ in ops]
        self._round_trips += 1
        self._commands += len(ops)
        return await cancellable(pipelined(self._redis, commands, [o for _, o in ops]))

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
        lockstep), and hands each claimed job to ``on_stale``, acknowledging it
        (:meth:`ack`) once the callback returned. An exception in the callback is logged, the
        job is not acknowledged (a later sweep, of any sweeper, delivers it again after
        ``redeliver_after``) and the loop goes on; a Redis fault is logged (rate-limited) and
        the next sweep tries again. A sweep abandoned at ``timeout`` loses no claim either.
        Leaving the block lets the current sweep finish and deliver its jobs.

        Args:
            period: seconds between sweeps (> 0).
            on_stale: called with each :class:`StaleJob`, plain or coroutine function; the
                loop awaits it, so a long job should be handed to another task. None only
                marks stale jobs LOST (readers see them) and acknowledges them.
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
            with tolerate_faults(self._sweep_failed):
                async with asyncio.timeout(limit):
                    jobs = await self.sweep()
            for job in jobs:
                await self._deliver(on_stale, job)
            pause = period * (1 + jitter * random.uniform(-1, 1)) - (self._clock() - started)
            if pause > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):
                        await stop.wait()

    def _sweep_failed(self, exc: BaseException) -> None:
        self._warn.warning("jobpulse sweeper: sweep failed, retrying: %r", exc)

    async def _deliver(self, on_stale: OnStale | None, job: StaleJob) -> None:
        """Hand ``job`` to ``on_stale``; acknowledge it once that returned (a failing handler
        gets the job again after ``redeliver_after``)."""
        if on_stale is not None:
            try:
                result = on_stale(job)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("jobpulse sweeper: on_stale failed for job %s", job.job_id)
                return
        warn = self._warn.warning
        with tolerate_faults(lambda e: warn("jobpulse sweeper: ack of %s failed: %r", job, e)):
            await self.ack(job)

    async def ack(self, job: StaleJob) -> bool:
        """Acknowledge a claimed job: it was handled, so no sweep returns it again.

        :meth:`run` acknowledges each job once ``on_stale`` returned; users of :meth:`sweep`
        call this themselves. Safe to call twice. A new attempt of the job (a new
        ``heartbeat``) acknowledges it too.

        Args:
            job: a :class:`StaleJob` returned by :meth:`sweep` (of any sweeper).

        Returns:
            True when the claim is acknowledged (by this call, or before it: a replay gives
            the same answer); False when there was nothing to acknowledge (a new attempt
            started, or the job's snapshot expired).

        Raises:
            redis.exceptions.RedisError, OSError, TimeoutError: Redis failed; the claim stays
                unacknowledged and is delivered again.
        """
        keys = self._schema.job(job.job_id).all()
        self._round_trips += 1
        self._commands += 1
        return await calls.run(self._redis, calls.ack(keys, job.fence))


# -- helpers (pure) ------------------------------------------------------------------------------


def _check_positive(name: str, value: object) -> None:
    check_number(name, value, minimum=0)


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


def _zrange_byscore(shard: str, now_ms: int, batch: int) -> Op:
    # ZRANGE … BYSCORE (Redis 6.2+), not ZRANGEBYSCORE: deprecated, and not on every server.
    args = ("ZRANGE", shard, "-inf", now_ms, "BYSCORE", "LIMIT", 0, batch, "WITHSCORES")
    return args, {"withscores": True, "score_cast_func": float}  # what pipe.zrange passes


def _zcard(key: str) -> Op:
    return ("ZCARD", key), {}


def _command(call: calls.Call[Any]) -> Op:
    return call.command(), {}


def _zadd_later(shard: str, members: dict[str, int]) -> Op:
    return wire.zadd(shard, members, "XX", "GT"), {}
