"""The pure scheduling of overload (``_worker/plan.py``): due beats in lease-deadline order,
beats before any other call on a connection, new jobs entering only while no lease presses.
No Redis, no sleeping."""

from __future__ import annotations

from typing import Any

from jobpulse._protocol.calls import AcquireCode, AcquireReply
from jobpulse._worker.machine import BeatMachine
from jobpulse._worker.options import HeartbeatSpec
from jobpulse._worker.plan import CHUNK, BeatPlan, SendGate, chunk_budget


class _Job:
    """A job whose lease was last renewed at ``renewed`` (ttl 6 s) and whose beat is due at
    ``due``."""

    def __init__(self, due: float, renewed: float) -> None:
        self.machine: BeatMachine[str] = BeatMachine("job", HeartbeatSpec(interval=1.0, ttl=6.0))
        self.machine.acquired(AcquireReply(AcquireCode.STARTED, 1, 1, 0, "", 1000), renewed)
        self.machine.due = due


def test_due_beats_are_taken_closest_lease_deadline_first_a_chunk_at_a_time() -> None:
    """A ticker that cannot keep up serves the job nearest to losing its lease first, even
    when another job's beat has been due for longer."""
    plan: BeatPlan[Any] = BeatPlan()
    long_due = _Job(due=10.0, renewed=9.0)  # deadline 15
    pressed = _Job(due=10.5, renewed=5.0)  # deadline 11: a beat that went out late before
    fresh = _Job(due=10.2, renewed=9.2)  # deadline 15.2
    for job in (long_due, pressed, fresh):
        plan.add(job)
    assert plan.take_due(10.6, limit=2) == [pressed, long_due]
    assert plan.has_due(10.6)  # the third stays due, not lost
    assert plan.first() < 10.6
    assert plan.take_due(10.6) == [fresh]
    assert not plan.has_due(10.6)


def test_a_take_never_returns_more_than_its_limit_and_keeps_the_rest_in_order() -> None:
    plan: BeatPlan[Any] = BeatPlan()
    jobs = [_Job(due=1.0, renewed=0.5 - i / 10_000) for i in range(CHUNK + 10)]
    for job in jobs:
        plan.add(job)
    first = plan.take_due(2.0, limit=CHUNK)
    assert first == jobs[::-1][:CHUNK]  # the oldest renewals (earliest deadlines) first
    assert plan.take_due(2.0, limit=CHUNK) == jobs[::-1][CHUNK:]


def test_a_rescheduled_or_removed_job_waiting_in_the_due_queue_is_not_taken_twice() -> None:
    plan: BeatPlan[Any] = BeatPlan()
    moved, gone = _Job(due=1.0, renewed=0.0), _Job(due=1.0, renewed=0.1)
    plan.add(moved)
    plan.add(gone)
    assert plan.has_due(1.0)
    moved.machine.due = 1.0  # a checkpoint asked for a beat at once: planned again
    plan.schedule(moved)
    plan.remove(gone)
    assert plan.take_due(1.0) == [moved]
    assert plan.take_due(1.0) == []


def test_a_lease_presses_once_less_than_half_its_ttl_is_left_of_a_due_beat() -> None:
    plan: BeatPlan[Any] = BeatPlan()
    job = _Job(due=1.0, renewed=0.0)  # deadline 6, ttl 6
    plan.add(job)
    assert not plan.pressing(0.5)  # not due yet
    assert not plan.pressing(2.9)  # due, 3.1 s left
    assert plan.pressing(3.1)  # 2.9 s left: new jobs wait
    assert plan.take_due(3.1) == [job]
    assert not plan.pressing(3.1)  # in flight: its send, not a wait


def test_lateness_is_how_late_the_earliest_beat_of_a_chunk_goes_out() -> None:
    jobs = [_Job(due=1.0, renewed=0.0), _Job(due=2.5, renewed=1.5)]
    assert BeatPlan.lateness(jobs, 3.0) == 2.0
    assert BeatPlan.lateness(jobs, 0.9) == 0.0  # sent early (coalesced): not late


def test_beats_take_a_freed_connection_before_any_other_call() -> None:
    gate: SendGate[str] = SendGate(2)
    assert gate.take("acquire-1", beat=False)
    assert gate.take("beat-1", beat=True)
    assert not gate.take("acquire-2", beat=False)
    assert not gate.take("final-1", beat=False)
    assert not gate.take("beat-2", beat=True)
    assert gate.give_back() == "beat-2"  # came last, served first
    assert gate.give_back() == "acquire-2"
    assert gate.give_back() == "final-1"
    assert gate.give_back() is None
    assert gate.free == 1


def test_no_call_jumps_ahead_of_a_waiting_beat() -> None:
    gate: SendGate[str] = SendGate(1)
    assert gate.take("final", beat=False)
    assert not gate.take("beat", beat=True)
    assert gate.give_back() == "beat"
    # a slot freed with only a beat waiting went to it; nothing is free for a newcomer
    assert not gate.take("acquire", beat=False)
    assert gate.give_back() == "acquire"


def test_new_jobs_enter_in_turn_a_few_at_a_time_and_one_at_a_time_while_a_lease_presses() -> None:
    gate: SendGate[str] = SendGate(4, entering=3)
    assert gate.enter("a", pressing=False)
    assert gate.enter("b", pressing=False)
    assert not gate.enter("c", pressing=True)  # a beat presses: two entering is too many
    assert not gate.enter("d", pressing=False)  # c came first: d queues behind it
    gate.entered()  # a is in
    assert gate.admit(pressing=True) == []  # b still entering
    gate.entered()  # b is in
    assert gate.admit(pressing=True) == ["c"]  # one at a time: the burst goes on
    assert gate.admit(pressing=True) == []
    assert gate.admit(pressing=False) == ["d"]  # no lease presses: up to three
    assert gate.enter("e", pressing=False)  # c, d, e entering
    assert not gate.enter("f", pressing=False)
    gate.entered()
    assert gate.admit(pressing=False) == ["f"]
    assert gate.entering == 3


def test_a_waiter_that_gave_up_is_forgotten() -> None:
    gate: SendGate[str] = SendGate(1, entering=1)
    assert gate.take("held", beat=False)
    assert not gate.take("cancelled", beat=True)
    assert not gate.take("next", beat=False)
    gate.forget("cancelled")
    assert gate.give_back() == "next"
    assert gate.enter("in", pressing=False)
    assert not gate.enter("gone", pressing=False)
    gate.forget("gone")
    gate.entered()
    assert gate.admit(pressing=False) == []
    assert gate.waiting == 0


def test_a_chunk_waits_for_its_smallest_lease_left_but_at_least_an_interval() -> None:
    """A stuck reply is given up at the chunk's smallest lease time left (its other leases still
    stand); never sooner than an interval while a lease lasts that long (a loaded Redis is
    waited for); never longer than the largest lease time left."""
    assert chunk_budget([0.5, 29.5], [0.5, 0.5]) == 0.5
    assert chunk_budget([3.0, 29.5], [1.0, 1.0]) == 3.0
    assert chunk_budget([0.05, 5.0], [1.0, 1.0]) == 1.0
    assert chunk_budget([0.05, 0.4], [1.0, 1.0]) == 0.4
    assert chunk_budget([0.05], [1.0]) == 0.05
