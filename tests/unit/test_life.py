"""The job's life as sans-I/O steps (``_worker/life.py``) and the exit verdict, driven by a
scripted driver: no Redis, no sleeping. Every shell runs these same sequences."""

from __future__ import annotations

from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from jobpulse import JobBusy, JobCancelled, LeaseLost, LeaseLostCause, StateNotWritten
from jobpulse._protocol.calls import AcquireCode, AcquireReply, FinishCode
from jobpulse._worker.life import (
    Command,
    Commands,
    Send,
    Sleep,
    Stepper,
    Steps,
    acquire_steps,
    final_steps,
)
from jobpulse._worker.machine import BeatMachine
from jobpulse._worker.retry import ACQUIRE_RETRY, FINAL_RETRY, retry_after

from .test_machine import SAMPLE, machine

FAULT = RedisConnectionError("reset")
STARTED = AcquireReply(AcquireCode.STARTED, 3, 1, 0, "", 1000)


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def drive(steps: Steps[Any], answer: Any, clock: Clock) -> tuple[Any, list[Any]]:
    """Run ``steps``; ``answer(step)`` returns a reply or an exception to throw. A Sleep moves
    ``clock``. Returns (the result, the steps seen)."""
    seen: list[Any] = []
    run = Stepper(steps)
    while (step := run.next()) is not None:
        seen.append(step)
        if isinstance(step, Sleep):
            clock.now += step.seconds
            continue
        result = answer(step)
        if isinstance(result, BaseException):
            run.fail(result)
        else:
            run.reply(result)
    return run.result, seen


def fresh() -> BeatMachine[str]:
    m: BeatMachine[str] = machine()
    m.lease.renewed_at = float("-inf")  # not acquired yet
    return m


def test_the_schedules() -> None:
    delays = ACQUIRE_RETRY.delays()
    assert [next(delays) for _ in range(7)] == [0.02, 0.04, 0.08, 0.16, 0.32, 0.5, 0.5]
    delays = FINAL_RETRY.delays()
    assert [next(delays) for _ in range(7)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0]
    assert (retry_after(1.0), retry_after(0.1)) == (0.25, 0.1)


def test_acquire_retries_faults_then_indexes_the_kind() -> None:
    clock, m, faults = Clock(), fresh(), [FAULT, FAULT]

    def answer(step: Any) -> Any:
        if isinstance(step, Send) and step.call.script.name == "enroll":
            return faults.pop() if faults else 5000
        if isinstance(step, Send):
            return STARTED
        return [1, 1]

    _, seen = drive(acquire_steps(m, clock, lambda *a: None), answer, clock)
    sleeps = [s.seconds for s in seen if isinstance(s, Sleep)]
    assert sleeps == [0.02, 0.04]
    assert isinstance(seen[-1], Commands)  # the kind index, once the lease is held
    assert m.fence == 3
    assert m.index_score == 5000


def test_acquire_gives_up_within_ttl_and_says_which_step() -> None:
    clock, m = Clock(), fresh()

    def answer(step: Any) -> Any:
        return 5000 if step.call.script.name == "enroll" else FAULT

    with pytest.raises(TimeoutError, match="acquire its lease"):
        drive(acquire_steps(m, clock, lambda *a: None), answer, clock)
    assert clock.now <= 100.0 + m.cfg.ttl


def test_acquire_busy_raises_and_a_kind_index_fault_is_only_logged() -> None:
    clock, warned = Clock(), []
    busy = AcquireReply(AcquireCode.BUSY)
    with pytest.raises(JobBusy):
        drive(acquire_steps(fresh(), clock, lambda *a: None), lambda s: 1 if
              s.call.script.name == "enroll" else busy, clock)  # fmt: skip

    def answer(step: Any) -> Any:
        if isinstance(step, Commands):
            return [1, FAULT]
        return 5000 if step.call.script.name == "enroll" else STARTED

    drive(acquire_steps(fresh(), clock, lambda *a: warned.append(a)), answer, clock)
    assert len(warned) == 1


def test_the_final_write_retries_until_its_limit() -> None:
    clock, m = Clock(), machine()
    plan = m.end_plan(crash=None, exc=None, interrupted=False, external_cancel=False)

    def answer(step: Any) -> Any:
        return None if isinstance(step, Command) else FAULT  # no index score; never written

    written, seen = drive(
        final_steps(m, plan, clock, lambda *a: None, lambda: (SAMPLE, 1, 2)), answer, clock
    )
    assert written is False
    sleeps = [s.seconds for s in seen if isinstance(s, Sleep)]
    assert sleeps[:5] == [0.05, 0.1, 0.2, 0.4, 0.8]
    assert sum(sleeps) < plan.limit


def test_the_final_write_then_unindexes() -> None:
    clock, m = Clock(), machine()
    plan = m.end_plan(crash=None, exc=None, interrupted=False, external_cancel=False)

    def answer(step: Any) -> Any:
        if isinstance(step, Command):
            return b"7000"
        return FinishCode.WRITTEN if step.call.script.name == "finish" else 1

    written, seen = drive(
        final_steps(m, plan, clock, lambda *a: None, lambda: (SAMPLE, 1, 2)), answer, clock
    )
    assert written is True
    assert [s.call.script.name for s in seen if isinstance(s, Send)] == [
        "finish", "unindex", "unindex",
    ]  # fmt: skip
    assert m.index_score == 7000


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("crash", RuntimeError),
        ("lost", LeaseLost),
        ("not written", StateNotWritten),
        ("cancel requested", JobCancelled),
        ("completed", None),
    ],
)
def test_the_exit_verdict_ranks_crash_lost_unwritten_cancel(case: str, expected: Any) -> None:
    m = machine()
    crash = RuntimeError("bug") if case == "crash" else None
    if case in ("crash", "lost"):
        m.lose(LeaseLostCause.TAKEN_OVER)
    if case in ("crash", "lost", "not written", "cancel requested"):
        m.cancel_requested = True
    written = case not in ("crash", "lost", "not written")
    verdict = m.exit_verdict(
        crash=crash,
        exc=None,
        interrupted=False,
        external_cancel=False,
        status="COMPLETED",
        written=written,
    )
    assert (None if verdict.error is None else type(verdict.error)) is expected


def test_a_body_exception_gets_a_note_when_its_end_was_not_written() -> None:
    m, exc = machine(), ValueError("bad")
    verdict = m.exit_verdict(
        crash=None, exc=exc, interrupted=False, external_cancel=False, status="FAILED",
        written=False,
    )  # fmt: skip
    assert verdict.error is None
    assert verdict.note is not None
    assert "FAILED" in verdict.note
    m.lose(LeaseLostCause.FENCED_OUT)
    lost = m.exit_verdict(
        crash=None, exc=exc, interrupted=False, external_cancel=False, status="LOST",
        written=None,
    ).error  # fmt: skip
    assert isinstance(lost, LeaseLost)
    assert lost.__cause__ is exc
