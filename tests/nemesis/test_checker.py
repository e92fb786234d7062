"""The checker on hand-made histories: a clean one passes, and for each rule a history that
breaks it (and only it) is named by that rule; the faults that excuse a verdict excuse it."""

from __future__ import annotations

from typing import Any

import pytest

from .checker import RULES, Limits, Violation, check, report
from .history import Record

LIM = Limits(ttl=3.0, cache_ttl=0.5, grace=1.0, claim_within=3.0)
W, W2, S, R = 100, 101, 200, 300  # pids: two workers, a sweeper, a reader
W3, N = 102, 400  # a third worker; a queue node's main process


def rec(t: float, op: str, pid: int, **f: Any) -> Record:
    return {"t": t, "wall": t, "proc": f"p{pid}", "pid": pid, "op": op, **f}


def read(t0: float, state: str, fence: int, seq: int, job: str = "j", reader: str = "a") -> Record:
    return rec(t0 + 0.01, "read", R, job=job, reader=reader, t0=t0, state=state, fence=fence,
               seq=seq)  # fmt: skip


def fault(kind: str, target: object, start: float, end: float) -> Record:
    return rec(end, "fault", 1, kind=kind, target=target, start=start, end=end)


def clean() -> list[Record]:
    """Worker W runs j (fence 5) to COMPLETED and is killed between two jobs at 6; worker W2
    holds k (fence 9), is killed at 10, read STALE, claimed once at 16 (fence 10) with its last
    checkpoint, acked."""
    h = [
        rec(0.0, "spawn", 1, role="worker", child=W),
        rec(1.0, "acquire", W, job="j", fence=5, attempt=1, t0=0.9),
        read(1.5, "RUNNING", 5, 1),
        rec(2.0, "checkpoint", W, job="j", fence=5, n=1, t0=1.9),
        read(2.5, "RUNNING", 5, 3),
        rec(4.0, "final", W, job="j", fence=5, status="COMPLETED", t0=3.9),
        read(5.0, "COMPLETED", 5, 6),
        fault("kill", W, 6.0, 6.0),
        rec(6.0, "acquire", W2, job="k", fence=9, attempt=1, t0=5.9),
        rec(7.0, "checkpoint", W2, job="k", fence=9, n=4, t0=6.9),
        read(8.0, "RUNNING", 9, 2, job="k"),
        fault("kill", W2, 10.0, 10.0),
        read(12.0, "STALE", 9, 3, job="k"),
        rec(16.0, "deliver", S, job="k", attempt=1, fence=10, checkpoint=4),
        rec(16.1, "ack", S, job="k", attempt=1, fence=10),
        read(17.0, "LOST", 10, 4, job="k"),
        rec(30.0, "end_faults", 1),
        rec(31.0, "dump", 1, job="j", state="COMPLETED", fence=5, seq=6, checkpoints=[1]),
    ]
    return sorted(h, key=lambda r: r["t"])


def rules_of(h: list[Record]) -> list[str]:
    return sorted({v.rule for v in check(sorted(h, key=lambda r: r["t"]), LIM)})


def test_a_clean_history_passes() -> None:
    assert check(clean(), LIM) == []


