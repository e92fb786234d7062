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
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Unpack, overload

from .._protocol import calls
from .._protocol.clients import AsyncClient
from .._protocol.cluster import pipelined
from .._protocol.deadline import cancellable
from .._protocol.rebuild import ClientFactory
from .current import enter_current, leave_current
from .life import Command, Send, Sleep, Stepper, Steps, acquire_steps, final_steps
from .options import HeartbeatOptions, HeartbeatSpec
from .progress import ProgressCell
from .shell import HeartbeatStatistics, Shell
from .ticker import Ticker

if TYPE_CHECKING:
    from .sidecar.job import AsyncSidecarHeartbeat

__all__ = ["HeartbeatStatistics", "JobHeartbeat", "heartbeat"]

log = logging.getLogger("jobpulse")
R = TypeVar("R")


class JobHeartbeat(Shell["asyncio.Future[None]"]):
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
        """Private: use :func:`heartbeat`, which prepares ``spec`` from its keyword options."""
        super().__init__(redis, job_id, spec)
        self._expiry: asyncio.TimerHandle | None = None
        self._ticker: Ticker | None = None
        self._host: asyncio.Task[Any] | None = None
        self._our_cancels = 0

    # -- public API --------------------------------------------------------------------------

    async def checkpoint(self, **details: Any) -> None:
        """Force a beat now that records ``details`` (JSON) as a ``checkpoint`` stream entry.

        The details are also kept as the job's last checkpoint: an attempt that takes over after
        this one went STALE or LOST gets them as ``resume_from``. Returns once written.

        Raises:
            TypeError: the details are not JSON-serialisable.
            ValueError: the details are larger than ``max_details_bytes``.
            LeaseLost: the lease was lost before the checkpoint was written.
        """
        text = self._checkpoint_text(details)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._m.add_checkpoint(text, future, self._clock())
        self._plan()
        await future

    # -- enter and exit ------------------------------------------------------------------------

    async def __aenter__(self) -> JobHeartbeat:
        if self._host is not None:
            raise RuntimeError("a JobHeartbeat can be entered only once")
        self._host = asyncio.current_task()
        self._ticker = ticker = Ticker.for_client(self._redis, self._clock)
        self.progress = ProgressCell(self._m.total)
        try:
            async with ticker.entering():  # a burst waits here, before anything is written
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
        driver (each call holding one of the ticker's connection slots, and bounded by its
        step's timeout from the moment it holds it; a sleep holds none)."""
        run = Stepper(steps)
        while (step := run.next()) is not None:
            try:
                if isinstance(step, Sleep):
                    await asyncio.sleep(step.seconds)
                    continue
                # the step's time starts once it holds a connection: it bounds Redis's
                # answer, not the local queue (bounded by the gate: beats first, then FIFO)
                async with self._slot(), asyncio.timeout(step.timeout):
                    if isinstance(step, Send):
                        run.reply(await cancellable(calls.run(self._redis, step.call)))
                    elif isinstance(step, Command):
                        run.reply(await cancellable(self._redis.execute_command(*step.args)))
                    else:
                        run.reply(await cancellable(pipelined(self._redis, step.commands)))
            except Exception as exc:
                run.fail(exc)
        return run.result

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
        end = self._m.ending(
            crash=self._crash,
            exc=exc,
            interrupted=isinstance(exc, asyncio.CancelledError),
            external_cancel=external_cancel,
        )
        written: bool | None = None
        if end.plan.write:
            steps = final_steps(self._m, end.plan, self._clock, self._warn.warning, self._reading)
            task = asyncio.ensure_future(self._drive(steps))
            try:
                written = await asyncio.shield(task)
            except asyncio.CancelledError:
                written = await task
                raise
        end.leave(written)

    def _slot(self) -> contextlib.AbstractAsyncContextManager[Any]:
        return self._ticker.slot() if self._ticker is not None else contextlib.nullcontext()

    # -- what this shell adds to the shared one -----------------------------------------------

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

    def _disarm_expiry(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    def _interrupt(self) -> None:
        self.progress._cancel()
        if self._in_body and self._host is not None and not self._host.done():
            self._host.cancel()
            self._our_cancels += 1


@overload
def heartbeat(
    redis: AsyncClient,
    job_id: str,
    *,
    sidecar: Literal[False] = False,
    client_factory: ClientFactory | None = None,
    **options: Unpack[HeartbeatOptions],
) -> JobHeartbeat: ...


@overload
def heartbeat(
    redis: AsyncClient,
    job_id: str,
    *,
    sidecar: Literal[True],
    client_factory: ClientFactory | None = None,
    **options: Unpack[HeartbeatOptions],
) -> AsyncSidecarHeartbeat: ...


@overload
def heartbeat(
    redis: AsyncClient,
    job_id: str,
    *,
    sidecar: bool,
    client_factory: ClientFactory | None = None,
    **options: Unpack[HeartbeatOptions],
) -> JobHeartbeat | AsyncSidecarHeartbeat: ...


def heartbeat(
    redis: AsyncClient,
    job_id: str,
    *,
    sidecar: bool = False,
    client_factory: ClientFactory | None = None,
    **options: Unpack[HeartbeatOptions],
) -> JobHeartbeat | AsyncSidecarHeartbeat:
    """Run a job under a heartbeat: ``async with heartbeat(redis, job_id) as hb: ...``.

    Entering takes the job's lease and writes its first snapshot and ``start`` entry (so the job
    is visible when the body starts). When many jobs enter at once on one client, entering first
    waits for its turn, writing nothing (the running jobs' beats go first: docs/worker.md).
    Exiting writes COMPLETED, FAILED (an exception, with ``error`` = ``"Type: message"``),
    CANCELLED (cancellation, or :func:`request_cancel`) or LOST, then releases the lease.

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
            helper builds its client. Default: rebuilt from a plain client's connection
            settings (TCP, TLS, Unix socket, ACL username and password); Sentinel and Cluster
            clients need one (``TypeError`` before any Redis write otherwise).

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
        LeaseLost: (on exit) the lease was lost; the job was stopped. With ``sidecar=True``
            also on enter, cause ``SIDECAR_DIED``: the helper process died while the job
            started (a job it did start goes stale and a sweeper marks it LOST).
        JobCancelled: (on exit) the job was cancelled on request.
    """
    spec = HeartbeatSpec(**options)
    if sidecar:
        from .sidecar.job import AsyncSidecarHeartbeat

        return AsyncSidecarHeartbeat(redis, job_id, spec, client_factory=client_factory)
    return JobHeartbeat(redis, job_id, spec)
