"""The beat state machine, the beat plan and the typed calls: no Redis, no sleeping."""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

import pytest

from jobpulse import JobBusy, LeaseLostCause
from jobpulse._protocol import calls
from jobpulse._protocol.calls import AcquireCode, AcquireReply, BeatCode, BeatReply, FinishCode
from jobpulse._protocol.codec import DYNAMIC_FIELDS
from jobpulse._worker.machine import BeatMachine
from jobpulse._worker.options import HeartbeatSpec
from jobpulse._worker.plan import BATCH, BeatPlan, beat_calls
from jobpulse._worker.sampling import ProcessSample

SAMPLE = ProcessSample(rss_bytes=1000, cpu_seconds=0.5)


def machine(**options: Any) -> BeatMachine[str]:
    settings: dict[str, Any] = dict(
        total=None, interval=1.0, ttl=6.0, namespace="t", meta=None, kind="", worker="w",
        stream_every=10, maxlen=1000, retention=3600.0, max_meta_bytes=65536,
        max_details_bytes=65536, final_timeout=30.0, index_every=10, index_shards=1,
    )  # fmt: skip
    settings.update(options)
    m: BeatMachine[str] = BeatMachine("job", HeartbeatSpec(**settings))
    m.acquired(AcquireReply(AcquireCode.STARTED, 3, 1, 0, "", 1000), sent_at=100.0)
    return m


def written(seq: int = 0, cancel: bool = False) -> BeatReply:
    return BeatReply(BeatCode.WRITTEN, cancel, 5000, seq)


def parse(args: list[Any]) -> tuple[int, dict[str, str], tuple[Any, ...] | None, list[Any]]:
    """A beat command as (seq, fields sent, event (kind, details, maxlen) or None, pairs)."""
    # the segment's length (negated: sent with the regular path's keys), then token fence ttl
    assert abs(args[0]) == len(args) - 1
    seq, names, rest = args[4], args[6], args[7:]  # (args[5]: landed)
    digits = names.lstrip("~=").rstrip("+")
    fields = {calls.BEAT_FIELDS[int(d) - 1]: rest[i] for i, d in enumerate(digits)}
    rest = rest[len(digits) :]
    event = None
    if names.endswith("+"):
        event, rest = tuple(rest[:3]), rest[3:]
    return seq, fields, event, rest


def test_dynamic_fields_agree_with_lib_lua_and_beat_lua() -> None:
    folder = resources.files("jobpulse._protocol").joinpath("lua")
    for name, table in (("_lib.lua", "DYNAMIC"), ("beat.lua", "FIELDS")):
        match = re.search(table + r" = \{([^}]*)\}", folder.joinpath(name).read_text())
        assert match is not None
        assert tuple(re.findall(r"'([a-z_]+)'", match.group(1))) == DYNAMIC_FIELDS
    assert calls.BEAT_FIELDS == DYNAMIC_FIELDS


def test_acquire_refusals_raise_before_anything_runs() -> None:
    m: BeatMachine[str] = machine()
    with pytest.raises(JobBusy):
        m.acquired(AcquireReply(AcquireCode.BUSY), 0.0)
    with pytest.raises(TimeoutError, match="too late"):
        m.acquired(AcquireReply(AcquireCode.TOO_LATE), 0.0)


def test_first_beat_is_due_one_interval_after_the_acquire_and_seq_grows() -> None:
    m = machine()
    assert m.due == 101.0
    args = m.next_beat(101.0, 0.0, SAMPLE, 5, None)
    assert parse(args)[0] == 1
    assert not m.ready  # one beat in flight at a time
    m.replied(101.0, written(), ended=False)
    assert m.ready
    assert m.due == 102.0


def test_a_stage_change_rides_the_next_beat_and_is_resent_after_a_failure() -> None:
    m = machine()
    assert m.set_stage("load") is True
    assert m.set_stage("load") is False
    assert parse(m.next_beat(101.0, 0.0, SAMPLE, 0, None))[2] == ("stage", "", 1000)
    m.beat_failed(101.0, at_once=False, ended=False)
    assert m.due == 101.25
    assert parse(m.next_beat(101.25, 0.0, SAMPLE, 0, None))[2] == ("stage", "", 1000)