BROKEN: dict[str, list[Record]] = {
    # j read STALE at 3.0 while W was alive, running and reachable
    "live-never-stale": [read(3.0, "STALE", 5, 4)],
    # k still RUNNING 5 s after W2 died (ttl 3 + cache 0.5 + grace 1 = 4.5), before the claim
    "dead-stale-within-ttl": [read(15.0, "RUNNING", 9, 3, job="k", reader="b")],
    # attempt 1 of k claimed twice: fences 10 and 11
    "claimed-once": [rec(18.0, "deliver", S, job="k", attempt=1, fence=11, checkpoint=4),
                     rec(18.1, "ack", S, job="k", attempt=1, fence=11)],
    # a claim of j2 delivered and never acknowledged nor delivered again
    "delivered-until-acked": [
        rec(16.0, "acquire", W3, job="j2", fence=1, attempt=1, t0=15.9),
        fault("kill", W3, 17.0, 17.0),
        rec(21.0, "deliver", S, job="j2", attempt=1, fence=2, checkpoint=None)],
    # W3 holds j3 when killed at 20; nobody claims it by end_faults (30)
    "dead-job-claimed": [rec(16.0, "acquire", W3, job="j3", fence=1, attempt=1, t0=15.9),
                         fault("kill", W3, 20.0, 20.0)],
    # W2's checkpoint acknowledged though it started after the claim returned
    "fenced-out-never-writes": [rec(16.5, "checkpoint", W2, job="k", fence=9, n=5, t0=16.3)],
    # j read RUNNING after its COMPLETED write returned
    "final-never-overwritten": [read(6.0, "RUNNING", 5, 7)],
    # reader a shows (5, 2) after (5, 3)
    "reader-monotonic": [read(2.8, "RUNNING", 5, 2)],
    # task q running in two processes at once
    "queue-no-overlap": [rec(1.0, "exec_start", W, task="q"),
                         rec(2.0, "exec_start", W2, task="q"),
                         rec(3.0, "exec_end", W, task="q", outcome="failed"),
                         rec(4.0, "exec_end", W2, task="q", outcome="completed")],
    # task q completed, then started again
    "queue-completed-not-rerun": [rec(1.0, "exec_start", W, task="q"),
                                  rec(2.0, "exec_end", W, task="q", outcome="completed"),
                                  rec(3.0, "exec_start", W2, task="q"),
                                  rec(4.0, "exec_end", W2, task="q", outcome="completed")],
    # j's checkpoint 2 acknowledged but not in its stream after the run
    "checkpoint-kept": [rec(3.0, "checkpoint", W, job="j", fence=5, n=2, t0=2.9)],
    # W3, alive and never stopped, records nothing of its job p for 13 s (bound 9 s)
    "worker-progress": [rec(11.0, "acquire", W3, job="p", fence=1, attempt=1, t0=10.9),
                        rec(12.0, "checkpoint", W3, job="p", fence=1, n=5, t0=11.9),
                        rec(25.0, "final", W3, job="p", fence=1, status="COMPLETED", t0=24.9)],
}  # fmt: skip


def test_every_rule_has_a_broken_history() -> None:
    assert sorted(BROKEN) == sorted(RULES)


@pytest.mark.parametrize("rule", RULES)
def test_a_history_that_breaks_a_rule_is_named_by_that_rule(rule: str) -> None:
    assert rules_of(clean() + BROKEN[rule]) == [rule]


def test_the_claim_must_carry_the_last_acknowledged_checkpoint() -> None:
    h = [r for r in clean() if r["op"] != "deliver"]
    h.append(rec(16.0, "deliver", S, job="k", attempt=1, fence=10, checkpoint=3))
    assert rules_of(h) == ["checkpoint-kept"]


def test_a_fenced_out_write_seen_by_a_reader_is_named() -> None:
    assert rules_of([*clean(), read(16.7, "RUNNING", 8, 5, job="k", reader="b")]) == [
        "fenced-out-never-writes"
    ]


@pytest.mark.parametrize(
    ("kind", "target"),
    [
        ("stop", W),
        ("gil", W),
        ("blackhole", "net"),
        ("restart", "redis"),
        ("sleep", "redis"),
        ("failover", "redis"),
    ],
)
def test_a_stale_verdict_is_excused_by_a_fault_that_may_cause_it(kind: str, target: object) -> None:
    assert rules_of(clean() + BROKEN["live-never-stale"] + [fault(kind, target, 1.2, 1.4)]) == []


@pytest.mark.parametrize(("kind", "target"), [("stop", W2), ("latency", "net"), ("cut", "net"),
                                              ("lost_reply", "net"), ("stop", W),
                                              ("migrate", "slot 1: a -> b")])  # fmt: skip
def test_a_stale_verdict_is_not_excused_by_other_faults(kind: str, target: object) -> None:
    start = -10.0 if target == W else 1.2  # W's own stop long before: no excuse either
    h = clean() + BROKEN["live-never-stale"] + [fault(kind, target, start, start + 0.2)]
    assert rules_of(h) == ["live-never-stale"]


