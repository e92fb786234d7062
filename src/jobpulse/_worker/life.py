"""A job's life as sans-I/O steps: entering (index, lease, kind index) and the final write.

Each sequence is a generator that yields what to do (:class:`Send` a script call,
:class:`Command` one plain command, :class:`Commands` pipelined, :class:`Sleep`) and is sent
the reply, or thrown the exception, by a driver. A driver (the asyncio shell, the thread shell,
the coming sidecar) only awaits, sleeps, sends and receives: every decision (what to send, what
a fault means, how long to retry, what to log) is written here once, with the schedules of
``retry.py``. The machine (:class:`~jobpulse._worker.machine.BeatMachine`) holds the state.

Invariants:
  * every step is safe to replay: each script answers a replay of itself as the first run
    (``enroll``, ``acquire``, ``finish``, ``unindex``), and the kind index is a ``ZADD``;
  * a step's ``timeout`` is the time left of the sequence's own deadline, never more: a driver
    that can bound a call (asyncio) does; a blocking driver is bounded by its client's
    ``socket_timeout`` (docs/sync.md) and the sequence gives up at its next decision.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .._protocol import calls
from .._protocol.errors import is_redis_fault, tolerate_faults
from .machine import BeatMachine, FinalPlan
from .retry import ACQUIRE_RETRY, FINAL_RETRY
from .sampling import ProcessSample
from .stats import WORKER_STATS

__all__ = [
    "Command",
    "Commands",
    "Send",
    "Sleep",
    "Step",
    "Stepper",
    "Steps",
    "Warn",
    "acquire_steps",
    "final_steps",
]

log = logging.getLogger("jobpulse")

R = TypeVar("R")
Warn = Callable[..., object]
"""The rate-limited warning a sequence logs with (``RateLimitedLog.warning``)."""


@dataclass(frozen=True, slots=True)
class Send(Generic[R]):
    """Send a script call; the driver sends back its decoded reply."""

    call: calls.Call[R]
    timeout: float


@dataclass(frozen=True, slots=True)
class Command:
    """One plain command (``execute_command`` form); the driver sends back its reply."""

    args: tuple[Any, ...]
    timeout: float


@dataclass(frozen=True, slots=True)
class Commands:
    """Plain commands pipelined (not a transaction); the driver sends back the list of
    replies, a command's error as an exception in its place."""

    commands: list[tuple[Any, ...]]
    timeout: float


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


Step = Send[Any] | Command | Commands | Sleep
Steps = Generator[Step, Any, R]


class Stepper(Generic[R]):
    """Walks a sequence for a driver: ``while (step := s.next()) is not None:`` do the step,
    then :meth:`reply` its reply or :meth:`fail` with its exception; :attr:`result` at the
    end. A driver thus holds no logic of its own but how to do each kind of step."""

    def __init__(self, steps: Steps[R]) -> None:
        self._steps = steps
        self._reply: Any = None
        self._error: BaseException | None = None
        self.result: R

    def next(self) -> Step | None:
        reply, error = self._reply, self._error
        self._reply, self._error = None, None
        try:
            return self._steps.send(reply) if error is None else self._steps.throw(error)
        except StopIteration as stop:
            self.result = stop.value
            return None

    def reply(self, value: Any) -> None:
        self._reply = value

    def fail(self, exc: BaseException) -> None:
        self._error = exc


_MIN_STEP = 0.01  # a final write try is given at least this long (its deadline may have passed)