def test_checkpoint_handle_is_resolved_by_the_reply_that_wrote_it() -> None:
    m = machine()
    m.add_checkpoint('{"a":1}', "handle", now=100.5)
    assert m.due == 100.5
    args = m.next_beat(100.5, 0.0, SAMPLE, 0, None)
    assert parse(args)[2] == ("checkpoint", '{"a":1}', 1000)
    assert parse(args)[3] == ["checkpoint", '{"a":1}']
    verdict = m.replied(100.5, written(), ended=False)
    assert verdict.resolved == "handle"


def test_seq_behind_jumps_forward_and_resends_at_once() -> None:
    m = machine()
    m.add_checkpoint("{}", "h", now=101.0)
    m.next_beat(101.0, 0.0, SAMPLE, 0, None)
    verdict = m.replied(101.0, BeatReply(BeatCode.SEQ_BEHIND, False, 5000, 40), ended=False)
    assert verdict.resolved is None
    assert m.seq == 40
    assert m.due == 101.0
    assert parse(m.next_beat(101.0, 0.0, SAMPLE, 0, None))[0] == 41


def test_a_regular_beat_sends_state_and_alive_and_an_entry_adds_events() -> None:
    m = machine()
    keys = m.schema.job("job")
    regular = m.next_beat(101.0, 0.0, SAMPLE, 0, None)
    assert regular[0] == 1 - len(regular)  # negated: the regular path's keys only
    assert m.beat_keys == (keys.state.encode(), keys.alive.encode())
    m.replied(101.0, written(), ended=False)
    m.add_checkpoint("{}", "h", now=101.5)
    checkpoint = m.next_beat(101.5, 0.0, SAMPLE, 0, None)
    assert parse(checkpoint)[2] == ("checkpoint", "{}", 1000)
    assert m.beat_keys == tuple(k.encode() for k in (keys.state, keys.alive, keys.events))


def test_resend_keys_sends_the_same_beat_at_once_with_every_key() -> None:
    m = machine()
    m.add_checkpoint('{"a":1}', "h", now=101.0)
    first = m.next_beat(101.0, 0.0, SAMPLE, 0, None)
    verdict = m.replied(101.0, BeatReply(BeatCode.RESEND_KEYS, False, 0, 0), ended=False)
    assert (verdict.lost, verdict.resolved, verdict.failed) == (None, None, [])
    assert m.due == 101.0
    assert m.ready
    again = m.next_beat(101.0, 0.0, SAMPLE, 0, None)
    assert again[0] == len(again) - 1  # every key
    assert m.beat_keys == tuple(k.encode() for k in m.schema.job("job").beat())
    assert parse(again)[0] == parse(first)[0]  # same seq: a replay-safe retry
    assert parse(again)[2] == parse(first)[2] == ("checkpoint", '{"a":1}', 1000)
    retaken = m.replied(101.1, BeatReply(BeatCode.RETAKEN, False, 5000, 0), ended=False)
    assert retaken.resolved == "h"
    after = m.next_beat(102.0, 0.0, SAMPLE, 0, None)
    assert after[0] < 0  # back to the regular path's keys
    assert parse(after)[0] == parse(first)[0] + 1


def test_resend_static_after_data_loss() -> None:
    m = machine(kind="etl")
    m.next_beat(101.0, 0.0, SAMPLE, 0, None)
    m.replied(101.0, BeatReply(BeatCode.RESEND_STATIC, False, 5000, 1), ended=False)
    assert m.due == 101.0
    assert m.index_due()
    args = m.next_beat(101.0, 0.0, SAMPLE, 0, None)
    assert args[-10:] == [
        "attempt",
        1,
        "worker",
        "w",
        "started_ms",
        1000,
        "meta",
        "",
        "kind",
        "etl",
    ]


@pytest.mark.parametrize(
    ("code", "cause"),
    [
        (BeatCode.TAKEN_OVER, LeaseLostCause.TAKEN_OVER),
        (BeatCode.FENCED_OUT, LeaseLostCause.FENCED_OUT),
    ],
)
def test_a_lost_lease_fails_every_checkpoint_and_writes_nothing(
    code: BeatCode, cause: LeaseLostCause
) -> None:
    m = machine()
    m.add_checkpoint("{}", "sent", now=101.0)
    m.next_beat(101.0, 0.0, SAMPLE, 0, None)
    m.add_checkpoint("{}", "queued", now=101.0)
    verdict = m.replied(101.0, BeatReply(code, False, 0, 0), ended=False)
    assert verdict.lost is cause
    assert verdict.failed == ["sent", "queued"]
    plan = m.final_plan(crash=None, exc=None, cancelled=False)
    assert plan.status == "LOST"
    assert plan.write is False


