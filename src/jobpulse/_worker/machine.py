"""The beat state machine: every decision of a job's heartbeat, with no I/O, no clock and no
threads or event loop of its own. The asyncio shell (``heartbeat.py`` + ``ticker.py``) and the
thread shell (``jobpulse.sync``) pass in times, progress readings and decoded replies, and act on
what it returns; a fix here holds for both.

Checkpoint handles are opaque (an ``asyncio.Future`` in one shell, a ``concurrent.futures.Future``
in the other): the machine hands back the handles to resolve or to fail, the shell resolves them.

Invariants:
  * at most one beat is in flight; ``seq`` grows by one per beat built;
  * once the lease is lost nothing but the LOST record after an EXPIRED loss is written
    (``final_plan`` says so), and ``finish.lua`` accepts it only if nobody claimed the job;
  * a checkpoint or stage change of a beat that failed is sent again with the next one.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections import deque
from dataclasses import dataclass, field, fields
from typing import Any, Generic, TypeVar

from .._protocol import calls, wire
from .._protocol.calls import AcquireCode, AcquireReply, BeatCode, BeatReply, FinishCode
from .._protocol.codec import dump_json, fmt_float, fmt_int, load_json
from .._protocol.keys import KeySchema, check_job_id
from ..errors import JobBusy, JobCancelled, LeaseLost, LeaseLostCause, StateNotWritten
from .config import MAX_ERROR_CHARS, HeartbeatConfig, check_kind, check_stage, check_total
from .lease import Lease
from .options import HeartbeatSpec
from .retry import retry_after
from .sampling import ProcessSample, RateWindow

__all__ = [
    "BeatMachine",
    "Ending",
    "ExitVerdict",
    "Expiry",
    "FinalPlan",
    "ReplyVerdict",
    "error_text",
]

H = TypeVar("H")

_ALL = range(len(calls.BEAT_FIELDS))

_LOST_CAUSE = {BeatCode.TAKEN_OVER: LeaseLostCause.TAKEN_OVER}
_FINISH_LOST = {FinishCode.TAKEN_OVER: LeaseLostCause.TAKEN_OVER}


@dataclass(slots=True)
class ReplyVerdict(Generic[H]):
    """What a beat reply means for the shell.

    Attributes:
        resolved: the checkpoint handle the beat wrote (resolve it), else None.
        failed: checkpoint handles to fail with ``LeaseLost`` (the lease is gone).
        lost: the cause, when this reply lost the lease (stop the body).
        cancel: True when this reply is the first to carry a cancel request (stop the body).
        late: the beat was sent more than an interval late.
    """

    resolved: H | None = None
    failed: list[H] = field(default_factory=list)
    lost: LeaseLostCause | None = None
    cancel: bool = False
    late: bool = False


@dataclass(frozen=True, slots=True)
class Expiry:
    """What the lease timer does (:meth:`BeatMachine.check_expiry`).

    Attributes:
        cause: EXPIRED when this check lost the lease (stop the body), else None.
        beat_now: the worker was late and its next beat is now due earlier (plan it again).
        recheck_at: when to check again (``inf``: never, the lease is lost).
    """

    cause: LeaseLostCause | None
    beat_now: bool
    recheck_at: float


@dataclass(frozen=True, slots=True)
class ExitVerdict:
    """What leaving a heartbeat's ``with`` block does (:meth:`BeatMachine.exit_verdict`).

    Attributes:
        error: the exception to raise (its ``__cause__`` set), else None: the body's own
            exception, if any, propagates unchanged.
        note: a note to add to the body's own exception, else None.
    """

    error: BaseException | None
    note: str | None


@dataclass(frozen=True, slots=True)
class Ending:
    """The end of a job (:meth:`BeatMachine.ending`): ``plan``, then :meth:`leave`."""

    machine: BeatMachine[Any]
    plan: FinalPlan
    crash: BaseException | None
    exc: BaseException | None
    interrupted: bool
    external_cancel: bool

    def leave(self, written: bool | None) -> None:
        """Raise what leaving the block must raise after the final write (``written``: its
        outcome, None when nothing was to be written); else return, and the body's own
        exception, if any, propagates unchanged (with a note when its end was not written)."""
        verdict = self.machine.exit_verdict(
            crash=self.crash,
            exc=self.exc,
            interrupted=self.interrupted,
            external_cancel=self.external_cancel,
            status=self.plan.status,
            written=written,
        )
        if verdict.note is not None and self.exc is not None:
            self.exc.add_note(verdict.note)
        if verdict.error is not None:
            raise verdict.error


@dataclass(frozen=True, slots=True)
class FinalPlan:
    """Which final state to write and how (``write`` False: the lease was fenced or taken
    over, so nothing is written)."""

    status: str
    error: str
    write: bool
    limit: float  # seconds the final write may keep retrying


class BeatMachine(Generic[H]):
    """The state of one job's heartbeat. Every argument is checked here, before any I/O."""

    def __init__(self, job_id: str, spec: HeartbeatSpec) -> None:
        self.job_id = check_job_id(job_id)
        self.schema = KeySchema(spec.namespace, spec.index_shards)
        self.keys = self.schema.job(job_id).all()
        self.index_shard = self.schema.index_for(job_id)  # the running-index shard of the job
        # the checked timing and size options: the spec's fields of the same names
        self.cfg = HeartbeatConfig(
            **{f.name: getattr(spec, f.name) for f in fields(HeartbeatConfig)}
        )
        total, meta, kind, worker = spec.total, spec.meta, spec.kind, spec.worker
        self.total = check_total(total)
        self.meta = "" if meta is None else dump_json(meta, limit=spec.max_meta_bytes, name="meta")
        self.kind = check_kind(kind)
        self.worker = worker if worker is not None else f"{socket.gethostname()}:{os.getpid()}"
        if not isinstance(self.worker, str) or not 1 <= len(self.worker) <= 200:
            raise ValueError("worker must be a str of 1 to 200 characters")
        self.token = secrets.token_hex(6)  # 48 random bits: together with the fence, unique

        self.fence = 0
        self.attempt = 0
        self.resume_from: Any = None
        self.lease = Lease(self.cfg.ttl, float("-inf"), LeaseLostCause.EXPIRED)
        self.seq = 0
        # the highest seq this worker knows the snapshot holds (the acquire's, then each beat
        # answered written): a beat sends it, and beat.lua answers 3 when the snapshot is
        # behind it (a restart or failover lost writes that landed)
        self.landed = 0
        self.started_ms = 0
        self.index_score = 0  # the latest index deadline this worker wrote or read (server ms)
        self.stage = ""
        self.cancel_requested = False
        self.due = 0.0  # when the next beat is due (the shell's clock)
        self.beats = 0
        self.written = 0
        self.failed = 0
        self._stage_changed = False
        self._checkpoints: deque[tuple[str, H]] = deque()
        self._last_checkpoint = ""
        self._inflight: tuple[str, tuple[str, H] | None] | None = None
        # (seq, checkpoint) of a checkpoint beat that failed: its resend reuses the seq, so if
        # the first send ran after all (its reply lost), beat.lua answers the resend as a
        # replay and the checkpoint is recorded once
        self._replay: tuple[int, tuple[str, H]] | None = None
        self.beat_head: tuple[bytes, ...] = ()  # token, fence, ttl_ms: a segment's 2nd-4th
        # the keys of the beat being built: state and alive, plus events with a stream entry,
        # or every key (``_every_key``) after beat.lua answered RESEND_KEYS
        self.beat_keys: tuple[bytes, ...] = ()
        self._keys: tuple[bytes, ...] = ()  # every key, in beat.lua's order
        self._every_key = False
        self._same_seq = False  # the next beat reuses the seq (a resend with every key)
        # the dynamic values the snapshot is known to hold (None: unknown, sent next beat) and
        # (values, indexes sent, seq reused) of the beat in flight
        self._known: list[str | None] = [None] * len(_ALL)
        self._sent: tuple[list[str], list[int], bool] | None = None
        self._resend_static = False
        self._last_event_beat = 0
        self._rate = RateWindow()
        # done, its text, rate, its text, eta, its text (see ``_dynamic``)
        self._memo: list[Any] = [-1, "", None, "", None, ""]

    # -- acquire ------------------------------------------------------------------------------

    def enroll_call(self) -> calls.Call[int]:
        return calls.enroll(self.index_shard, self.job_id, int(self.cfg.index_horizon * 1000))

    def acquire_call(self, deadline_ms: int) -> calls.Call[AcquireReply]:
        """The acquire, after ``enroll`` answered ``deadline_ms``: the sweeper may drop the entry
        from then on (if the job is not RUNNING by then), so start no later, with a margin for
        skew between nodes."""
        self.index_score = deadline_ms
        horizon_ms = int(self.cfg.index_horizon * 1000)
        latest = deadline_ms - min(self.cfg.ttl_ms, horizon_ms // 4)
        return calls.acquire(
            self.keys,
            token=self.token,
            ttl_ms=self.cfg.ttl_ms,
            maxlen=self.cfg.maxlen,
            worker=self.worker,
            total=fmt_int(self.total),
            meta=self.meta,
            kind=self.kind,
            latest=latest,
        )

    def acquired(self, reply: AcquireReply, sent_at: float) -> None:
        """Take the acquire's reply; raise when nothing was started."""
        if reply.code is AcquireCode.BUSY:
            raise JobBusy(self.job_id)
        if reply.code is not AcquireCode.STARTED:
            raise TimeoutError(
                f"job {self.job_id!r}: the acquire reached Redis too late (after its index "
                f"entry could have been dropped); nothing was started"
            )
        self.fence, self.attempt, self.seq = reply.fence, reply.attempt, reply.seq
        self.landed = reply.seq
        self.resume_from = load_json(reply.resume)
        self._last_checkpoint = reply.resume
        self.started_ms = reply.started_ms
        self.lease = Lease(self.cfg.ttl, sent_at)
        # What every beat carries unchanged, encoded once (redis-py passes bytes through).
        self._keys = tuple(k.encode() for k in self.schema.job(self.job_id).beat())
        self.beat_keys = self._keys
        self.beat_head = tuple(str(x).encode() for x in (self.token, self.fence, self.cfg.ttl_ms))
        self._known = [None] * len(_ALL)  # the first beat sends every field
        self.due = sent_at + self.cfg.interval

    def acquire_timeout_text(self, enrolled: bool, fault: BaseException | None = None) -> str:
        """Why entering gave up after ``ttl``, and what may be left (``fault``: the last Redis
        fault the shell retried through, if any)."""
        step = "acquire its lease" if enrolled else "index the job"
        left = (
            "the job was either not started, or started and indexed: if so it goes stale "
            "within ttl and a sweeper marks it LOST"
            if enrolled
            else "nothing is running"
        )
        return (
            f"job {self.job_id!r}: Redis did not answer in time (ttl={self.cfg.ttl} s"
            + ("" if fault is None else f"; last fault {fault!r}")
            + f") while trying to {step}; {left}"
        )

    def kind_index_commands(self) -> list[tuple[Any, ...]]:
        """The per-kind index entry and the kinds set, written at acquire (docs/protocol.md):
        scored by this attempt's start, and by its running-index deadline."""
        return [
            tuple(wire.zadd(self.schema.kind_index(self.kind), {self.job_id: self.started_ms})),
            tuple(wire.zadd(self.schema.kinds(), {self.kind: self.index_score})),
        ]

    # -- the body's requests -------------------------------------------------------------------

    def set_stage(self, name: str) -> bool:
        """Record a stage; True when it changed (the next beat carries a ``stage`` entry)."""
        check_stage(name)
        if name == self.stage:
            return False
        self.stage = name
        self._stage_changed = True
        return True

    def checkpoint_text(self, details: dict[str, Any]) -> str:
        return dump_json(details, limit=self.cfg.max_details_bytes, name="checkpoint details")

    def add_checkpoint(self, text: str, handle: H, now: float) -> None:
        """Queue a checkpoint; the next beat is due at once."""
        self._checkpoints.append((text, handle))
        self.due = now

    # -- beats ---------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """A beat may be sent: none in flight and the lease held."""
        return self._inflight is None and self.lease.held

    def next_beat(
        self, now: float, lag: float, sample: ProcessSample, done: int, total: int | None
    ) -> list[Any]:
        """Build the next beat (this job's segment of a ``beat.lua`` call, encoded by
        :func:`calls.encode_beat`) and mark it in flight."""
        kind, details, checkpoint = "", "", None
        self.beats += 1
        if self._checkpoints:
            checkpoint = self._checkpoints.popleft()
            kind, details = "checkpoint", checkpoint[0]
        elif self._stage_changed:
            kind = "stage"
        elif self.beats - self._last_event_beat >= self.cfg.stream_every:
            kind = "beat"
        if kind:
            self._last_event_beat = self.beats
            self._stage_changed = False
        self._inflight = (kind, checkpoint)
        self.lease.tried(now)
        replay, self._replay = self._replay, None
        reused = bool(replay and checkpoint is replay[1] and self.seq == replay[0])
        if self._same_seq:  # the resend of a beat that wrote nothing (RESEND_KEYS)
            reused, self._same_seq = True, False
        if not reused:
            self.seq += 1
        values = self._dynamic(done, total, sample, lag, now)
        # only the fields that differ from what the snapshot is known to hold (an entry also
        # carries done, total and stage)
        held = self._known
        present = [i for i in _ALL if values[i] != held[i]]
        if kind and present[:3] != [0, 1, 2]:
            present = sorted({0, 1, 2, *present})
        self._sent = (values, present, reused)
        pairs: list[Any] = []
        if checkpoint is not None:
            self._last_checkpoint = details
            pairs += ["checkpoint", details]
        if self._resend_static:
            pairs += self._static_pairs()
        event = (kind, details, self.cfg.maxlen) if kind else None
        sent = [values[i] for i in present]
        # a beat that resends everything repairs any loss: nothing to check (landed 0)
        landed = 0 if self._resend_static else self.landed
        # did the done sent move? unknown (None) while the snapshot's is unknown (the first
        # beat, after a failure or a resend): beat.lua then compares with the stored one
        known = self._known[0]
        moved = None if known is None else values[0] != known
        every = self._every_key
        self.beat_keys = self._keys if every else self._keys[:3] if kind else self._keys[:2]
        return calls.encode_beat(
            self.beat_head, self.seq, landed, present, sent, event, pairs, moved, every
        )

    def index_due(self) -> bool:
        """The running-index entry is refreshed with this beat (every ``index_every`` beats,
        and after a data loss)."""
        return self.beats % self.cfg.index_every == 0 or self._resend_static

    def index_members(self, server_now: float) -> list[tuple[str, str, int]]:
        """``(key, member, score)`` of an index refresh at server time ``server_now`` (s)."""
        deadline = int((server_now + self.cfg.index_horizon) * 1000)
        return [
            (self.index_shard, self.job_id, deadline),
            # the per-kind index and the kinds (docs/protocol.md) ride on the same refresh
            (self.schema.kind_index(self.kind), self.job_id, self.started_ms),
            (self.schema.kinds(), self.kind, deadline),
        ]

    def replied(self, sent_at: float, reply: BeatReply, *, ended: bool) -> ReplyVerdict[H]:
        """Take a beat's reply (``ended``: the final write has begun and decides instead)."""
        verdict: ReplyVerdict[H] = ReplyVerdict()
        inflight, self._inflight = self._inflight, None
        sent, self._sent = self._sent, None
        if ended:
            return verdict
        handle = inflight[1][1] if inflight and inflight[1] else None
        if reply.code is BeatCode.RESEND_KEYS:
            # nothing was written (alive is missing: a re-take reads the fence, not sent): the
            # same beat again at once, same seq, with every key
            self._every_key = self._same_seq = True
            self._requeue(inflight)
            if inflight is not None and inflight[0] == "beat":  # its periodic entry too
                self._last_event_beat = self.beats - self.cfg.stream_every
            self.due = sent_at
            return verdict
        self._every_key = False
        if reply.code < 0:
            verdict.lost = self.lose(_LOST_CAUSE.get(reply.code, LeaseLostCause.FENCED_OUT))
            if handle is not None:
                verdict.failed.append(handle)
            verdict.failed += self.drain_checkpoints() if verdict.lost else []
            return verdict
        self.lease.renewed(sent_at)
        # keep the cadence: beats are sent up to a tenth of an interval early (to share ticks)
        due = self.due + self.cfg.interval
        if due <= sent_at:  # late (a starved loop, a slow reply): no burst to catch up
            due = sent_at + self.cfg.interval
            verdict.late = True
        if reply.code is BeatCode.SEQ_BEHIND:
            self.seq = max(self.seq, reply.snapshot_seq)
            self.landed = max(self.landed, reply.snapshot_seq)
            self._requeue(inflight)
            self._known = [None] * len(_ALL)  # a newer snapshot we did not see: resend all
            due = sent_at
        elif reply.code is BeatCode.RESEND_STATIC:
            # the snapshot lost writes that landed (empty, or older): nothing of this beat was
            # written; the next one, at once, sends every field and the static ones
            self._resend_static = True
            self._requeue(inflight)
            self._known = [None] * len(_ALL)
            due = sent_at
        else:
            self.written += 1
            self._resend_static = False
            self.landed = self.seq
            if sent is not None:
                values, present, reused = sent
                for i in present:  # a reused seq may be a replay: what it sent is unknown
                    self._known[i] = None if reused else values[i]
            verdict.resolved = handle
        if self._checkpoints:
            due = sent_at  # a checkpoint asked for while this beat was in flight
        self.due = due
        if reply.cancel and not self.cancel_requested:
            self.cancel_requested = verdict.cancel = True
        return verdict

    def beat_failed(self, sent_at: float, *, at_once: bool, ended: bool) -> LeaseLostCause | None:
        """A beat got no answer, or an error: retry after ``min(interval, 0.25)`` s, or at once
        (NOSCRIPT: the script is being loaded). Returns EXPIRED when this was a late beat (sent
        after the lease's local deadline, see :meth:`check_expiry`) that is not sent again at
        once: it could not take the lease back, so the lease is lost."""
        inflight, self._inflight = self._inflight, None
        if ended:
            return None
        self.failed += 1
        sent, self._sent = self._sent, None
        if sent is not None:  # written or not: unknown, sent again
            for i in sent[1]:
                self._known[i] = None
        if inflight is not None and inflight[1] is not None:
            self._replay = (self.seq, inflight[1])
        self._requeue(inflight)
        self.due = sent_at if at_once else sent_at + retry_after(self.cfg.interval)
        # a late beat that got no answer: lost (one that is sent again at once wrote nothing:
        # a NOSCRIPT, a refused TIME; its resend decides)
        if not at_once and self.lease.held and sent_at >= self.lease.deadline:
            return self.lose(LeaseLostCause.EXPIRED)
        return None

    def _requeue(self, inflight: tuple[str, tuple[str, H] | None] | None) -> None:
        if inflight is None:
            return
        kind, checkpoint = inflight
        if checkpoint is not None:
            self._checkpoints.appendleft(checkpoint)
        elif kind == "stage":
            self._stage_changed = True

    # -- the lease ------------------------------------------------------------------------------

    def check_expiry(self, now: float) -> Expiry:
        """The lease-expiry and late-beat rules, for every shell's lease timer (and a sync
        exit): at ``now``, is the lease lost, must a beat go out at once, when to look again?

        * the deadline has not passed: look again at the deadline (renewals move it; a timer is
          not moved on every renewal, it re-arms itself when it fires early);
        * it passed although a beat was sent before it (Redis did not answer in time): the lease
          is EXPIRED, the body must stop;
        * it passed with no beat sent since the last renewal: the worker itself was late (a
          frozen process, a GIL held by a C call, a blocked loop). Not lost: a beat is due now,
          and its reply decides (``beat.lua`` re-takes a lease nobody claimed, else answers
          taken over or fenced out; a failure of that beat expires it, see
          :meth:`beat_failed`). Look again one interval later.
        """
        lease = self.lease
        if not lease.held:
            return Expiry(None, False, float("inf"))
        if now < lease.deadline:
            return Expiry(None, False, lease.deadline)
        if lease.expire_if_due(now):
            return Expiry(LeaseLostCause.EXPIRED, False, float("inf"))
        beat_now = self._inflight is None and self.due > now
        if self._inflight is None:
            self.due = min(self.due, now)
        return Expiry(None, beat_now, now + self.cfg.interval)

    def beat_budget(self, now: float) -> float:
        """Seconds a beat sent at ``now`` may wait for its reply: the lease time left, or
        ``ttl`` for a late beat (sent after the deadline: it tries to take the lease back, and
        the job stops within ``ttl`` when Redis does not answer it)."""
        left = self.lease.left(now)
        return max(0.05, left if left > 0 else self.cfg.ttl)

    def lose(self, cause: LeaseLostCause) -> LeaseLostCause | None:
        """Record a loss; the cause when this call lost the lease, None when already lost."""
        return cause if self.lease.lose(cause) else None

    def drain_checkpoints(self) -> list[H]:
        """The queued checkpoint handles (to fail: the lease is gone)."""
        out = [handle for _, handle in self._checkpoints]
        self._checkpoints.clear()
        return out

    # -- the end -------------------------------------------------------------------------------

    def final_plan(
        self,
        *,
        crash: BaseException | None,
        exc: BaseException | None,
        cancelled: bool,
    ) -> FinalPlan:
        """Which final state to write. ``exc``: what left the body (None, or an exception that is
        not a cancellation); ``cancelled``: the body ended by a cancel (external, on request, or
        ``JobCancelled``)."""
        cause = self.lease.lost
        if crash is not None:
            status, error = "FAILED", error_text(crash)
        elif cause is not None:
            status, error = "LOST", f"lease lost: {cause.value}"
        elif cancelled or self.cancel_requested:
            status, error = "CANCELLED", "" if exc is None else error_text(exc)
        elif exc is not None:
            status, error = "FAILED", error_text(exc)
        else:
            status, error = "COMPLETED", ""
        # LOST: the lease is already gone, the caller is owed LeaseLost within about
        # ttl + interval, and a sweeper records LOST anyway: try it for one interval only.
        limit = self.cfg.final_timeout
        if status == "LOST":
            limit = min(limit, self.cfg.interval)
        write = cause in (None, LeaseLostCause.EXPIRED)
        return FinalPlan(status, error, write, limit)

    def end_plan(
        self,
        *,
        crash: BaseException | None,
        exc: BaseException | None,
        interrupted: bool,
        external_cancel: bool,
    ) -> FinalPlan:
        """:meth:`final_plan` of how the body ended, in every shell's terms. ``exc``: what left
        the body; ``interrupted``: ``exc`` is the shell's own interruption of the body (the
        asyncio shell's task cancellation), not an outcome of the job; ``external_cancel``: the
        body was cancelled from outside jobpulse (the asyncio task's owner)."""
        return self.final_plan(
            crash=crash,
            exc=None if interrupted else exc,
            cancelled=external_cancel or isinstance(exc, JobCancelled),
        )

    def ending(
        self,
        *,
        crash: BaseException | None,
        exc: BaseException | None,
        interrupted: bool,
        external_cancel: bool,
    ) -> Ending:
        """How the job ends (arguments as for :meth:`end_plan`): its ``plan`` says what the
        shell writes; ``leave(written)`` then raises what the block must raise."""
        plan = self.end_plan(
            crash=crash, exc=exc, interrupted=interrupted, external_cancel=external_cancel
        )
        return Ending(self, plan, crash, exc, interrupted, external_cancel)

    def exit_verdict(
        self,
        *,
        crash: BaseException | None,
        exc: BaseException | None,
        interrupted: bool,
        external_cancel: bool,
        status: str,
        written: bool | None,
    ) -> ExitVerdict:
        """What leaving the ``with`` block raises, after the final write (``written``: True,
        False, or None when nothing was to be written): a crash of jobpulse's own >
        ``LeaseLost`` > ``StateNotWritten`` (the body succeeded, its end was not written; when it
        failed, its own exception gets a note instead) > ``JobCancelled`` (a cancel request the
        body did not answer with ``JobCancelled`` itself) > the body's own exception, unchanged.
        Arguments as for :meth:`end_plan`."""
        if crash is not None:
            return ExitVerdict(crash, None)
        if self.lease.lost is not None:
            lost = LeaseLost(self.job_id, self.lease.lost)
            quiet = interrupted or isinstance(exc, JobCancelled)
            lost.__cause__ = None if quiet else exc  # ``raise lost from ...``
            lost.__suppress_context__ = True
            return ExitVerdict(lost, None)
        if written is False:
            message = f"the final state {status} of job {self.job_id!r} was not written to Redis"
            if exc is None:
                return ExitVerdict(StateNotWritten(message), None)
            if not external_cancel:
                return ExitVerdict(self._cancel_error(exc, interrupted), message)
            return ExitVerdict(None, message)
        if external_cancel:
            return ExitVerdict(None, None)
        return ExitVerdict(self._cancel_error(exc, interrupted), None)

    def _cancel_error(self, exc: BaseException | None, interrupted: bool) -> JobCancelled | None:
        if self.cancel_requested and (exc is None or interrupted):
            return JobCancelled(f"job {self.job_id!r} was cancelled on request")
        return None

    def finish_call(
        self,
        status: str,
        error: str,
        sample: ProcessSample | None,
        done: int,
        total: int | None,
    ) -> calls.Call[FinishCode]:
        """The final write of ``status`` (the shell bumps ``seq`` once before the first try)."""
        return calls.finish(
            self.keys,
            token=self.token,
            fence=self.fence,
            ttl_ms=self.cfg.ttl_ms,
            seq=self.seq,
            status=status,
            error=error[:MAX_ERROR_CHARS],
            maxlen=self.cfg.maxlen,
            retention_ms=int(self.cfg.retention * 1000),
            dynamic=self._dynamic(done, total, sample, 0.0, None),
            pairs=self._static_pairs(),
        )

    def finished(self, code: FinishCode) -> bool:
        """Take the final write's reply; True when the job may be dropped from the index."""
        if code < 0:
            self.lease.lose(_FINISH_LOST.get(code, LeaseLostCause.FENCED_OUT))
            return False
        return True

    def unindex_calls(self) -> list[calls.Call[int]]:
        """The conditional removals after the final write: the kind entry first (a failure
        keeps the running entry, and the sweeper that drops it drops the kind entry too), only
        this attempt's (by ``started_ms``); then the running entry, only while it holds a
        deadline this worker wrote or read (a new attempt's enroll always moves it past)."""
        return [
            calls.unindex(self.schema.kind_index(self.kind), [self.job_id, self.started_ms]),
            calls.unindex(self.index_shard, [self.job_id, self.index_score]),
        ]

    def index_read(self, score: float | None) -> None:
        """The running-index score read before the final write (see ``docs/protocol.md``)."""
        if score is not None:
            self.index_score = max(self.index_score, int(score))

    # -- encoding ------------------------------------------------------------------------------

    def _dynamic(
        self,
        done: int,
        total: int | None,
        sample: ProcessSample | None,
        lag: float,
        now: float | None,
    ) -> list[str]:
        done = max(done, 0)
        window = self._rate
        if now is not None:
            window.add(now, done)
        rate = window.rate()
        eta = window.eta(done, total, rate)
        rss, cpu, lag_ms = _shared_text(sample, lag)
        # the texts of the last beat's values, reused while a value repeats (an idle body's
        # done, rate and eta stay put beat after beat): formatting is most of a beat's build
        memo = self._memo
        if done != memo[0]:
            memo[0], memo[1] = done, str(done)
        if rate != memo[2]:
            memo[2], memo[3] = rate, fmt_float(rate)
        if eta != memo[4]:
            memo[4], memo[5] = eta, fmt_float(eta, 1)
        return [memo[1], fmt_int(total), self.stage, memo[3], memo[5], rss, cpu, lag_ms]

    def _static_pairs(self) -> list[Any]:
        pairs: list[Any] = ["attempt", self.attempt, "worker", self.worker]
        pairs += ["started_ms", self.started_ms, "meta", self.meta, "kind", self.kind]
        if self._last_checkpoint:
            pairs += ["checkpoint", self._last_checkpoint]
        return pairs

    def describe(self, name: str) -> str:
        return (
            f"<{name} job={self.job_id} fence={self.fence} attempt={self.attempt} "
            f"seq={self.seq} lease={self.lease}>"
        )


_SHARED: list[tuple[ProcessSample | None, float, tuple[str, str, str]]] = [
    (None, 0.0, ("", "", "0"))
]


def _shared_text(sample: ProcessSample | None, lag: float) -> tuple[str, str, str]:
    """The texts of the process sample and the loop lag: every job of a tick beats with the
    same two, so they are formatted once per tick, not once per job (a one-entry cache, read
    and replaced whole, so threads sharing it never mix two entries)."""
    entry = _SHARED[0]
    if entry[0] is not sample or entry[1] != lag:
        rss = "" if sample is None else str(sample.rss_bytes)
        cpu = "" if sample is None else fmt_float(sample.cpu_seconds)
        entry = _SHARED[0] = (sample, lag, (rss, cpu, fmt_float(lag * 1000, 1)))
    return entry[2]


def error_text(exc: BaseException) -> str:
    """``"Type: message"``, cut to ``MAX_ERROR_CHARS``."""
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
