"""``heartbeat()`` and ``JobHeartbeat``: the asyncio shell of a job's heartbeat.

Every decision (what a beat carries, what a reply means, which final state) is the pure
:class:`~jobpulse._worker.machine.BeatMachine`'s; this shell does the I/O and the timers. Beats
are not sent by a task of the job's own: every job of a process (per Redis client) is beaten by
one shared :class:`~jobpulse._worker.ticker.Ticker`, which pipelines the ``EVALSHA``s of all due
jobs and talks to a job through the narrow ``Beating`` interface (``beat``, ``beat_replied``,
``beat_failed``, ``crashed``).

Invariants:
  * the body is cancelled by us at most once per cause, and exactly those cancellations are
    taken back (``Task.uncancel``) when they are turned into ``LeaseLost``/``JobCancelled``;
  * after exit began, late beat replies are ignored: the final write decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from contextvars import Token
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .._protocol import calls
from .._protocol.calls import BeatReply
from .._protocol.clients import AsyncClient
from .._protocol.cluster import pipelined
from .._protocol.deadline import cancellable
from .._protocol.errors import is_redis_fault, tolerate_faults
from .._protocol.ratelimit import RateLimitedLog
from .._protocol.rebuild import ClientFactory
from ..errors import JobCancelled, LeaseLost, LeaseLostCause, StateNotWritten
from .current import enter_current, leave_current
from .lease import Lease
from .machine import ACQUIRE_RETRY_CAP, ACQUIRE_RETRY_FIRST, BeatMachine, ReplyVerdict
from .progress import ProgressCell
from .sampling import ProcessSample
from .stats import WORKER_STATS, notify
from .ticker import Ticker

if TYPE_CHECKING:
    from .sidecar.job import AsyncSidecarHeartbeat

__all__ = ["HeartbeatStatistics", "JobHeartbeat", "heartbeat"]

log = logging.getLogger("jobpulse")


@dataclass(frozen=True, slots=True)
class HeartbeatStatistics:
    """Counters of one heartbeat (``JobHeartbeat.statistics()``), for logs and tests.

    Attributes:
        beats_sent: beats built and sent.
        beats_written: beats Redis answered as written.
        beats_failed: beats that got no answer or an error (each retried).
        seq: the last sequence number sent.
        fence: this attempt's fence.
        lease: ``"held"`` or ``"lost (cause)"``.
    """

    beats_sent: int
    beats_written: int
    beats_failed: int
    seq: int
    fence: int
    lease: str

    @classmethod
    def of(cls, machine: BeatMachine[Any]) -> HeartbeatStatistics:
        m = machine
        return cls(m.beats, m.written, m.failed, m.seq, m.fence, str(m.lease))


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
        redis: AsyncClient,
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
        self._m: BeatMachine[asyncio.Future[None]] = BeatMachine(
            job_id,
            total=total,
            interval=interval,
            ttl=ttl,
            namespace=namespace,
            meta=meta,
            kind=kind,
            worker=worker,
            stream_every=stream_every,
            maxlen=maxlen,
            retention=retention,
            max_meta_bytes=max_meta_bytes,
            max_details_bytes=max_details_bytes,
            final_timeout=final_timeout,
            index_every=index_every,
            index_shards=index_shards,
        )
        self.job_id = self._m.job_id
        self.kind = self._m.kind
        self._redis: Any = redis
        self._clock = clock
        self._warn = RateLimitedLog(log, clock)
        self.progress: ProgressCell
        self._expiry: asyncio.TimerHandle | None = None
        self._ticker: Ticker | None = None
        self._host: asyncio.Task[Any] | None = None
        self._in_body = False
        self._ended = False  # set at exit: late beat replies are ignored from then on
        self._our_cancels = 0
        self._crash: BaseException | None = None
        self._current: Token[Any] | None = None

    # -- public API --------------------------------------------------------------------------

    @property
    def fence(self) -> int:
        return self._m.fence

    @property
    def attempt(self) -> int:
        return self._m.attempt

    @property
    def resume_from(self) -> Any:
        return self._m.resume_from

    @property
    def stage(self) -> str:
        return self._m.stage

    @property
    def lease_held(self) -> bool:
        """True while this worker holds the job's lease: not lost, and its deadline (by the
        local monotonic clock) not passed. A queue integration refreshes the queue's own claim
        only while this holds (the same rule as ``jobpulse.sync.SyncHeartbeat.lease_held``)."""
        return self._m.lease.held_at(self._clock())

    @property
    def cancelled(self) -> bool:
        """True once the job must stop (a cancel request, a lost lease, or the end)."""
        return self.progress.cancelled

    def check(self) -> None:
        """Raise ``JobCancelled`` once the job must stop (as ``progress.check()``)."""
        self.progress.check()

    def set_stage(self, name: str) -> None:
        """Name the current stage; the next beat records it (a ``stage`` stream entry).

        Raises:
            ValueError: ``name`` is empty, longer than 200 characters, or not printable.
        """
        if self._m.set_stage(name):
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
        text = self._m.checkpoint_text(details)
        self._raise_if_lost()
        if not self._in_body:
            raise RuntimeError("checkpoint() is only allowed inside `async with heartbeat(...)`")
        notify("checkpoint", self.job_id, self.kind, details)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._m.add_checkpoint(text, future, self._clock())
        self._plan()
        await future

    def statistics(self) -> HeartbeatStatistics:
        """This heartbeat's counters."""
        return HeartbeatStatistics.of(self._m)

    def __repr__(self) -> str:
        return self._m.describe("JobHeartbeat")

    # Internal views kept for the fault tests (they read the lease, token and seq).
    @property
    def _lease(self) -> Lease:
        return self._m.lease

    @property
    def _token(self) -> str:
        return self._m.token

    @property
    def _seq(self) -> int:
        return self._m.seq

    @_seq.setter
    def _seq(self, value: int) -> None:
        self._m.seq = value

    # -- enter and exit ------------------------------------------------------------------------

    async def __aenter__(self) -> JobHeartbeat:
        if self._host is not None:
            raise RuntimeError("a JobHeartbeat can be entered only once")
        self._host = asyncio.current_task()
        self._ticker = ticker = Ticker.for_client(self._redis, self._clock)
        self.progress = ProgressCell(self._m.total)
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
        m = self._m
        sent_at = self._clock()
        enrolled = False
        fault: BaseException | None = None
        try:
            async with asyncio.timeout(m.cfg.ttl):
                delay = ACQUIRE_RETRY_FIRST
                while True:
                    try:
                        deadline = await cancellable(calls.run(self._redis, m.enroll_call()))
                        enrolled = True
                        reply = await cancellable(calls.run(self._redis, m.acquire_call(deadline)))
                        break
                    except Exception as exc:
                        if not is_redis_fault(exc):
                            raise
                        # Both scripts are safe to replay: a fault (a reset connection, a
                        # failover, a cluster client still learning its slots) is retried
                        # within ttl; a replayed acquire that finds its own lease answers the
                        # attempt it started.
                        fault = exc
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, ACQUIRE_RETRY_CAP)
        except TimeoutError as exc:
            raise TimeoutError(m.acquire_timeout_text(enrolled, fault)) from exc
        m.acquired(reply, sent_at)
        self._arm_expiry()
        # The per-kind index (docs/protocol.md), scored by this attempt's start: best effort,
        # like the metrics it serves (the running-jobs index above is what recovery needs).
        with tolerate_faults(
            lambda e: self._warn.warning("job %s: kind not indexed: %r", m.job_id, e)
        ):
            replies = await pipelined(
                self._redis,
                [
                    ("ZADD", m.schema.kind_index(m.kind), m.started_ms, m.job_id),
                    ("ZADD", m.schema.kinds(), m.index_score, m.kind),
                ],
            )
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply

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
        m = self._m
        plan = m.final_plan(
            crash=self._crash,
            exc=None if isinstance(exc, asyncio.CancelledError) else exc,
            cancelled=external_cancel or isinstance(exc, JobCancelled),
        )
        written: bool | None = None
        if plan.write:
            task = asyncio.ensure_future(self._final_write(plan.status, plan.error, plan.limit))
            try:
                written = await asyncio.shield(task)
            except asyncio.CancelledError:
                written = await task
                raise

        if self._crash is not None:
            raise self._crash
        if m.lease.lost is not None:
            raise LeaseLost(self.job_id, m.lease.lost) from (
                None if isinstance(exc, asyncio.CancelledError | JobCancelled) else exc
            )
        if written is False:
            message = (
                f"the final state {plan.status} of job {self.job_id!r} was not written to Redis"
            )
            if exc is None:
                raise StateNotWritten(message)
            exc.add_note(message)
        if external_cancel:
            return
        if m.cancel_requested and (exc is None or isinstance(exc, asyncio.CancelledError)):
            raise JobCancelled(f"job {self.job_id!r} was cancelled on request")

    async def _final_write(self, status: str, error: str, limit: float) -> bool:
        """Write the final state, retrying through Redis faults for up to ``limit`` seconds.

        Returns True when written (or already ended), False when it could not be written.
        """
        m = self._m
        deadline = self._clock() + limit
        delay = 0.05
        m.seq += 1
        await self._read_index_score(limit)
        while True:
            sample = self._ticker.sample() if self._ticker else None
            call = m.finish_call(status, error, sample, *self._reading())
            failure: list[BaseException] = []
            with tolerate_faults(failure.append):
                async with asyncio.timeout(max(deadline - self._clock(), 0.01)), self._slot():
                    code = await cancellable(calls.run(self._redis, call))
            if not failure:
                if m.finished(code):
                    await self._unindex()
                return True
            if self._clock() + delay >= deadline:
                log.error("job %s: final state %s not written: %r", self.job_id, status, failure[0])
                WORKER_STATS.final_writes_failed += 1
                return False
            self._warn.warning("job %s: final write failed, retrying: %r", self.job_id, failure[0])
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

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
        m = self._m
        with tolerate_faults(lambda _: None):  # the removal stays conditional on what we wrote
            async with asyncio.timeout(min(limit, m.cfg.ttl)), self._slot():
                m.index_read(await cancellable(self._redis.zscore(m.index_shard, m.job_id)))

    async def _unindex(self) -> None:
        """Drop the job from the running-jobs index (best effort: a sweeper drops entries of
        ended jobs it meets, so a failure here costs one wasted claim attempt, never a job)."""
        warn = self._warn.warning
        with tolerate_faults(
            lambda e: warn("job %s: not dropped from the index: %r", self.job_id, e)
        ):
            async with asyncio.timeout(self._m.cfg.ttl), self._slot():
                for call in self._m.unindex_calls():
                    await cancellable(calls.run(self._redis, call))

    def _slot(self) -> contextlib.AbstractAsyncContextManager[Any]:
        return self._ticker.slot() if self._ticker is not None else contextlib.nullcontext()

    def _reading(self) -> tuple[int, int | None]:
        cell = self.progress
        return cell.done, cell.total

    # -- the ticker's interface (synchronous, no I/O) --------------------------------------

    @property
    def machine(self) -> BeatMachine[asyncio.Future[None]]:
        return self._m

    def beat(self, now: float, lag: float, sample: ProcessSample) -> list[Any]:
        return self._m.next_beat(now, lag, sample, *self._reading())

    def beat_replied(self, sent_at: float, reply: BeatReply) -> None:
        verdict = self._m.replied(sent_at, reply, ended=self._ended)
        self._act(verdict)
        if not self._ended:
            self._plan()

    def beat_failed(
        self, sent_at: float, exc: BaseException, *, quiet: bool, at_once: bool
    ) -> None:
        if self._ended:
            self._m.beat_failed(sent_at, at_once=at_once, ended=True)
            return
        WORKER_STATS.beat_failures += 1
        self._m.beat_failed(sent_at, at_once=at_once, ended=False)
        self._plan()
        if not quiet:
            self._warn.warning("job %s: beat failed, retrying: %r", self.job_id, exc)

    def crashed(self, exc: BaseException) -> None:
        """An unexpected error in the ticker: stop the job and surface ``exc`` at exit."""
        if self._crash is None:
            self._crash = exc
            self._interrupt()

    def _act(self, verdict: ReplyVerdict[asyncio.Future[None]]) -> None:
        if verdict.late:
            WORKER_STATS.beats_late += 1
        if verdict.resolved is not None and not verdict.resolved.done():
            verdict.resolved.set_result(None)
        error = LeaseLost(self.job_id, self._m.lease.lost or LeaseLostCause.FENCED_OUT)
        for future in verdict.failed:
            _fail(future, error)
        if verdict.lost is not None:
            self._on_lost(verdict.lost)
        if verdict.cancel:
            self._interrupt()

    def _plan(self) -> None:
        if self._ticker is not None and not self._ended:
            self._ticker.schedule(self)

    def _arm_expiry(self) -> None:
        """A loop timer at the lease deadline, independent of the ticker and of every reply.

        It is not moved on each renewal: when it fires it re-arms itself at the (later) deadline
        if the lease was renewed meanwhile, so a job costs one timer per ``ttl``, not per beat.
        """
        delay = self._m.lease.deadline - self._clock()
        loop = asyncio.get_running_loop()
        self._expiry = loop.call_later(max(delay, 0.0), self._expiry_fired)

    def _expiry_fired(self) -> None:
        self._expiry = None
        if self._ended or not self._m.lease.held:
            return
        try:
            cause = self._m.expire_if_due(self._clock())
            if cause is None:
                self._arm_expiry()
                return
            self.lease_expired(cause)
        except Exception as exc:  # a bug (or a broken injected clock): never a silent death
            log.exception("job %s: lease timer failed; stopping the job", self.job_id)
            self.crashed(exc)

    def lease_expired(self, cause: LeaseLostCause) -> None:
        error = LeaseLost(self.job_id, cause)
        for future in self._m.drain_checkpoints():
            _fail(future, error)
        self._on_lost(cause)

    def _disarm_expiry(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    def _on_lost(self, cause: LeaseLostCause) -> None:
        WORKER_STATS.lost(cause.name.lower())
        log.warning("job %s: lease lost (%s); stopping the job", self.job_id, self._m.lease)
        self._interrupt()

    def _interrupt(self) -> None:
        self.progress._cancel()
        if self._in_body and self._host is not None and not self._host.done():
            self._host.cancel()
            self._our_cancels += 1

    def _raise_if_lost(self) -> None:
        if self._m.lease.lost is not None:
            raise LeaseLost(self.job_id, self._m.lease.lost)


def heartbeat(
    redis: AsyncClient,
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
    sidecar: bool = False,
    client_factory: ClientFactory | None = None,
) -> JobHeartbeat | AsyncSidecarHeartbeat:
    """Run a job under a heartbeat: ``async with heartbeat(redis, job_id) as hb: ...``.

    Entering takes the job's lease and writes its first snapshot and ``start`` entry (so the job
    is visible when the body starts). Exiting writes COMPLETED, FAILED (an exception, with
    ``error`` = ``"Type: message"``), CANCELLED (cancellation, or :func:`request_cancel`) or LOST,
    then releases the lease.

    Args:
        redis: a ``redis.asyncio.Redis`` or ``RedisCluster``.
        job_id: 1 to 200 characters of ``A-Z a-z 0-9 . _ - : /``.
        total: the number of items, or None when unknown (an int >= 0).
        interval: seconds between beats (> 0).
        ttl: lease and liveness time in seconds (>= 2 * interval).
        namespace: the key prefix.
        meta: JSON-serialisable data stored with the job (at most ``max_meta_bytes``).
        kind: a low-cardinality job kind (``""``: none), readable as ``JobStatus.kind``.
        worker: the worker's name (default ``host:pid``).
        stream_every: a plain ``beat`` stream entry at most every this many beats.
        maxlen: the events stream cap (``MAXLEN ~``).
        retention: seconds the snapshot and stream are kept after the end.
        max_meta_bytes: size limit of ``meta`` as JSON.
        max_details_bytes: size limit of checkpoint details as JSON.
        final_timeout: seconds the final write keeps retrying while Redis is unreachable.
        index_every: the running-jobs index entry is refreshed every this many beats.
        index_shards: shards of the running-jobs index (as the sweeper's).
        clock: a monotonic clock in seconds (a seam for tests; ``sidecar=False`` only).
        sidecar: send the job's beats from jobpulse's helper process instead of this event
            loop, so work that holds the GIL or blocks the loop cannot delay them
            (docs/worker.md, "The sidecar"). Default False: in-loop beats.
        client_factory: with ``sidecar=True``, a picklable function of no arguments, importable
            by module path, returning a ``redis.asyncio`` client for the same server: how the
            helper builds its client. Default: rebuilt from a plain ``redis.Redis``'s connection
            settings (TCP, TLS, Unix socket, ACL username and password); Sentinel and Cluster
            clients need one (TypeError before any Redis write otherwise).

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
    options = dict(
        total=total,
        interval=interval,
        ttl=ttl,
        namespace=namespace,
        meta=meta,
        kind=kind,
        worker=worker,
        stream_every=stream_every,
        maxlen=maxlen,
        retention=retention,
        max_meta_bytes=max_meta_bytes,
        max_details_bytes=max_details_bytes,
        final_timeout=final_timeout,
        index_every=index_every,
        index_shards=index_shards,
    )
    if sidecar:
        from .sidecar.job import AsyncSidecarHeartbeat

        return AsyncSidecarHeartbeat(
            redis, job_id, client_factory=client_factory, clock=clock, options=options
        )
    return JobHeartbeat(
        redis,
        job_id,
        total=total,
        interval=interval,
        ttl=ttl,
        namespace=namespace,
        meta=meta,
        kind=kind,
        worker=worker,
        stream_every=stream_every,
        maxlen=maxlen,
        retention=retention,
        max_meta_bytes=max_meta_bytes,
        max_details_bytes=max_details_bytes,
        final_timeout=final_timeout,
        index_every=index_every,
        index_shards=index_shards,
        clock=clock,
    )


def _fail(future: asyncio.Future[None], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
        future.exception()  # mark retrieved: a checkpoint nobody awaits any more is not an error