def test_data_lost_after_the_end_excuses_an_unknown_read_not_a_running_one_before_it() -> None:
    lost = [fault("restart", "redis", 5.5, 5.6), read(7.0, "UNKNOWN", 0, 0)]
    assert rules_of(clean() + lost) == []
    assert rules_of([*clean(), read(5.2, "RUNNING", 5, 7), *lost]) == ["final-never-overwritten"]


def test_the_report_names_the_seed_the_schedule_and_the_slice() -> None:
    h = sorted(clean() + BROKEN["live-never-stale"], key=lambda r: r["t"])
    [v] = check(h, LIM)
    sched = [{"at": 1.0, "kind": "kill", "slot": 2, "seconds": 0.0}]
    text = report(7, sched, h, v, LIM)
    assert isinstance(v, Violation)
    assert "VIOLATION live-never-stale" in text
    assert "seed 7" in text
    assert "kill" in text
    assert "read job=j reader=a t0=3.0 state=STALE" in text


def test_after_a_data_loss_the_checkpoints_since_or_else_the_last_before_must_be_kept() -> None:
    h = [r for r in clean() if r["op"] != "dump"]
    h += [
        rec(3.0, "checkpoint", W, job="j", fence=5, n=2, t0=2.9),
        fault("restart", "redis", 3.2, 3.3),
    ]
    dump = {"job": "j", "state": "COMPLETED", "fence": 5, "seq": 6}
    assert rules_of([*h, rec(31.0, "dump", 1, **dump, checkpoints=[2])]) == []
    assert rules_of([*h, rec(31.0, "dump", 1, **dump, checkpoints=[1])]) == ["checkpoint-kept"]
    later = rec(3.8, "checkpoint", W, job="j", fence=5, n=3, t0=3.5)
    assert rules_of([*h, later, rec(31.0, "dump", 1, **dump, checkpoints=[3])]) == []
    assert rules_of([*h, later, rec(31.0, "dump", 1, **dump, checkpoints=[2])]) == [
        "checkpoint-kept"
    ]


@pytest.mark.parametrize("kind", ["restart", "rollback", "failover"])
def test_a_claim_lost_with_the_data_need_not_be_delivered_again(kind: str) -> None:
    h = clean() + BROKEN["delivered-until-acked"]
    assert rules_of([*h, fault(kind, "redis", 22.0, 22.1)]) == []
    assert rules_of([*h, fault(kind, "redis", 20.0, 20.1)]) == ["delivered-until-acked"]


def test_a_terminal_read_served_from_the_cache_after_a_data_loss_is_no_final_state_after_it() -> (
    None
):
    h = [*clean(), fault("restart", "redis", 4.6, 4.7)]  # after j's final write, before a read
    # a COMPLETED read at 5.0 served from a cache filled before the loss, then UNKNOWN
    assert (
        rules_of([*h, read(4.9, "COMPLETED", 5, 6, reader="b"), read(6.0, "UNKNOWN", 0, 0)]) == []
    )
    # without the loss the UNKNOWN read breaks the rule
    assert rules_of([*clean(), read(6.0, "UNKNOWN", 0, 0)]) == ["final-never-overwritten"]


def test_a_gil_hold_excuses_no_stale_verdict_for_a_job_the_sidecar_beats() -> None:
    h = [dict(r, sidecar=True) if r["op"] == "acquire" else r for r in clean()]
    gil = fault("gil", W, 1.2, 1.4)
    assert rules_of([*h, *BROKEN["live-never-stale"], gil]) == ["live-never-stale"]
    killed = fault("sidecar_kill", W, 1.2, 1.2)  # its helper killed: unbeaten until it learns
    assert rules_of([*h, *BROKEN["live-never-stale"], killed]) == []


