"""``jobpulse.sync.heartbeat()`` and ``SyncHeartbeat``: the thread shell of a job's heartbeat.

The same :class:`~jobpulse._worker.machine.BeatMachine` as the asyncio shell decides everything;
this shell does blocking I/O in the body's thread (acquire, final write) and leaves the beats and
the lease deadline to the client's one :class:`~jobpulse._worker.thread_ticker.ThreadTicker`
thread. A sync body cannot be interrupted: it learns of a cancel request or a lost lease through
:meth:`SyncHeartbeat.check` or :attr:`SyncHeartbeat.cancelled` (and ``progress.check()``).

Every access to the machine holds the ticker's lock (the body's thread and the beat thread both
touch it); the body's side is a few assignments, never I/O under the lock.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable
from contextvars import Token
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .._protocol import calls
from .._protocol.calls import BeatReply
from .._protocol.clients import SyncClient
from .._protocol.errors import is_redis_fault, tolerate_faults
from .._protocol.ratelimit import RateLimitedLog
from .._protocol.rebuild import ClientFactory
from ..errors import JobCancelled, LeaseLost, LeaseLostCause, StateNotWritten
from .current import enter_current, leave_current
from .heartbeat import HeartbeatStatistics
from .machine import ACQUIRE_RETRY_CAP, ACQUIRE_RETRY_FIRST, BeatMachine
from .progress import ProgressCell
from .sampling import ProcessSample
from .stats import WORKER_STATS, notify
from .thread_ticker import ThreadTicker

if TYPE_CHECKING:
    from .sidecar.job import SidecarHeartbeat

__all__ = ["SyncHeartbeat", "heartbeat"]

log = logging.getLogger("jobpulse")

_Handle = concurrent.futures.Future[None]


class SyncHeartbeat:
    """The running job, as seen by a sync worker. Create it with :func:`jobpulse.sync.heartbeat`.

    Attributes:
        job_id: the job.
        progress: the job's :class:`~jobpulse.ProgressCell` (pass it to pool functions).
        kind: the job's kind (``""`` for none).
    """

    def __init__(
        self,
        redis: SyncClient,
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
        self._m: BeatMachine[_Handle] = BeatMachine(
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
        self._ticker: ThreadTicker | None = None
        self._entered = False
        self._in_body = False
        self._ended = False
        self._crash: BaseException | None = None
        self._current: Token[Any] | None = None

    # -- public API --------------------------------------------------------------------------

    @property
    def fence(self) -> int:
        """The fencing number of this attempt."""
        return self._m.fence

    @property
    def attempt(self) -> int:
        """1 for a first run, n + 1 for a run that took over a STALE or LOST job."""
        return self._m.attempt

    @property
    def resume_from(self) -> Any:
        """The last checkpoint details of the previous attempt (STALE or LOST), else None."""
        return self._m.resume_from

    @property
    def stage(self) -> str:
        return self._m.stage

    @property
    def lease_held(self) -> bool:
        """True while this worker holds the job's lease: not lost, and its deadline (by the
        local monotonic clock) not passed. A queue integration refreshes the queue's own claim
        only while this holds."""
        return self._m.lease.held_at(self._clock())

    @property
    def cancelled(self) -> bool:
        """True once the job must stop: a cancel was requested, or the lease is lost (also
        when its deadline passed while the beat thread waited on Redis)."""
        if self.progress.cancelled:
            return True
        return self._in_body and self._m.lease.deadline <= self._clock()

    def check(self) -> None:
        """Raise :class:`~jobpulse.JobCancelled` once the job must stop.

        A sync body cannot be interrupted: call this (or ``progress.check()``) between units of
        work. ``JobCancelled`` leaving the ``with`` block ends the job CANCELLED on a cancel
        request; on a lost lease the exit raises ``LeaseLost`` instead.
        """
        if self.cancelled:
            raise JobCancelled(f"job {self.job_id!r} must stop")

    def set_stage(self, name: str) -> None:
        """Name the current stage; the next beat records it (a ``stage`` stream entry).

        Raises:
            ValueError: ``name`` is empty, longer than 200 characters, or not printable.
        """
        with self._lock():
            changed = self._m.set_stage(name)
        if changed:
            notify("stage", self.job_id, self.kind, {"stage": name})

    def checkpoint(self, timeout: float | None = None, **details: Any) -> bool:
        """Send a beat now that records ``details`` (JSON) as a ``checkpoint`` stream entry.

        Blocks until the beat is written, or ``timeout`` seconds passed (default: ``ttl``);
        the checkpoint then stays queued and goes out with a later beat.

        Returns:
            True when written, False when the time ran out first.

        Raises:
            TypeError: the details are not JSON-serialisable.
            ValueError: the details are larger than ``max_details_bytes``.
            LeaseLost: the lease was lost before the checkpoint was written.
        """
        text = self._m.checkpoint_text(details)
        self._raise_if_lost()
        if not self._in_body:
            raise RuntimeError("checkpoint() is only allowed inside `with heartbeat(...)`")
        notify("checkpoint", self.job_id, self.kind, details)
        handle: _Handle = concurrent.futures.Future()
        with self._lock():
            self._m.add_checkpoint(text, handle, self._clock())
            self._plan()
        try:
            handle.result(self._m.cfg.ttl if timeout is None else timeout)
        except TimeoutError:
            return False
        return True

    def statistics(self) -> HeartbeatStatistics:
        """This heartbeat's counters."""
        return HeartbeatStatistics.of(self._m)

    def __repr__(self) -> str:
        return self._m.describe("SyncHeartbeat")

    # -- enter and exit ------------------------------------------------------------------------

    def __enter__(self) -> SyncHeartbeat:
        if self._entered:
            raise RuntimeError("a SyncHeartbeat can be entered only once")
        self._entered = True
        self._ticker = ThreadTicker.for_client(self._redis, self._clock)
        self.progress = ProgressCell(self._m.total)
        try:
            self._acquire()
        except BaseException:
            self.progress._unlink()
            raise
        self._in_body = True
        self._ticker.add(self)
        self._current = enter_current(self)
        return self

    def _acquire(self) -> None:
        """Index the job, then take its lease (see ``JobHeartbeat._acquire``: the same two
        replay-safe scripts; ``acquire.lua`` refuses a start that came too late)."""
        m = self._m
        sent_at = self._clock()
        enrolled = False
        give_up = sent_at + m.cfg.ttl
        delay = ACQUIRE_RETRY_FIRST
        while True:
            try:
                deadline = calls.run_sync(self._redis, m.enroll_call())
                enrolled = True
                reply = calls.run_sync(self._redis, m.acquire_call(deadline))
                break
            except Exception as exc:
                if not is_redis_fault(exc):
                    raise
                # both scripts are safe to replay: retried within ttl, as in the asyncio shell
                if self._clock() + delay >= give_up:
                    raise TimeoutError(m.acquire_timeout_text(enrolled, exc)) from exc
                time.sleep(delay)
                delay = min(delay * 2, ACQUIRE_RETRY_CAP)
        m.acquired(reply, sent_at)
        warn = self._warn.warning
        with tolerate_faults(lambda e: warn("job %s: kind not indexed: %r", m.job_id, e)):
            pipe = self._redis.pipeline(transaction=False)
            pipe.zadd(m.schema.kind_index(m.kind), {m.job_id: m.started_ms})
            pipe.zadd(m.schema.kinds(), {m.kind: m.index_score})
            pipe.execute()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._lock():
            self._in_body = False
            self._ended = True
            # a deadline that passed while the beat thread was blocked counts now
            cause = self._m.expire_if_due(self._clock())
            if cause is not None:
                self.lease_expired(cause)
        leave_current(self._current)
        self._current = None
        if self._ticker is not None:
            self._ticker.remove(self)
        try:
            self._finish(exc)
        finally:
            self.progress._cancel()
            self.progress._unlink()

    def _finish(self, exc: BaseException | None) -> None:
        m = self._m
        with self._lock():
            plan = m.final_plan(
                crash=self._crash,
                exc=exc,
                cancelled=isinstance(exc, JobCancelled),
            )
        written = self._final_write(plan.status, plan.error, plan.limit) if plan.write else None
        if self._crash is not None:
            raise self._crash
        if m.lease.lost is not None:
            raise LeaseLost(self.job_id, m.lease.lost) from (
                None if isinstance(exc, JobCancelled) else exc
            )
        if written is False:
            message = f"the final state {plan.status} of job {self.job_id!r} was not written"
            if exc is None:
                raise StateNotWritten(message)
            exc.add_note(message)
        if m.cancel_requested and exc is None:
            raise JobCancelled(f"job {self.job_id!r} was cancelled on request")

    def _final_write(self, status: str, error: str, limit: float) -> bool:
        """Write the final state, retrying through Redis faults for up to ``limit`` seconds."""
        m = self._m
        deadline = self._clock() + limit
        delay = 0.05
        m.seq += 1
        with tolerate_faults(lambda _: None):  # the removal stays conditional on what we wrote
            m.index_read(self._redis.zscore(m.index_shard, m.job_id))
        while True:
            sample = self._ticker.sample() if self._ticker else None
            call = m.finish_call(status, error, sample, self.progress.done, self.progress.total)
            failure: list[BaseException] = []
            with tolerate_faults(failure.append):
                code = calls.run_sync(self._redis, call)
            if not failure:
                if m.finished(code):
                    self._unindex()
                return True
            if self._clock() + delay >= deadline:
                log.error("job %s: final state %s not written: %r", self.job_id, status, failure[0])
                WORKER_STATS.final_writes_failed += 1
                return False
            self._warn.warning("job %s: final write failed, retrying: %r", self.job_id, failure[0])
            time.sleep(delay)
            delay = min(delay * 2, 2.0)

    def _unindex(self) -> None:
        warn = self._warn.warning
        with tolerate_faults(
            lambda e: warn("job %s: not dropped from the index: %r", self.job_id, e)
        ):
            for call in self._m.unindex_calls():
                calls.run_sync(self._redis, call)

    def _lock(self) -> Any:
        assert self._ticker is not None
        return self._ticker.lock

    def _plan(self) -> None:
        if self._ticker is not None and not self._ended:
            self._ticker.schedule(self)

    def _raise_if_lost(self) -> None:
        if self._m.lease.lost is not None:
            raise LeaseLost(self.job_id, self._m.lease.lost)

    # -- the beat thread's interface (under the ticker's lock, no I/O) -------------------------

    @property
    def machine(self) -> BeatMachine[_Handle]:
        return self._m

    def beat(self, now: float, lag: float, sample: ProcessSample) -> list[Any]:
        return self._m.next_beat(now, lag, sample, self.progress.done, self.progress.total)

    def beat_replied(self, sent_at: float, reply: BeatReply) -> None:
        verdict = self._m.replied(sent_at, reply, ended=self._ended)
        if verdict.late:
            WORKER_STATS.beats_late += 1
        if verdict.resolved is not None:
            _settle(verdict.resolved, None)
        error = LeaseLost(self.job_id, self._m.lease.lost or LeaseLostCause.FENCED_OUT)
        for handle in verdict.failed:
            _settle(handle, error)
        if verdict.lost is not None:
            self._on_lost(verdict.lost)
        if verdict.cancel:
            self.progress._cancel()
        self._plan()

    def beat_failed(
        self, sent_at: float, exc: BaseException, *, quiet: bool, at_once: bool
    ) -> None:
        if not self._ended:
            WORKER_STATS.beat_failures += 1
        self._m.beat_failed(sent_at, at_once=at_once, ended=self._ended)
        self._plan()
        if not quiet and not self._ended:
            self._warn.warning("job %s: beat failed, retrying: %r", self.job_id, exc)

    def crashed(self, exc: BaseException) -> None:
        if self._crash is None:
            self._crash = exc
            self.progress._cancel()

    def lease_expired(self, cause: LeaseLostCause) -> None:
        error = LeaseLost(self.job_id, cause)
        for handle in self._m.drain_checkpoints():
            _settle(handle, error)
        self._on_lost(cause)

    def _on_lost(self, cause: LeaseLostCause) -> None:
        WORKER_STATS.lost(cause.name.lower())
        log.warning("job %s: lease lost (%s); the body must stop", self.job_id, self._m.lease)
        self.progress._cancel()