def test_expiry_by_the_local_clock_writes_lost_for_one_interval_at_most() -> None:
    m = machine()
    m.next_beat(101.0, 0.0, SAMPLE, 0, None)  # sent in time, never answered
    assert m.check_expiry(105.9).cause is None
    assert m.check_expiry(106.0).cause is LeaseLostCause.EXPIRED
    assert m.check_expiry(107.0).cause is None  # lost once
    plan = m.final_plan(crash=None, exc=None, cancelled=False)
    assert (plan.status, plan.error, plan.write, plan.limit) == (
        "LOST", "lease lost: expired", True, 1.0,
    )  # fmt: skip


def test_a_late_wake_beats_at_once_and_the_reply_takes_the_lease_back() -> None:
    """No beat was sent before the deadline (the process was frozen): not lost; a beat is due
    at once, and ``beat.lua``'s "re-taken" renews the lease."""
    m = machine()
    expiry = m.check_expiry(120.0)
    assert (expiry.cause, expiry.recheck_at) == (None, 121.0)
    assert m.due <= 120.0
    assert m.lease.held
    m.next_beat(120.0, 19.0, SAMPLE, 0, None)
    assert m.check_expiry(120.5).cause is None  # the late beat's reply decides
    m.replied(120.0, BeatReply(BeatCode.RETAKEN, False, 5000, 0), ended=False)
    assert m.lease.held
    assert m.lease.deadline == 126.0
    assert m.final_plan(crash=None, exc=None, cancelled=False).status == "COMPLETED"


def test_a_late_beat_that_is_refused_or_fails_loses_the_lease() -> None:
    claimed = machine()
    claimed.check_expiry(120.0)
    claimed.next_beat(120.0, 19.0, SAMPLE, 0, None)
    verdict = claimed.replied(120.0, BeatReply(BeatCode.FENCED_OUT, False, 0, 0), ended=False)
    assert verdict.lost is LeaseLostCause.FENCED_OUT  # a sweeper claimed it: stays lost
    assert claimed.final_plan(crash=None, exc=None, cancelled=False).write is False
    unanswered = machine()
    unanswered.check_expiry(120.0)
    unanswered.next_beat(120.0, 19.0, SAMPLE, 0, None)
    cause = unanswered.beat_failed(120.0, at_once=False, ended=False)
    assert cause is LeaseLostCause.EXPIRED
    in_time = machine()
    in_time.next_beat(101.0, 0.0, SAMPLE, 0, None)
    assert in_time.beat_failed(101.0, at_once=False, ended=False) is None  # retried


def test_a_cancel_is_reported_once() -> None:
    m = machine()
    m.next_beat(101.0, 0.0, SAMPLE, 0, None)
    assert m.replied(101.0, written(cancel=True), ended=False).cancel is True
    m.next_beat(102.0, 0.0, SAMPLE, 0, None)
    assert m.replied(102.0, written(cancel=True), ended=False).cancel is False
    assert m.final_plan(crash=None, exc=None, cancelled=False).status == "CANCELLED"


def test_final_status_rules() -> None:
    m = machine()
    assert m.final_plan(crash=None, exc=None, cancelled=False).status == "COMPLETED"
    failed = m.final_plan(crash=None, exc=ValueError("bad"), cancelled=False)
    assert (failed.status, failed.error) == ("FAILED", "ValueError: bad")
    assert m.final_plan(crash=None, exc=None, cancelled=True).status == "CANCELLED"
    crash = m.final_plan(crash=RuntimeError("bug"), exc=None, cancelled=True)
    assert (crash.status, crash.error) == ("FAILED", "RuntimeError: bug")


def test_a_reply_after_the_end_changes_nothing() -> None:
    m = machine()
    m.next_beat(101.0, 0.0, SAMPLE, 0, None)
    verdict = m.replied(101.0, BeatReply(BeatCode.TAKEN_OVER, True, 0, 0), ended=True)
    assert verdict.lost is None
    assert m.lease.held