def test_a_dead_job_taken_over_by_its_next_attempt_in_time_needs_no_claim() -> None:
    taken = rec(22.0, "acquire", W2 + 10, job="j3", fence=2, attempt=2, t0=21.9)
    done = rec(23.0, "final", W2 + 10, job="j3", fence=2, status="COMPLETED", t0=22.9)
    assert rules_of([*clean(), *BROKEN["dead-job-claimed"], taken, done]) == []
    late = dict(taken, t=27.0, t0=26.9)  # after ttl + claim_within (26)
    assert rules_of([*clean(), *BROKEN["dead-job-claimed"], late, dict(done, t=28.0)]) == [
        "dead-job-claimed"
    ]


def test_no_progress_is_excused_by_faults_only_for_their_reach() -> None:
    stuck = BROKEN["worker-progress"]
    assert rules_of([*clean(), *stuck, fault("stop", W3, 13.0, 17.0)]) == []  # 13 s - 11 s
    assert rules_of([*clean(), *stuck, fault("cut", "net", 13.0, 13.0)]) == []  # 13 s - 7 s
    assert rules_of([*clean(), *stuck, fault("stop", W2, 13.0, 17.0)]) == ["worker-progress"]
    assert rules_of([*clean(), *stuck, fault("stop", W3, 1.0, 2.0)]) == ["worker-progress"]


def test_a_worker_silent_until_the_end_is_named_a_queue_child_between_jobs_is_not() -> None:
    silent = [rec(11.0, "acquire", W3, job="p", fence=1, attempt=1, t0=10.9),
              rec(12.0, "final", W3, job="p", fence=1, status="COMPLETED", t0=11.9)]  # fmt: skip
    assert rules_of([*clean(), *silent]) == ["worker-progress"]  # nothing from 12 to 31
    queue = [dict(r, shell="celery") if r["op"] == "acquire" else r for r in silent]
    assert rules_of([*clean(), *queue]) == []
    assert rules_of([*clean(), *silent, fault("kill", W3, 14.0, 14.0)]) == []


def _queue(*extra: Record) -> list[Record]:
    node = {"node": "q.1", "node_pid": N}
    return [*clean(), rec(1.0, "exec_start", W, task="q", **node),
            rec(2.0, "exec_end", W, task="q", outcome="completed", **node),
            rec(5.0, "exec_start", W2, task="q", node="q2.1", node_pid=N + 1), *extra]  # fmt: skip


def test_a_completed_task_may_run_again_only_if_its_delivery_came_back() -> None:
    assert rules_of(_queue()) == ["queue-completed-not-rerun"]
    # its node killed before it acknowledged the delivery: the delivery is restored
    assert rules_of(_queue(fault("kill", N, 2.5, 2.5))) == []
    acked = rec(2.2, "q_ack", N, task="q")
    assert rules_of(_queue(acked, fault("kill", N, 2.5, 2.5))) == ["queue-completed-not-rerun"]
    assert rules_of(_queue(fault("kill", N + 7, 2.5, 2.5))) == ["queue-completed-not-rerun"]
    # kombu put the node's deliveries back on the queue (its connection was lost)
    restored = rec(1.5, "q_restore", N, tasks=["q", "other"])
    got = rec(0.9, "q_received", N, task="q")
    assert rules_of(_queue(got, restored, acked)) == []
    assert rules_of(_queue(got, dict(restored, tasks=["other"]), acked)) == [
        "queue-completed-not-rerun"
    ]
    # another node that held a copy put it back: the copy may run again too
    assert rules_of(_queue(got, dict(restored, pid=N + 1), acked)) == []
    # a restore before the receipt that led to the run put back an earlier copy, not this one
    assert rules_of(_queue(got, dict(restored, t=0.8), acked)) == ["queue-completed-not-rerun"]


def _rollback(saved: float, restarted: float) -> Record:
    return dict(fault("rollback", "redis", restarted, restarted + 0.1), saved=saved)