def _settle(handle: _Handle, error: BaseException | None) -> None:
    if handle.done():
        return
    if error is None:
        handle.set_result(None)
    else:
        handle.set_exception(error)


def heartbeat(
    redis: SyncClient,
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
    sidecar: bool = True,
    client_factory: ClientFactory | None = None,
) -> SyncHeartbeat | SidecarHeartbeat:
    """Run a job under a heartbeat from sync code: ``with heartbeat(client, job_id) as hb: ...``.

    The same protocol and exit rules as :func:`jobpulse.heartbeat`: entering takes the lease and
    writes the first snapshot; exiting writes COMPLETED, FAILED (an exception), CANCELLED
    (``JobCancelled`` from :meth:`SyncHeartbeat.check` after a cancel request) or LOST. Beats of
    every job on ``redis`` go out from one background thread, which also keeps the lease
    deadlines. The body is never interrupted: it learns of a cancel or a lost lease through
    ``check()`` / ``cancelled``.

    Args:
        redis: a ``redis.Redis`` or ``redis.cluster.RedisCluster`` (give it a ``socket_timeout``
            below ``ttl``: a blocking pipeline is bounded by it).
        job_id: 1 to 200 characters of ``A-Z a-z 0-9 . _ - : /``.
        total: the number of items, or None when unknown (an int >= 0).
        interval: seconds between beats (> 0).
        ttl: lease and liveness time in seconds (>= 2 * interval).
        namespace: the key prefix.
        meta: JSON-serialisable data stored with the job (at most ``max_meta_bytes``).
        kind: a low-cardinality job kind (``""``: none).
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
        sidecar: send the job's beats from jobpulse's helper process instead of a thread of
            this process, so work that holds the GIL cannot delay them (docs/sync.md). Default
            True; ``sidecar=False`` beats from a thread of this process.
        client_factory: with ``sidecar=True``, a picklable function of no arguments, importable
            by module path, returning a ``redis.asyncio`` client for the same server: how the
            helper builds its client. Default: rebuilt from a plain ``redis.Redis``'s connection
            settings (TCP, TLS, Unix socket, ACL username and password); Sentinel and Cluster
            clients need one (TypeError before any Redis write otherwise).

    Raises:
        InvalidJobId: the job id or namespace is invalid (before any Redis command).
        ValueError, TypeError: an option is out of range (before any Redis command).
        JobBusy: another live worker holds the job.
        LeaseLost: (on exit) the lease was lost.
        JobCancelled: (on exit) the job was cancelled on request and the body ended normally.
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
        from .sidecar.job import SidecarHeartbeat

        return SidecarHeartbeat(
            redis, job_id, client_factory=client_factory, clock=clock, options=options
        )
    return SyncHeartbeat(
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
