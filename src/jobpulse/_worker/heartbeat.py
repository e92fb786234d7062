"""``heartbeat()`` and ``JobHeartbeat``: the worker side of a job.

The body runs in the caller's task. Beats are not sent by a task of the job's own: every job of
a process (per Redis client) is beaten by one shared :class:`~jobpulse._worker.ticker.Ticker`,
which pipelines the ``EVALSHA``s of all due jobs. This class holds the job's state and the pure
bookkeeping the ticker calls: build the next beat, take its reply.

Invariants:
  * at most one beat of a job is in flight; ``seq`` grows by one per beat sent;
  * once the lease is lost no further write of this worker is sent, except the LOST record after
    an EXPIRED loss, which the finish script accepts only if nobody claimed the job;
  * the body is cancelled by us at most once per cause, and exactly those cancellations are
    taken back (``Task.uncancel``) when they are turned into ``LeaseLost``/``JobCancelled``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import socket
import time
from collections import deque
from collections.abc import Callable
from contextvars import Token
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from .._protocol.codec import dump_json, fmt_float, fmt_int, load_json
from .._protocol.deadline import cancellable
from .._protocol.errors import is_redis_fault
from .._protocol.keys import KeySchema, check_job_id
from .._protocol.scripts import SCRIPTS, evalsha
from ..errors import JobBusy, JobCancelled, LeaseLost, LeaseLostCause, StateNotWritten
from .config import MAX_ERROR_CHARS, HeartbeatConfig, check_kind, check_stage
from .current import enter_current, leave_current
from .lease import BeatOutcome, Lease, classify_beat
from .progress import ProgressCell
from .ratelimit import RateLimitedLog
from .sampling import ProcessSample, RateWindow
from .stats import WORKER_STATS, notify
from .ticker import Ticker

__all__ = ["HeartbeatStatistics", "JobHeartbeat", "heartbeat"]

log = logging.getLogger("jobpulse")


@dataclass(frozen=True, slots=True)
class HeartbeatStatistics:
    """Counters of one heartbeat, for logs and tests."""

    beats_sent: int
    beats_written: int
    beats_failed: int
    seq: int
    fence: int
    lease: str


class JobHeartbeat:
    """The running job, as seen by its worker. Create it with :func:`heartbeat`.

    Attributes:
        job_id: the job.
        progress: the job's :class:`~jobpulse.ProgressCell` (pass it to executor functions).
        fence: the fencing number of this attempt (grows across attempts of a job id).
        attempt: 1 for a first run, n + 1 for a run that took over a STALE or LOST job.
        resume_from: the last checkpoint details of the previous attempt when it went STALE or
            LOST, else None.
        kind: the job's kind (``""`` for none), as given to :func:`heartbeat`.
    """

    def __init__(
        self,
        redis: Any,
        job_id: str,
        *,
        total: int | None = None,
        interval: float = 1.0,
        ttl: float = 6.0,
        namespace: str = "jobpulse",
        meta: Any = None,
        kind: str = "",
        worker: str | None = None,
        stream_every: int = 10,
        maxlen: int = 1000,
        retention: float = 3600.0,
        max_meta_bytes: int = 64 * 1024,
        max_details_bytes: int = 64 * 1024,
        final_timeout: float = 30.0,
        index_every: int = 10,
        index_shards: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job_id = check_job_id(job_id)
        self._schema = KeySchema(namespace, index_shards)
        self._keys = self._schema.job(job_id).all()
        self._cfg = HeartbeatConfig(
            interval=interval,
            ttl=ttl,
            stream_every=stream_every,
            maxlen=maxlen,
            retention=retention,
            max_meta_bytes=max_meta_bytes,
            max_details_bytes=max_details_bytes,
            final_timeout=final_timeout,
            index_every=index_every,
        )
        if total is not None and (isinstance(total, bool) or not isinstance(total, int)):
            raise TypeError(f"total must be an int or None, got {total!r}")
        if total is not None and total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        self._total = total
        self._meta = "" if meta is None else dump_json(meta, limit=max_meta_bytes, name="meta")
        self.kind = check_kind(kind)
        self._worker = worker if worker is not None else f"{socket.gethostname()}:{os.getpid()}"
        if not isinstance(self._worker, str) or not 1 <= len(self._worker) <= 200:
            raise ValueError("worker must be a str of 1 to 200 characters")
        self._redis = redis
        self._clock = clock
        self._token = secrets.token_hex(6)  # 48 random bits: together with the fence, unique
        self._warn = RateLimitedLog(log, clock)

        self.progress: ProgressCell
        self.fence = 0
        self.attempt = 0
        self.resume_from: Any = None
        self._lease = Lease(self._cfg.ttl, float("-inf"), LeaseLostCause.EXPIRED)
        self._seq = 0
        self._started_ms = 0
        self._stage = ""
        self._stage_changed = False
        self._checkpoints: deque[tuple[str, asyncio.Future[None]]] = deque()
        self._last_checkpoint = ""
        self._inflight: tuple[str, tuple[str, asyncio.Future[None]] | None] | None = None
        self._beat_head: list[bytes] = []
        self._resend_static = False
        self._beats = 0
        self._last_event_beat = 0
        self._written = 0
        self._failed = 0
        self._due = 0.0  # when the next beat is due (our clock)
        self._planned = math.nan  # the ticker's plan key for _due (stale heap entries differ)
        self._expiry: asyncio.TimerHandle | None = None
        self._rate = RateWindow()
        self._ticker: Ticker | None = None
        self._host: asyncio.Task[Any] | None = None
        self._in_body = False
        self._ended = False  # set at exit: late beat replies are ignored from then on
        self._our_cancels = 0
        self._cancel_requested = False
        self._crash: BaseException | None = None
        self._current: Token[JobHeartbeat | None] | None = None
        self._index_score = 0  # the latest index deadline this worker wrote (server ms)

    # -- public API --------------------------------------------------------------------------

    @property
    def stage(self) -> str:
        return self._stage

    def set_stage(self, name: str) -> None:
        """Name the current stage; the next beat records it (a ``stage`` stream entry).

        Raises:
            ValueError: ``name`` is empty, longer than 200 characters, or not printable.
        """
        check_stage(name)
        if name != self._stage:
            self._stage = name
            self._stage_changed = True
            notify("stage", self.job_id, self.kind, {"stage": name})

    async def checkpoint(self, **details: Any) -> None:
        """Force a beat now that records ``details`` (JSON) as a ``checkpoint`` stream entry.

        The details are also kept as the job's last checkpoint: an attempt that takes over after
        this one went STALE or LOST gets them as ``resume_from``. Returns once written.

        Raises:
            TypeError: the details are not JSON-serialisable.
            ValueError: the details are larger than ``max_details_bytes``.
            LeaseLost: the lease was lost before the checkpoint was written.
        """
        text = dump_json(details, limit=self._cfg.max_details_bytes, name="checkpoint details")
        self._raise_if_lost()
        if not self._in_body:
            raise RuntimeError("checkpoint() is only allowed inside `async with heartbeat(...)`")
        notify("checkpoint", self.job_id, self.kind, details)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._checkpoints.append((text, future))
        self._plan(self._clock())
        await future

    def statistics(self) -> HeartbeatStatistics:
        return HeartbeatStatistics(
            self._beats, self._written, self._failed, self._seq, self.fence, str(self._lease)
        )

    def __repr__(self) -> str:
        return (
            f"<JobHeartbeat job={self.job_id} fence={self.fence} attempt={self.attempt} "
            f"seq={self._seq} lease={self._lease}>"
        )

    # -- enter and exit ------------------------------------------------------------------------

    async def __aenter__(self) -> JobHeartbeat:
        if self._host is not None:
            raise RuntimeError("a JobHeartbeat can be entered only once")
        self._host = asyncio.current_task()
        self._ticker = ticker = Ticker.for_client(self._redis, self._clock)
        self.progress = ProgressCell(self._total)
        try:
            async with ticker.slot():
                await self._acquire()
        except BaseException:
            self.progress._unlink()
            raise
        ticker.add(self)
        self._in_body = True
        self._current = enter_current(self)
        return self

    async def _acquire(self) -> None:
        """Index the job, then take its lease (two steps: on a cluster the index shard and the
        job's keys live in different slots, so no one script can do both).

        The index entry goes first (``enroll.lua``, an intent record): a job is RUNNING only
        after its entry exists, and ``acquire.lua`` refuses to start once that entry may have
        been dropped, so every RUNNING job is findable by the sweeper from the moment it
        exists. An entry whose acquire never ran is dropped by the sweeper ("not running").
        Both scripts are safe to replay (redis-py retries after a connection error).
        """
        shard = self._schema.index_for(self.job_id)
        horizon_ms = int(self._cfg.index_horizon * 1000)
        args = [self._token, self._cfg.ttl_ms, self._cfg.maxlen, self._worker]
        args += [fmt_int(self._total), self._meta, "", self.kind]
        sent_at = self._clock()
        acquire_sent = False
        fault: BaseException | None = None
        try:
            async with asyncio.timeout(self._cfg.ttl):
                delay = 0.02
                while True:
                    try:
                        enroll = evalsha(
                            self._redis, SCRIPTS.enroll, (shard,), [self.job_id, horizon_ms]
                        )
                        deadline = int(await cancellable(enroll))
                        # The sweeper may drop the entry from its deadline on (if the job is
                        # not RUNNING by then): start no later, with a margin for skew.
                        latest = deadline - min(self._cfg.ttl_ms, horizon_ms // 4)
                        acquire_sent = True
                        reply = await cancellable(
                            evalsha(self._redis, SCRIPTS.acquire, self._keys, [*args, latest])
                        )
                        break
                    except Exception as exc:
                        if not is_redis_fault(exc):
                            raise
                        # Both scripts are safe to replay: a fault (a reset connection, a
                        # failover, a cluster client still learning its slots) is retried
                        # within the acquire's bound, and a replayed acquire that finds its
                        # own lease answers the attempt it started.
                        fault = exc
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, 0.5)
        except TimeoutError as exc:
            raise TimeoutError(
                f"job {self.job_id!r}: Redis did not answer in time (ttl={self._cfg.ttl} s) "
                + ("" if fault is None else f"(last fault: {fault!r}) ")
                + (
                    "while trying to acquire its lease; the job was either not started, or "
                    "started and indexed: if so it goes stale within ttl and a sweeper marks "
                    "it LOST"
                    if acquire_sent
                    else "while trying to index the job; nothing is running"
                )
            ) from exc
        code = int(reply[0])
        if code == 0:
            raise JobBusy(self.job_id)
        if code != 1:
            raise TimeoutError(
                f"job {self.job_id!r}: the acquire reached Redis too late (after its index "
                f"entry could have been dropped); nothing was started"
            )
        self.fence, self.attempt, self._seq = int(reply[1]), int(reply[2]), int(reply[3])
        resume = reply[4].decode() if isinstance(reply[4], bytes) else reply[4]
        self.resume_from = load_json(resume)
        self._last_checkpoint = resume or ""
        self._started_ms = int(reply[5])
        self._index_score = deadline
        self._lease = Lease(self._cfg.ttl, sent_at)
        # What every beat starts with, encoded once (redis-py passes bytes through as they are).
        head = (SCRIPTS.beat.sha, 5, *self._keys, self._token, self.fence, self._cfg.ttl_ms)
        self._beat_head = [str(x).encode() for x in head]
        self._due = sent_at + self._cfg.interval
        self._arm_expiry()
        # The per-kind index (docs/protocol.md), scored by this attempt's start: best effort,
        # like the metrics it serves (the running-jobs index above is what recovery needs).
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.zadd(self._schema.kind_index(self.kind), {self.job_id: self._started_ms})
                pipe.zadd(self._schema.kinds(), {self.kind: self._index_score})
                await pipe.execute()
        except Exception as exc:
            if not is_redis_fault(exc):
                raise
            self._warn.warning("job %s: could not index its kind yet: %r", self.job_id, exc)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._in_body = False
        self._ended = True
        leave_current(self._current)
        self._current = None
        self._disarm_expiry()
        if self._ticker is not None:
            self._ticker.remove(self)
        host = self._host
        ours = self._our_cancels
        if host is not None and ours:
            for _ in range(ours):
                host.uncancel()
        external_cancel = isinstance(exc, asyncio.CancelledError) and (
            not ours or (host is not None and host.cancelling() > 0)
        )
        try:
            await self._finish(exc, external_cancel)
        finally:
            self.progress._cancel()
            self.progress._unlink()

    async def _finish(self, exc: BaseException | None, external_cancel: bool) -> None:
        """Write the final state; raise what the ``async with`` must raise (else the body's
        own exception, if any, propagates unchanged)."""
        cause = self._lease.lost
        if self._crash is not None:
            status, error = "FAILED", _error_text(self._crash)
        elif cause is not None:
            status, error = "LOST", f"lease lost: {cause.value}"
        elif external_cancel or self._cancel_requested or isinstance(exc, JobCancelled):
            status, error = "CANCELLED", "" if exc is None else _error_text(exc)
        elif exc is not None and not isinstance(exc, asyncio.CancelledError):
            status, error = "FAILED", _error_text(exc)
        else:
            status, error = "COMPLETED", ""

        written: bool | None = None
        if cause in (None, LeaseLostCause.EXPIRED):
            task = asyncio.ensure_future(self._final_write(status, error))
            try:
                written = await asyncio.shield(task)
            except asyncio.CancelledError:
                written = await task
                raise

        if self._crash is not None:
            raise self._crash
        if self._lease.lost is not None:
            raise LeaseLost(self.job_id, self._lease.lost) from (
                None if isinstance(exc, asyncio.CancelledError | JobCancelled) else exc
            )
        if written is False:
            message = f"the final state {status} of job {self.job_id!r} was not written to Redis"
            if exc is None:
                raise StateNotWritten(message)
            exc.add_note(message)
        if external_cancel:
            return
        if self._cancel_requested and (exc is None or isinstance(exc, asyncio.CancelledError)):
            raise JobCancelled(f"job {self.job_id!r} was cancelled on request")

    async def _final_write(self, status: str, error: str) -> bool:
        """Write the final state, retrying through Redis faults for up to ``final_timeout``.

        LOST is the exception: the lease is already gone, the caller is owed ``LeaseLost``
        within about ``ttl + interval``, and a sweeper records LOST anyway; so LOST is tried
        for at most one ``interval``. COMPLETED, FAILED and CANCELLED carry the job's outcome
        and keep the long retry.

        Returns True when written (or already ended), False when it could not be written.
        """
        limit = self._cfg.final_timeout
        if status == "LOST":
            limit = min(limit, self._cfg.interval)
        deadline = self._clock() + limit
        delay = 0.05
        self._seq += 1
        await self._read_index_score(limit)
        while True:
            args = [
                self._token,
                self.fence,
                self._cfg.ttl_ms,
                self._seq,
                status,
                error[:MAX_ERROR_CHARS],
                self._cfg.maxlen,
                int(self._cfg.retention * 1000),
                "",
                *self._dynamic_values(self._ticker.sample() if self._ticker else None, 0.0),
                *self._static_pairs(),
            ]
            left = deadline - self._clock()
            try:
                async with asyncio.timeout(max(left, 0.01)), self._slot():
                    reply = await cancellable(
                        evalsha(self._redis, SCRIPTS.finish, self._keys, args)
                    )
                code = int(reply[0])
            except Exception as exc:
                if not is_redis_fault(exc):
                    raise
                if self._clock() + delay >= deadline:
                    log.error("job %s: final state %s not written: %r", self.job_id, status, exc)
                    WORKER_STATS.final_writes_failed += 1
                    return False
                self._warn.warning("job %s: final write failed, retrying: %r", self.job_id, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            if code < 0:
                self._lease.lose(classify_beat(code)[1] or LeaseLostCause.FENCED_OUT)
            else:
                await self._unindex()
            return True

    async def _read_index_score(self, limit: float) -> None:
        """Read the job's running-index score before the final write (best effort, bounded).

        The conditional removal after the final write spares any entry moved past what this
        worker knows, because a new attempt's ``enroll.lua`` always moves it past the current
        score. Two writes also move it without the worker knowing: a sweeper re-scoring the
        entry of a live but late job, and an index refresh whose reply was lost. Both happen
        before the final write, never after it, so reading the score now (while the job is
        still ours: no new attempt can exist) covers them; an entry a new attempt enrolls
        after the final write still scores above what is read here.
        """
        shard = self._schema.index_for(self.job_id)
        try:
            async with asyncio.timeout(min(limit, self._cfg.ttl)), self._slot():
                score = await cancellable(self._redis.zscore(shard, self.job_id))
        except Exception as exc:
            if not is_redis_fault(exc):
                raise
            return  # the removal is then conditional on what the worker wrote itself
        if score is not None:
            self._index_score = max(self._index_score, int(score))

    async def _unindex(self) -> None:
        """Drop the job from the running-jobs index (best effort: a sweeper drops entries of
        ended jobs it meets, so a failure here costs one wasted claim attempt, never a job)."""
        try:
            # Conditional (unindex.lua): only while the entry still holds a deadline this
            # worker wrote or read before its final write; a new attempt's enroll always
            # moves it past those.
            shard = self._schema.index_for(self.job_id)
            async with asyncio.timeout(self._cfg.ttl), self._slot():
                # The kind entry first: a failure keeps the running entry, and the sweeper that
                # drops it drops the kind entry too. Only this attempt's entry (by started_ms).
                by_kind = (self._schema.kind_index(self.kind),)
                mine = [self.job_id, self._started_ms]
                await cancellable(evalsha(self._redis, SCRIPTS.unindex, by_kind, mine))
                running = [self.job_id, self._index_score]
                await cancellable(evalsha(self._redis, SCRIPTS.unindex, (shard,), running))
        except Exception as exc:
            if not is_redis_fault(exc):
                raise
            self._warn.warning("job %s: could not drop it from the index: %r", self.job_id, exc)

    def _slot(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self._ticker.slot() if self._ticker is not None else contextlib.nullcontext()

    # -- called by the ticker (synchronous, no I/O) ------------------------------------------

    def _plan(self, due: float) -> None:
        """Set when the next beat is due and tell the ticker."""
        self._due = due
        if self._ticker is not None and not self._ended:
            self._ticker.schedule(self)

    def _arm_expiry(self) -> None:
        """A loop timer at the lease deadline, independent of the ticker and of every reply.

        It is not moved on each renewal: when it fires it re-arms itself at the (later) deadline
        if the lease was renewed meanwhile, so a job costs one timer per ``ttl``, not per beat.
        """
        delay = self._lease.deadline - self._clock()
        loop = asyncio.get_running_loop()
        self._expiry = loop.call_later(max(delay, 0.0), self._expiry_fired)

    def _expiry_fired(self) -> None:
        self._expiry = None
        if self._ended or not self._lease.held:
            return
        try:
            if not self._expire_if_due(self._clock()):
                self._arm_expiry()
        except Exception as exc:  # a bug (or a broken injected clock): never a silent death
            log.exception("job %s: lease timer failed; stopping the job", self.job_id)
            self._crashed(exc)

    def _disarm_expiry(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    def _next_beat(self, now: float, lag: float, sample: ProcessSample) -> list[Any]:
        """Build the next beat (the arguments of ``EVALSHA``) and mark it in flight."""
        kind, details, checkpoint = "", "", None
        self._beats += 1
        if self._checkpoints:
            checkpoint = self._checkpoints.popleft()
            kind, details = "checkpoint", checkpoint[0]
        elif self._stage_changed:
            kind = "stage"
        elif self._beats - self._last_event_beat >= self._cfg.stream_every:
            kind = "beat"
        if kind:
            self._last_event_beat = self._beats
            self._stage_changed = False
        self._inflight = (kind, checkpoint)
        self._seq += 1
        args: list[Any] = [
            *self._beat_head,
            self._seq,
            kind,
            details,
            self._cfg.maxlen,
            *self._dynamic_values(sample, lag, now),
        ]
        if checkpoint is not None:
            self._last_checkpoint = details
            args += ["checkpoint", details]
        if self._resend_static:
            args += self._static_pairs()
        return args

    def _dynamic_values(
        self, sample: ProcessSample | None, lag: float, now: float | None = None
    ) -> list[str]:
        cell = self.progress
        done = max(cell.done, 0)
        total = cell.total
        if now is not None:
            self._rate.add(now, done)
        return [
            str(done),
            fmt_int(total),
            self._stage,
            fmt_float(self._rate.rate()),
            fmt_float(self._rate.eta(done, total), 1),
            "" if sample is None else str(sample.rss_bytes),
            "" if sample is None else fmt_float(sample.cpu_seconds),
            fmt_float(lag * 1000, 1),
        ]

    def _static_pairs(self) -> list[Any]:
        pairs: list[Any] = ["attempt", self.attempt, "worker", self._worker]
        pairs += ["started_ms", self._started_ms, "meta", self._meta, "kind", self.kind]
        if self._last_checkpoint:
            pairs += ["checkpoint", self._last_checkpoint]
        return pairs

    def _beat_replied(self, sent_at: float, reply: Any) -> None:
        code, cancel, _now_ms, snapshot_seq = (int(x) for x in reply[:4])
        inflight, self._inflight = self._inflight, None
        if self._ended:
            return  # a beat that raced the final write: the final write decides
        outcome, cause = classify_beat(code)
        if outcome is BeatOutcome.LOST:
            self._lose(cause or LeaseLostCause.FENCED_OUT)
            if inflight and inflight[1]:
                _fail(inflight[1][1], LeaseLost(self.job_id, self._lease.lost or cause))  # type: ignore[arg-type]
            return
        self._lease.renewed(sent_at)
        # keep the cadence: beats are sent up to a tenth of an interval early (to share ticks)
        due = self._due + self._cfg.interval
        if due <= sent_at:  # late (a starved loop, a slow reply): no burst to catch up
            due = sent_at + self._cfg.interval
            WORKER_STATS.beats_late += 1
        if outcome is BeatOutcome.SEQ_BEHIND:
            self._seq = max(self._seq, snapshot_seq)
            self._requeue(inflight)
            due = sent_at
        else:
            self._written += 1
            self._resend_static = outcome is BeatOutcome.RESEND_STATIC
            if self._resend_static:
                due = sent_at  # resend the static fields at once
            if inflight and inflight[1] and not inflight[1][1].done():
                inflight[1][1].set_result(None)
        if self._checkpoints:
            due = sent_at  # a checkpoint asked for while this beat was in flight
        self._plan(due)
        if cancel and not self._cancel_requested:
            self._cancel_requested = True
            self._interrupt()

    def _beat_failed(
        self, sent_at: float, exc: BaseException, *, quiet: bool = False, at_once: bool = False
    ) -> None:
        """A beat got no answer, or an error. Retry after ``min(interval, 0.25)`` s, or at once
        (NOSCRIPT: the script is being loaded). ``quiet``: the caller logs for many jobs."""
        inflight, self._inflight = self._inflight, None
        if self._ended:
            return
        self._failed += 1
        WORKER_STATS.beat_failures += 1
        self._requeue(inflight)
        self._plan(sent_at if at_once else sent_at + min(self._cfg.interval, 0.25))
        if not quiet:
            self._warn.warning("job %s: beat failed, retrying: %r", self.job_id, exc)

    def _requeue(
        self, inflight: tuple[str, tuple[str, asyncio.Future[None]] | None] | None
    ) -> None:
        if inflight is None:
            return
        kind, checkpoint = inflight
        if checkpoint is not None:
            self._checkpoints.appendleft(checkpoint)
        elif kind == "stage":
            self._stage_changed = True

    def _expire_if_due(self, now: float) -> bool:
        if self._lease.expire_if_due(now):
            self._on_lost()
            return True
        return False

    def _lose(self, cause: LeaseLostCause) -> None:
        if self._lease.lose(cause):
            self._on_lost()

    def _on_lost(self) -> None:
        WORKER_STATS.lost((self._lease.lost or LeaseLostCause.EXPIRED).name.lower())
        log.warning("job %s: lease lost (%s); stopping the job", self.job_id, self._lease)
        error = LeaseLost(self.job_id, self._lease.lost or LeaseLostCause.EXPIRED)
        while self._checkpoints:
            _fail(self._checkpoints.popleft()[1], error)
        self._interrupt()

    def _crashed(self, exc: BaseException) -> None:
        """An unexpected error in the ticker: stop the job and surface ``exc`` at exit."""
        if self._crash is None:
            self._crash = exc
            self._interrupt()

    def _interrupt(self) -> None:
        self.progress._cancel()
        if self._in_body and self._host is not None and not self._host.done():
            self._host.cancel()
            self._our_cancels += 1

    def _raise_if_lost(self) -> None:
        if self._lease.lost is not None:
            raise LeaseLost(self.job_id, self._lease.lost)


def heartbeat(redis: Any, job_id: str, **options: Any) -> JobHeartbeat:
    """Run a job under a heartbeat: ``async with heartbeat(redis, job_id) as hb: ...``.

    Entering takes the job's lease and writes its first snapshot and ``start`` entry (so the job
    is visible when the body starts). Exiting writes COMPLETED, FAILED (an exception, with
    ``error`` = ``"Type: message"``), CANCELLED (cancellation, or :func:`request_cancel`) or LOST,
    then releases the lease.

    Args:
        redis: a ``redis.asyncio.Redis`` or ``RedisCluster``.
        job_id: 1 to 200 characters of ``A-Z a-z 0-9 . _ - : /``.
        **options: ``total``, ``interval`` (1.0), ``ttl`` (6.0), ``namespace`` ("jobpulse"),
            ``meta``, ``kind`` (""), ``worker``, ``stream_every`` (10), ``maxlen`` (1000),
            ``retention`` (3600.0), ``max_meta_bytes`` and ``max_details_bytes`` (65536),
            ``final_timeout`` (30.0), ``index_every`` (10), ``index_shards`` (1) — see
            :class:`JobHeartbeat`.

    Raises:
        InvalidJobId: the job id or namespace is invalid (before any Redis command).
        ValueError, TypeError: an option is out of range (before any Redis command).
        JobBusy: another live worker holds the job.
        redis.exceptions.RedisError: Redis refused or failed the acquire; nothing is running
            (a job that did start is indexed, goes stale within ``ttl`` and is marked LOST by
            a sweeper).
        TimeoutError: Redis did not answer within ``ttl``; the message says which step
            (indexing or the lease) and what may have been left (at most an indexed job that
            a sweeper marks LOST).
            A late acquire (after its index entry could be gone) starts nothing and says so.
        LeaseLost: (on exit) the lease was lost; the job was stopped.
        JobCancelled: (on exit) the job was cancelled on request.
    """
    return JobHeartbeat(redis, job_id, **options)


def _fail(future: asyncio.Future[None], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
        future.exception()  # mark retrieved: a checkpoint nobody awaits any more is not an error


def _error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text[:MAX_ERROR_CHARS]