def test_a_rollback_that_undid_the_receipt_or_the_ack_lets_the_task_run_again() -> None:
    acked = rec(2.2, "q_ack", N, task="q")
    got = rec(0.9, "q_received", N, task="q")
    # the server back on an RDB taken before the acknowledgement: the delivery is unacked again
    assert rules_of(_queue(got, acked, _rollback(2.0, 3.0))) == []
    # ... taken before the receipt and restarted while the task ran: the message is back on the
    # queue (the CI failure of stop 31: the node received the copy and ran it once the first
    # run completed)
    assert rules_of(_queue(got, acked, _rollback(0.8, 1.5))) == []
    # an RDB taken after the acknowledgement, or one the server went back to after the rerun
    # started, undid neither
    assert rules_of(_queue(got, acked, _rollback(2.5, 3.0))) == ["queue-completed-not-rerun"]
    assert rules_of(_queue(got, acked, _rollback(0.8, 5.5))) == ["queue-completed-not-rerun"]
    # an RDB taken after the receipt and before the acknowledgement, restarted before the
    # acknowledgement: neither undone
    assert rules_of(_queue(got, acked, _rollback(1.2, 1.5))) == ["queue-completed-not-rerun"]
    # an older history's rollback record has no ``saved``: the RDB taken when the restart began
    assert rules_of(_queue(got, acked, fault("rollback", "redis", 3.0, 3.1))) == [
        "queue-completed-not-rerun"
    ]


def test_a_job_run_again_from_attempt_1_after_a_data_loss_is_another_attempt() -> None:
    """A restart that lost the data starts the job again from attempt 1 under a newer fence:
    its claim is not the first attempt's claimed twice, and its writes after the first claim
    are not the fenced-out attempt's (an attempt is its acquire's fence, not its number)."""
    h = clean()
    h += [
        fault("restart", "redis", 18.0, 18.0),
        rec(19.0, "acquire", W3, job="k", fence=20, attempt=1, t0=18.9),
        rec(20.0, "checkpoint", W3, job="k", fence=20, n=2, t0=19.9),
        fault("kill", W3, 21.0, 21.0),
        rec(27.0, "deliver", S, job="k", attempt=1, fence=21, checkpoint=2),
        rec(27.1, "ack", S, job="k", attempt=1, fence=21),
    ]
    assert rules_of(h) == []
    twice = [
        *clean(),
        rec(17.5, "deliver", S, job="k", attempt=1, fence=11, checkpoint=4),
        rec(17.6, "ack", S, job="k", attempt=1, fence=11),
    ]
    assert rules_of(twice) == ["claimed-once"]  # the same attempt (fence 9) claimed again


def _rerun_in_the_same_child(restored_at: float) -> list[Record]:
    """Node N got q at 0.9, its child W ran it from 1.0 to 2.0 (acked); kombu restored the
    running task's delivery at ``restored_at``; the node received the copy again at 1.6 (with
    another task after it) and the same child ran it after the first run completed."""
    node = {"node": "q.1", "node_pid": N}
    return [*clean(), rec(0.9, "q_received", N, task="q"),
            rec(1.0, "exec_start", W, task="q", **node),
            rec(restored_at, "q_restore", N, tasks=["q"]),
            rec(1.6, "q_received", N, task="q"), rec(1.7, "q_received", N, task="other"),
            rec(2.0, "exec_end", W, task="q", outcome="completed", **node),
            rec(2.1, "q_ack", N, task="q"),
            rec(2.2, "exec_start", W, task="q", **node),
            rec(3.0, "exec_end", W, task="q", outcome="completed", **node)]  # fmt: skip


def test_a_copy_restored_while_the_task_ran_may_run_again_after_it_completed() -> None:
    # the receipt that led to the completed run is the last one before its start (0.9), not
    # the node's last receipt before its end (the copy's, 1.6, or another task's, 1.7)
    assert rules_of(_rerun_in_the_same_child(1.5)) == []
    # restored before that receipt: the run's own delivery never came back
    assert rules_of(_rerun_in_the_same_child(0.8)) == ["queue-completed-not-rerun"]