def acquire_steps(m: BeatMachine[Any], clock: Callable[[], float], warn: Warn) -> Steps[None]:
    """Index the job, then take its lease (two steps: on a cluster the index shard and the job's
    keys live in different slots, so no one script can do both); then the per-kind index.

    The index entry goes first (``enroll.lua``, an intent record): a job is RUNNING only after
    its entry exists, and ``acquire.lua`` refuses to start once that entry may have been
    dropped, so every RUNNING job is findable by the sweeper from the moment it exists. An entry
    whose acquire never ran is dropped by the sweeper ("not running"). Both scripts are safe to
    replay: a fault (a reset connection, a failover, a cluster client still learning its slots)
    is retried within ``ttl``; a replayed acquire that finds its own lease answers the attempt
    it started.

    Raises:
        JobBusy: another live worker holds the job.
        TimeoutError: Redis did not answer within ``ttl`` (the message says which step and
            what may be left), or the acquire came too late.
    """
    sent_at = clock()
    give_up = sent_at + m.cfg.ttl
    enrolled = False
    delays = ACQUIRE_RETRY.delays()
    cause: BaseException | None = None  # the fault the message names
    while True:
        try:
            deadline_ms = yield Send(m.enroll_call(), give_up - clock())
            enrolled = True
            reply = yield Send(m.acquire_call(deadline_ms), give_up - clock())
            break
        except Exception as exc:
            if not is_redis_fault(exc):
                raise
            # The last try is bounded by the time left: its own expiry (a bare TimeoutError)
            # says nothing of why, so the message keeps the Redis fault retried before it.
            if cause is None or type(exc) is not TimeoutError:
                cause = exc
            delay = next(delays)
            if clock() + delay >= give_up:
                raise TimeoutError(m.acquire_timeout_text(enrolled, cause)) from exc
            yield Sleep(delay)
    m.acquired(reply, sent_at)
    # The per-kind index (docs/protocol.md), scored by this attempt's start: best effort, like
    # the metrics it serves (the running-jobs index above is what recovery needs).
    with tolerate_faults(lambda e: warn("job %s: kind not indexed: %r", m.job_id, e)):
        replies = yield Commands(m.kind_index_commands(), m.cfg.ttl)
        for answer in replies:
            if isinstance(answer, Exception):
                raise answer


def final_steps(
    m: BeatMachine[Any],
    plan: FinalPlan,
    clock: Callable[[], float],
    warn: Warn,
    reading: Callable[[], tuple[ProcessSample | None, int, int | None]],
) -> Steps[bool]:
    """Write the final state ``plan`` names, retrying through Redis faults for up to
    ``plan.limit`` seconds; then drop the job from the indexes. ``reading()``: the process
    sample and the progress (done, total) at each try.

    Returns True when written (or already ended), False when it could not be written.
    """
    deadline = clock() + plan.limit
    m.seq += 1
    # The running-index score, read before the final write (best effort, bounded): the removal
    # after the final write spares any entry moved past what this worker knows, because a new
    # attempt's ``enroll.lua`` always moves it past the current score. Two writes also move it
    # without the worker knowing: a sweeper re-scoring the entry of a live but late job, and an
    # index refresh whose reply was lost. Both happen before the final write, never after it,
    # so reading the score now (while the job is still ours: no new attempt can exist) covers
    # them; an entry a new attempt enrolls after the final write still scores above it.
    with tolerate_faults(lambda _: None):  # the removal stays conditional on what we wrote
        score = yield Command(("ZSCORE", m.index_shard, m.job_id), min(plan.limit, m.cfg.ttl))
        m.index_read(None if score is None else float(score))
    delays = FINAL_RETRY.delays()
    while True:
        sample, done, total = reading()
        call = m.finish_call(plan.status, plan.error, sample, done, total)
        try:
            code = yield Send(call, max(deadline - clock(), _MIN_STEP))
        except Exception as exc:
            if not is_redis_fault(exc):
                raise
            delay = next(delays)
            if clock() + delay >= deadline:
                log.error("job %s: final state %s not written: %r", m.job_id, plan.status, exc)
                WORKER_STATS.final_writes_failed += 1
                return False
            warn("job %s: final write failed, retrying: %r", m.job_id, exc)
            yield Sleep(delay)
            continue
        if m.finished(code):
            yield from _unindex(m, warn)
        return True


def _unindex(m: BeatMachine[Any], warn: Warn) -> Steps[None]:
    """Drop the job from the running-jobs index (best effort: a sweeper drops entries of ended
    jobs it meets, so a failure here costs one wasted claim attempt, never a job)."""
    with tolerate_faults(lambda e: warn("job %s: not dropped from the index: %r", m.job_id, e)):
        for call in m.unindex_calls():
            yield Send(call, m.cfg.ttl)
