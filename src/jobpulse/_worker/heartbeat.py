"""``heartbeat()`` and ``JobHeartbeat``: the asyncio shell of a job's heartbeat.

Every decision (what a beat carries, what a reply means, which final state, what the exit
raises) is the pure :class:`~jobpulse._worker.machine.BeatMachine`'s, and entering and the final
write are the step sequences of :mod:`~jobpulse._worker.life`; this shell drives them
(``_drive``: awaits, sends, sleeps) and keeps the timers. Beats
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
from contextvars import Token
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar, Unpack, cast

from .._protocol import calls
from .._protocol.calls import BeatReply
from .._protocol.clients import AsyncClient
from .._protocol.cluster import pipelined
from .._protocol.deadline import cancellable
from .._protocol.ratelimit import RateLimitedLog
from ..errors import LeaseLost, LeaseLostCause
from .current import enter_current, leave_current
from .lease import Lease
from .life import Command, Send, Sleep, Steps, acquire_steps, final_steps
from .machine import BeatMachine, ReplyVerdict
from .options import HeartbeatOptions, HeartbeatSpec
from .progress import ProgressCell
from .sampling import ProcessSample
from .stats import WORKER_STATS, notify
from .ticker import Ticker

__all__ = ["HeartbeatStatistics", "JobHeartbeat", "heartbeat"]

log = logging.getLogger("jobpulse")
R = TypeVar("R")


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

    def __init__(self, redis: AsyncClient, job_id: str, spec: HeartbeatSpec) -> None:
        """Private: use the factory, which prepares ``spec`` from its keyword options."""
        self._m: BeatMachine[asyncio.Future[None]] = BeatMachine(job_id, spec)
        self.job_id = self._m.job_id
        self.kind = self._m.kind
        self._redis: Any = redis
        self._clock = clock = spec.clock
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
            await self._drive(acquire_steps(self._m, self._clock, self._warn.warning))
            self._arm_expiry(self._m.lease.deadline)
        except BaseException:
            self.progress._unlink()
            raise
        ticker.add(self)
        self._in_body = True
        self._current = enter_current(self)
        return self

    async def _drive(self, steps: Steps[R]) -> R:
        """Run a sequence of :mod:`~jobpulse._worker.life` on this shell's client: the asyncio
        driver (each call bounded by its step's timeout and holding one of the ticker's
        connection slots; a sleep holds none)."""
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                step = steps.send(reply) if error is None else steps.throw(error)
            except StopIteration as stop:
                return cast(R, stop.value)
            reply, error = None, None
            try:
                if isinstance(step, Sleep):
                    await asyncio.sleep(step.seconds)
                    continue
                async with asyncio.timeout(step.timeout), self._slot():
                    if isinstance(step, Send):
                        reply = await cancellable(calls.run(self._redis, step.call))
                    elif isinstance(step, Command):
                        reply = await cancellable(self._redis.execute_command(*step.args))
                    else:
                        reply = await cancellable(pipelined(self._redis, step.commands))
            except Exception as exc:
                error = exc

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
        interrupted = isinstance(exc, asyncio.CancelledError)
        plan = m.end_plan(
            crash=self._crash, exc=exc, interrupted=interrupted, external_cancel=external_cancel
        )
        written: bool | None = None
        if plan.write:
            steps = final_steps(m, plan, self._clock, self._warn.warning, self._reading)
            task = asyncio.ensure_future(self._drive(steps))
            try:
                written = await asyncio.shield(task)
            except asyncio.CancelledError:
                written = await task
                raise
        verdict = m.exit_verdict(
            crash=self._crash,
            exc=exc,
            interrupted=interrupted,
            external_cancel=external_cancel,
            status=plan.status,
            written=written,
        )
        if verdict.note is not None and exc is not None:
            exc.add_note(verdict.note)
        if verdict.error is not None:
            raise verdict.error

    def _slot(self) -> contextlib.AbstractAsyncContextManager[Any]:
        return self._ticker.slot() if self._ticker is not None else contextlib.nullcontext()

    def _reading(self) -> tuple[ProcessSample | None, int, int | None]:
        cell = self.progress
        return (self._ticker.sample() if self._ticker else None), cell.done, cell.total

    # -- the ticker's interface (synchronous, no I/O) --------------------------------------

    @property
    def machine(self) -> BeatMachine[asyncio.Future[None]]:
        return self._m

    def beat(self, now: float, lag: float, sample: ProcessSample) -> list[Any]:
        return self._m.next_beat(now, lag, sample, self.progress.done, self.progress.total)

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
        cause = self._m.beat_failed(sent_at, at_once=at_once, ended=False)
        if cause is not None:
            self.lease_expired(cause)
            return
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

    def _arm_expiry(self, when: float) -> None:
        """A loop timer at ``when`` (first the lease deadline), independent of the ticker and of
        every reply. It is not moved on each renewal: when it fires, the machine's expiry rule
        (:meth:`BeatMachine.check_expiry`) says when to look again, so a job costs one timer
        per ``ttl``, not per beat."""
        loop = asyncio.get_running_loop()
        self._expiry = loop.call_later(max(when - self._clock(), 0.0), self._expiry_fired)

    def _expiry_fired(self) -> None:
        self._expiry = None
        if self._ended:
            return
        try:
            expiry = self._m.check_expiry(self._clock())
            if expiry.cause is not None:
                self.lease_expired(expiry.cause)
                return
            if expiry.beat_now:
                self._plan()
            if expiry.recheck_at != float("inf"):
                self._arm_expiry(expiry.recheck_at)
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


def heartbeat(redis: AsyncClient, job_id: str, **options: Unpack[HeartbeatOptions]) -> JobHeartbeat:
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
        clock: a monotonic clock in seconds (a seam for tests).

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
    return JobHeartbeat(redis, job_id, HeartbeatSpec(**options))


def _fail(future: asyncio.Future[None], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
        future.exception()  # mark retrieved: a checkpoint nobody awaits any more is not an error