def test_a_lawful_redelivery_of_a_completed_task_runs_the_id_again_as_a_new_attempt() -> None:
    """The queue delivers a completed task again (kombu restored it): the new run acquires the
    id under a newer fence and reads RUNNING, which is no final state overwritten; the same run
    again without a lawful redelivery is named by both rules."""
    job = [rec(1.05, "acquire", W, job="q", fence=30, attempt=1, t0=1.0),
           rec(2.0, "final", W, job="q", fence=30, status="COMPLETED", t0=1.95),
           rec(5.05, "acquire", W2, job="q", fence=31, attempt=2, t0=5.0),
           read(6.0, "RUNNING", 31, 9, job="q"), rec(7.0, "final", W2, job="q", fence=31,
           status="COMPLETED", t0=6.9), read(8.0, "COMPLETED", 31, 10, job="q")]  # fmt: skip
    restored = rec(1.5, "q_restore", N, tasks=["q"])
    got = rec(0.9, "q_received", N, task="q")
    acked = rec(2.2, "q_ack", N, task="q")
    assert rules_of(_queue(got, restored, acked, *job)) == []
    assert rules_of(_queue(got, acked, *job)) == [
        "final-never-overwritten",
        "queue-completed-not-rerun",
    ]


def event(t: float, kind: str, fence: int, seq: int, job: str = "j") -> Record:
    return rec(t, "event", R, job=job, reader="watch", t0=t - 0.1, kind=kind, id=f"{t}-0",
               state="RUNNING", fence=fence, seq=seq, synthetic=False)  # fmt: skip


def test_a_watch_that_yields_an_earlier_entry_after_a_later_one_breaks_reader_monotonic() -> None:
    h = [*clean(), event(1.2, "start", 5, 1), event(2.2, "checkpoint", 5, 3)]
    assert rules_of(h) == []
    assert rules_of([*h, event(2.6, "beat", 5, 2)]) == ["reader-monotonic"]


def test_a_stream_event_is_judged_by_reader_monotonic_only() -> None:
    # history: an entry of fence 5 yielded after the claim set fence 10 and after j's final
    late = [event(18.0, "beat", 9, 3, job="k"), event(6.0, "beat", 5, 6)]
    assert rules_of(clean() + late) == []


def test_a_long_poll_answering_older_than_the_etag_it_was_given_breaks_reader_monotonic() -> None:
    lp = read(2.6, "RUNNING", 5, 2, reader="longpoll")
    assert rules_of([*clean(), {**lp, "given": [5, 3]}]) == ["reader-monotonic"]
    assert rules_of([*clean(), {**lp, "given": [5, 2]}]) == []  # a 304: the version given


def test_each_reader_kind_of_one_process_is_judged_apart() -> None:
    # the etag reader's (5, 2) after the cache reader's (5, 3): two readers, no order between
    assert rules_of([*clean(), read(2.8, "RUNNING", 5, 2, reader="etag")]) == []


def test_a_claim_cleared_by_a_new_attempt_need_not_be_delivered_again() -> None:
    """A new acquire (a queue's redelivery) clears an unacknowledged claim (claim.lua): nothing
    is left to deliver (seed 62288250: Celery ran the task again before the next redelivery)."""
    h = clean() + BROKEN["delivered-until-acked"]
    again = rec(23.0, "acquire", W, job="j2", fence=3, attempt=2, t0=22.9)
    assert rules_of([*h, again]) == []
    # an acquire before the delivery, or under an older fence, clears nothing
    assert rules_of([*h, dict(again, t=20.5)]) == ["delivered-until-acked"]
    assert rules_of([*h, dict(again, fence=1)]) == ["delivered-until-acked"]


def test_a_304_after_a_data_loss_is_no_read_of_the_final_state() -> None:
    """After a rollback took back j's final write, an ETag request that held COMPLETED gets a 304
    (the server's version is not newer) and a cached reader shows RUNNING again: the 304 is the
    client's own copy, not a final state read after the loss (seed 62288250)."""
    lost = [
        fault("rollback", "redis", 4.5, 4.6),
        read(6.0, "RUNNING", 5, 5, reader="b"),
        {**read(5.2, "COMPLETED", 5, 6, reader="etag"), "http": 304, "given": [5, 6]},
    ]
    h = [r for r in clean() if not (r["op"] == "read" and r["state"] == "COMPLETED")]
    assert rules_of([*h, *lost[:2]]) == []
    assert rules_of([*h, *lost]) == []
    assert rules_of([*h, *lost[:2], {**lost[2], "http": 200}]) == ["final-never-overwritten"]
