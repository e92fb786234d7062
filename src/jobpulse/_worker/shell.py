"""What every shell of a heartbeat shares: the public views of the machine and the narrow
interface its ticker talks to (``Beating``: ``beat``, ``beat_replied``, ``beat_failed``,
``crashed``, ``lease_expired``). No I/O and no timers: a shell (``JobHeartbeat``,
``SyncHeartbeat``) adds how it interrupts its body, how it settles a checkpoint handle, its lock,
and its drivers of the step sequences of :mod:`~jobpulse._worker.life`.
"""

from __future__ import annotations

import contextlib
import logging
from contextvars import Token
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from .._protocol.calls import BeatReply
from .._protocol.ratelimit import RateLimitedLog
from ..errors import JobCancelled, LeaseLost, LeaseLostCause
from .lease import Lease
from .machine import BeatMachine, ReplyVerdict
from .options import HeartbeatSpec
from .progress import ProgressCell
from .sampling import ProcessSample
from .stats import WORKER_STATS, notify

__all__ = ["HeartbeatStatistics", "Shell"]

log = logging.getLogger("jobpulse")


class Handle(Protocol):
    """A checkpoint's handle: an ``asyncio.Future`` or a ``concurrent.futures.Future``."""

    def done(self) -> bool: ...
    def set_result(self, result: None, /) -> None: ...
    def set_exception(self, exception: BaseException, /) -> None: ...
    def exception(self) -> BaseException | None: ...


H = TypeVar("H", bound=Handle)


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


class Shell(Generic[H]):
    """The shared part of a heartbeat shell (``H``: its checkpoint handle type)."""

    progress: ProgressCell
    _ticker: Any  # the shell's ticker, once entered

    def __init__(self, redis: Any, job_id: str, spec: HeartbeatSpec) -> None:
        self._m: BeatMachine[H] = BeatMachine(job_id, spec)
        # the ticker's view of the machine: a plain attribute, read several times per beat
        self.machine: BeatMachine[H] = self._m
        self.job_id = self._m.job_id
        self.kind = self._m.kind
        self._redis: Any = redis
        self._clock = spec.clock
        self._warn = RateLimitedLog(log, spec.clock)
        self._ticker = None
        self._in_body = False
        self._ended = False  # set at exit: late beat replies are ignored from then on
        self._crash: BaseException | None = None
        self._current: Token[Any] | None = None

    # -- what the shell adds ---------------------------------------------------------------------

    def _interrupt(self) -> None:
        """Stop the body (a cancel request, a lost lease, a crash)."""
        raise NotImplementedError

    @staticmethod
    def _settle(handle: H, error: BaseException | None) -> None:
        """Resolve a checkpoint handle (``error`` None) or fail it, if not done yet."""
        if handle.done():
            return
        if error is None:
            handle.set_result(None)
        else:
            handle.set_exception(error)
            handle.exception()  # retrieved: a checkpoint nobody awaits any more is no error

    def _lock(self) -> contextlib.AbstractContextManager[Any]:
        """What guards the machine against the ticker (none on the event loop)."""
        return contextlib.nullcontext()

    # -- public API --------------------------------------------------------------------------

    @property
    def fence(self) -> int:
        """The fencing number of this attempt (grows across attempts of a job id)."""
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
        """The current stage (``""`` before the first :meth:`set_stage`)."""
        return self._m.stage

    @property
    def lease_held(self) -> bool:
        """True while this worker holds the job's lease: not lost, and its deadline (by the
        local monotonic clock) not passed. A queue integration refreshes the queue's own claim
        only while this holds."""
        return self._m.lease.held_at(self._clock())

    @property
    def cancelled(self) -> bool:
        """True once the job must stop: a cancel was requested, the lease is lost, or the job
        ended. Also as soon as the lease's deadline passed although a beat was sent in time
        (Redis did not answer), before the lease timer or a blocked beat thread says so; a
        deadline passed with no beat sent is a late worker, whose next beat takes the lease
        back if nobody claimed it."""
        if self.progress.cancelled:
            return True
        return self._in_body and self._m.lease.overdue(self._clock())

    def check(self) -> None:
        """Raise :class:`~jobpulse.JobCancelled` once the job must stop (:attr:`cancelled`).

        The asyncio shell also cancels its body; a sync body cannot be interrupted and must
        call this (or ``progress.check()``) between units of work. ``JobCancelled`` leaving the
        block ends the job CANCELLED on a cancel request; on a lost lease the exit raises
        ``LeaseLost`` instead.
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

    def statistics(self) -> HeartbeatStatistics:
        """This heartbeat's counters."""
        return HeartbeatStatistics.of(self._m)

    def __repr__(self) -> str:
        return self._m.describe(type(self).__name__)

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

    # -- shared steps of the shells ------------------------------------------------------------

    def _checkpoint_text(self, details: dict[str, Any]) -> str:
        """The checks of ``checkpoint()`` before it queues anything; the details as JSON."""
        text = self._m.checkpoint_text(details)
        self._raise_if_lost()
        if not self._in_body:
            raise RuntimeError("checkpoint() is only allowed inside the heartbeat's block")
        notify("checkpoint", self.job_id, self.kind, details)
        return text

    def _raise_if_lost(self) -> None:
        if self._m.lease.lost is not None:
            raise LeaseLost(self.job_id, self._m.lease.lost)

    def _reading(self) -> tuple[ProcessSample | None, int, int | None]:
        cell = self.progress
        return (self._ticker.sample() if self._ticker else None), cell.done, cell.total

    def _plan(self) -> None:
        if self._ticker is not None and not self._ended:
            self._ticker.schedule(self)

    # -- the ticker's interface (synchronous, no I/O; the thread ticker holds the lock) --------

    def beat(self, now: float, lag: float, sample: ProcessSample) -> list[Any]:
        return self._m.next_beat(now, lag, sample, self.progress.done, self.progress.total)

    def beat_replied(self, sent_at: float, reply: BeatReply) -> None:
        verdict: ReplyVerdict[H] = self._m.replied(sent_at, reply, ended=self._ended)
        if verdict.late:
            WORKER_STATS.beats_late += 1
        if verdict.resolved is not None:
            self._settle(verdict.resolved, None)
        if verdict.failed:  # not one exception built per beat: only when a waiter fails
            error = LeaseLost(self.job_id, self._m.lease.lost or LeaseLostCause.FENCED_OUT)
            for handle in verdict.failed:
                self._settle(handle, error)
        if verdict.lost is not None:
            self._on_lost(verdict.lost)
        if verdict.cancel:
            self._interrupt()
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

    def lease_expired(self, cause: LeaseLostCause) -> None:
        """The machine lost the lease by its expiry rule: fail the queued checkpoints, stop."""
        error = LeaseLost(self.job_id, cause)
        for handle in self._m.drain_checkpoints():
            self._settle(handle, error)
        self._on_lost(cause)

    def _on_lost(self, cause: LeaseLostCause) -> None:
        WORKER_STATS.lost(cause.name.lower())
        log.warning("job %s: lease lost (%s); stopping the job", self.job_id, self._m.lease)
        self._interrupt()