def test_late_beats_keep_no_burst() -> None:
    m = machine()
    m.next_beat(105.0, 4.0, SAMPLE, 0, None)
    verdict = m.replied(105.0, written(), ended=False)
    assert verdict.late is True
    assert m.due == 106.0


def test_finish_call_encodes_the_final_state() -> None:
    m = machine()
    call = m.finish_call("FAILED", "E: x" * 1000, None, 3, 10)
    assert call.script.name == "finish"
    assert call.args[4] == "FAILED"
    assert len(call.args[5]) == 1000
    assert m.finished(FinishCode.WRITTEN) is True
    assert m.finished(FinishCode.FENCED_OUT) is False
    assert m.lease.lost is LeaseLostCause.FENCED_OUT


class _Job:
    def __init__(self, due: float) -> None:
        self.machine = machine()
        self.machine.due = due


def test_plan_takes_due_jobs_and_coalesces_within_a_tenth_of_the_interval() -> None:
    plan: BeatPlan[Any] = BeatPlan()
    early, soon, later = _Job(10.0), _Job(10.09), _Job(10.5)
    for job in (later, soon, early):
        plan.add(job)
    assert plan.first() == 10.0
    assert plan.take_due(10.0) == [early, soon]
    assert plan.take_due(10.0) == []
    later.machine.due = 12.0
    plan.schedule(later)  # the old entry (10.5) is stale now
    assert plan.take_due(11.0) == []
    plan.remove(later)
    assert plan.take_due(13.0) == []
    assert len(plan) == 2


def test_calls_name_their_codes() -> None:
    reply = calls.decode_beat([b"-1", b"0", b"0", b"0"])
    assert reply.code is BeatCode.TAKEN_OVER
    assert calls.cancel(("a",) * 5, 10, "").decode(2) is calls.CancelCode.ALREADY_REQUESTED
    acquire = calls.acquire(("a",) * 5, token="t", ttl_ms=1, maxlen=1, worker="w")
    acquired = acquire.decode([1, 4, 2, 9, b'{"x":1}', 77])
    assert acquired == AcquireReply(AcquireCode.STARTED, 4, 2, 9, '{"x":1}', 77)
    claim = calls.claim(("a",) * 5, maxlen=1, retention_ms=1, error="", redeliver_ms=1, token="")
    claimed = claim.decode([1, 8, 1234, b"status", b"RUNNING", b"attempt", b"2"])
    assert claimed == calls.ClaimReply(
        calls.ClaimCode.CLAIMED, 8, 1234, {"status": "RUNNING", "attempt": "2"}
    )
    assert claim.decode([-1, 700]) == calls.ClaimReply(calls.ClaimCode.ALIVE, wait_ms=700)
    assert claim.decode([0]).code is calls.ClaimCode.NOT_RUNNING
    assert calls.enroll("s", "j", 5).command()[:3] == ("EVALSHA", calls.SCRIPTS.enroll.sha, 1)


def test_a_failed_checkpoint_beat_is_resent_with_its_seq_so_a_replay_records_it_once() -> None:
    """The first send may have run (its reply lost): resending the same checkpoint under the
    same seq lets beat.lua answer it as a replay instead of recording it twice."""
    m = machine()
    m.add_checkpoint('{"step":1}', "handle", 101.0)
    first = m.next_beat(101.0, 0.0, SAMPLE, 1, None)
    m.beat_failed(101.0, at_once=False, ended=False)
    again = m.next_beat(101.3, 0.0, SAMPLE, 2, None)
    assert parse(again)[0] == parse(first)[0]  # the same seq
    assert parse(again)[2] == parse(first)[2] == ("checkpoint", '{"step":1}', 1000)
    assert m.replied(101.3, written(), ended=False).resolved == "handle"
    # a failed beat without a checkpoint: the next one takes a new seq
    plain = m.next_beat(102.3, 0.0, SAMPLE, 3, None)
    m.beat_failed(102.3, at_once=False, ended=False)
    assert parse(m.next_beat(102.6, 0.0, SAMPLE, 3, None))[0] == parse(plain)[0] + 1


def test_a_beat_sends_only_the_fields_that_differ_from_the_snapshot_it_knows() -> None:
    m = machine(total=10)
    first = parse(m.next_beat(101.0, 0.0, SAMPLE, 0, None))[1]
    assert set(first) == set(calls.BEAT_FIELDS)  # nothing known yet: every field
    m.replied(101.0, written(), ended=False)
    assert parse(m.next_beat(102.0, 0.0, SAMPLE, 0, None))[1] == {"rate": "0"}  # a rate now
    m.replied(102.0, written(), ended=False)
    assert parse(m.next_beat(103.0, 0.0, SAMPLE, 0, None))[1] == {}  # nothing moved
    m.replied(103.0, written(), ended=False)
    m.set_stage("load")
    _, fields, event, _ = parse(m.next_beat(104.0, 0.0, SAMPLE, 4, None))
    assert event == ("stage", "", 1000)
    assert {"done": "4", "total": "", "stage": "load"}.items() <= fields.items()  # with an entry


def test_the_fields_of_a_failed_beat_are_sent_again() -> None:
    m = machine()
    m.next_beat(101.0, 0.0, SAMPLE, 0, None)
    m.replied(101.0, written(), ended=False)
    assert parse(m.next_beat(102.0, 0.0, SAMPLE, 7, None))[1]["done"] == "7"
    m.beat_failed(102.0, at_once=False, ended=False)  # written or not: unknown
    assert parse(m.next_beat(102.25, 0.0, SAMPLE, 7, None))[1]["done"] == "7"


def test_a_reused_seq_may_be_a_replay_so_its_fields_are_sent_again() -> None:
    m = machine()
    m.next_beat(101.0, 0.0, SAMPLE, 0, None)
    m.replied(101.0, written(), ended=False)
    m.add_checkpoint("{}", "h", 101.5)
    m.next_beat(101.5, 0.0, SAMPLE, 3, None)
    m.beat_failed(101.5, at_once=False, ended=False)
    again = parse(m.next_beat(101.75, 0.0, SAMPLE, 5, None))
    assert again[1]["done"] == "5"
    m.replied(101.75, written(), ended=False)  # may have been answered as a replay of done=3
    assert parse(m.next_beat(102.75, 0.0, SAMPLE, 5, None))[1]["done"] == "5"


def test_after_a_data_loss_every_field_and_the_static_ones_are_sent() -> None:
    m = machine(kind="etl")
    m.next_beat(101.0, 0.0, SAMPLE, 0, None)
    m.replied(101.0, written(), ended=False)
    m.next_beat(102.0, 0.0, SAMPLE, 0, None)
    m.replied(102.0, BeatReply(BeatCode.RESEND_STATIC, False, 5000, 0), ended=False)
    assert m.written == 1  # the snapshot lost writes: nothing of that beat was written
    _, fields, _, pairs = parse(m.next_beat(102.0, 0.0, SAMPLE, 0, None))
    assert set(fields) == set(calls.BEAT_FIELDS)
    assert pairs[:2] == ["attempt", 1]


def test_each_beat_says_which_seq_landed_and_a_full_resend_says_none() -> None:
    """``landed`` (the segment's 6th argument) is the acquire's seq, then the seq of the last
    beat answered written; beat.lua answers 3 when the snapshot is behind it. The beat that
    resends every field after that answer carries 0 (it repairs the snapshot, whatever it
    holds), and the beat after it the resend's seq."""
    m = machine()
    first = m.next_beat(101.0, 0.0, SAMPLE, 0, None)
    assert (first[4], first[5]) == (1, 0)  # the acquire answered seq 0
    m.replied(101.0, written(), ended=False)
    second = m.next_beat(102.0, 0.0, SAMPLE, 0, None)
    assert (second[4], second[5]) == (2, 1)
    m.beat_failed(102.0, at_once=False, ended=False)  # unknown: landed stays
    third = m.next_beat(102.25, 0.0, SAMPLE, 0, None)
    assert (third[4], third[5]) == (3, 1)
    m.replied(102.25, BeatReply(BeatCode.RESEND_STATIC, False, 5000, 0), ended=False)
    full = m.next_beat(102.25, 0.0, SAMPLE, 0, None)
    assert (full[4], full[5]) == (4, 0)
    m.beat_failed(102.25, at_once=False, ended=False)  # still every field, still no check
    again = m.next_beat(102.5, 0.0, SAMPLE, 0, None)
    assert (again[4], again[5]) == (5, 0)
    assert set(parse(again)[1]) == set(calls.BEAT_FIELDS)
    m.replied(102.5, written(), ended=False)
    after = m.next_beat(103.5, 0.0, SAMPLE, 0, None)
    assert (after[4], after[5]) == (6, 5)
    assert parse(after)[3] == []  # the static fields are sent no more


def test_a_checkpoint_beat_answered_3_is_resent_and_resolved_by_the_resend() -> None:
    m = machine()
    m.add_checkpoint('{"row":5}', "h", 101.0)
    m.next_beat(101.0, 0.0, SAMPLE, 0, None)
    lost = m.replied(101.0, BeatReply(BeatCode.RESEND_STATIC, False, 5000, 0), ended=False)
    assert lost.resolved is None
    assert lost.failed == []
    assert m.due == 101.0
    _, _, event, pairs = parse(m.next_beat(101.0, 0.0, SAMPLE, 0, None))
    assert event == ("checkpoint", '{"row":5}', 1000)
    assert pairs[:2] == ["checkpoint", '{"row":5}']
    assert m.replied(101.0, written(), ended=False).resolved == "h"


def test_seq_behind_raises_what_the_worker_knows_landed() -> None:
    m = machine()
    m.next_beat(101.0, 0.0, SAMPLE, 0, None)
    m.replied(101.0, BeatReply(BeatCode.SEQ_BEHIND, False, 5000, 40), ended=False)
    assert m.next_beat(101.0, 0.0, SAMPLE, 0, None)[4:6] == [41, 40]


def test_beat_replies_decode_from_one_integer_or_the_seq_behind_array() -> None:
    assert calls.decode_beat(1_700_000_000_123 * 8 + 2 * 1 + 1) == BeatReply(
        BeatCode.WRITTEN, True, 1_700_000_000_123, 0
    )
    assert calls.decode_beat(1_700_000_000_123 * 8 + 2 * 3) == BeatReply(
        BeatCode.RESEND_STATIC, False, 1_700_000_000_123, 0
    )
    assert calls.decode_beat(-2) == BeatReply(BeatCode.FENCED_OUT, False, 0, 0)
    assert calls.decode_beat([0, 1, 5000, 40]) == BeatReply(BeatCode.SEQ_BEHIND, True, 5000, 40)
    with pytest.raises(ValueError, match="unknown beat field"):
        calls.beat_segment(token="t", fence=1, ttl_ms=1, seq=1, fields={"nope": "1"})


class _Beating:
    def __init__(self, job_id: str) -> None:
        self.machine = machine_for(job_id)


def machine_for(job_id: str) -> BeatMachine[str]:
    m: BeatMachine[str] = BeatMachine(
        job_id, HeartbeatSpec(
            total=None, interval=1.0, ttl=6.0, namespace="t", meta=None, kind="", worker="w",
            stream_every=10, maxlen=1000, retention=3600.0, max_meta_bytes=65536,
            max_details_bytes=65536, final_timeout=30.0, index_every=10, index_shards=1,
        ),
    )  # fmt: skip
    m.acquired(AcquireReply(AcquireCode.STARTED, 3, 1, 0, "", 1000), sent_at=100.0)
    return m


def test_beats_are_batched_per_call_and_per_hash_slot_on_a_cluster() -> None:
    jobs = [_Beating(f"j{i}") for i in range(BATCH + 6)]
    beats = [(job, job.machine.next_beat(101.0, 0.0, SAMPLE, 0, None)) for job in jobs]
    single = beat_calls(beats, None)  # type: ignore[type-var]
    assert [len(js) for js, _ in single] == [BATCH, 6]
    command = single[1][1]
    assert command[:3] == ["EVALSHA", calls.SCRIPTS.beat.sha, 12]  # state, alive per job
    assert command[3:5] == list(jobs[BATCH].machine.beat_keys)
    assert command[15:] == [*beats[BATCH][1], *[a for _, seg in beats[BATCH + 1 :] for a in seg]]
    by_slot = beat_calls(beats, lambda key: len(key) % 2)  # type: ignore[type-var]
    for group, _command in by_slot:
        assert len({len(job.machine.beat_keys[0]) % 2 for job in group}) == 1
    assert sorted(len(js) for js, _ in by_slot) == sorted(
        [sum(1 for j in jobs if len(j.machine.beat_keys[0]) % 2 == p) for p in (0, 1)]
    )
