"""The follow rules of every watch (``_reader/follow.py``): pure, no Redis."""

from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from jobpulse import Event, JobState, JobStatus
from jobpulse._reader.follow import (
    ends_watch,
    follow_from,
    liveness_commands,
    liveness_verdict,
    order_of,
    resume_point,
    superseded,
    synthetic_event,
    wait_step,
)
from jobpulse._reader.status import state_of
from jobpulse.errors import ProtocolError


def _events(*kinds: str) -> list[Event]:
    return [Event(id=f"{i + 1}-0", kind=kind) for i, kind in enumerate(kinds)]


def test_a_terminal_entry_a_later_start_follows_is_superseded() -> None:
    history = _events("start", "stale", "start", "beat", "end")
    assert superseded(history) == {"2-0"}
    assert [ends_watch(e, {"2-0"}) for e in history] == [False, False, False, False, True]


def test_the_last_attempts_end_is_never_superseded() -> None:
    assert superseded(_events("start", "end")) == set()
    assert superseded(_events("start", "end", "start", "end")) == {"2-0"}


def test_an_error_in_the_history_is_skipped_by_the_superseded_rule() -> None:
    items: list[Event | BaseException] = [*_events("start", "end"), ProtocolError("x")]
    assert superseded(items) == set()
    assert superseded([*items, *_events("start")]) == {"2-0"}


def test_a_synthetic_event_always_ends_the_watch() -> None:
    event = synthetic_event(JobState.STALE, cursor="7-0", server_ms=None, wall=1.0)
    assert ends_watch(event, {"7-0"})  # even where a superseded entry shares its id


@pytest.mark.parametrize(
    ("status", "pttl", "verdict"),
    [
        (b"RUNNING", -2, JobState.STALE),
        ("RUNNING", -2, JobState.STALE),
        (b"RUNNING", 900, None),
        (b"COMPLETED", -2, JobState.COMPLETED),
        (b"FAILED", 500, JobState.FAILED),
        (b"CANCELLED", -2, JobState.CANCELLED),
        (b"LOST", -2, JobState.LOST),
        (None, -2, None),  # not started yet: keep following
        (b"", -2, None),
        (b"BOGUS", -2, None),  # not a jobpulse status: says nothing
        (b"\xff", -2, None),  # not UTF-8
        (RedisConnectionError("down"), -2, None),
        (b"RUNNING", RedisConnectionError("down"), None),
    ],
)
def test_the_liveness_verdict(status: object, pttl: object, verdict: JobState | None) -> None:
    assert liveness_verdict(status, pttl) is verdict


def test_the_liveness_verdict_is_the_one_get_makes() -> None:
    for status in ("RUNNING", "COMPLETED", "FAILED", "CANCELLED", "LOST"):
        for pttl in (-2, -1, 1000):
            state = state_of(status, pttl)
            expected = state if state is not None and state.is_settled else None
            assert liveness_verdict(status.encode(), pttl) is expected


def test_the_synthetic_event_names_the_verdict() -> None:
    stale = synthetic_event(JobState.STALE, cursor="5-1", server_ms=None, wall=2.5)
    assert (stale.id, stale.kind, stale.status, stale.synthetic) == ("5-1", "stale", "STALE", True)
    assert stale.ts == 2.5
    end = synthetic_event(JobState.COMPLETED, cursor="0-0", server_ms=9000, wall=2.5)
    assert (end.kind, end.status, end.terminal, end.ts) == ("end", "COMPLETED", True, 9.0)
    assert end.id == "8999-18446744073709551615"  # event.synthetic_event's resume point


def test_the_liveness_check_reads_status_and_pttl() -> None:
    assert liveness_commands("s", "a") == [("HGET", "s", "status"), ("PTTL", "a")]


@pytest.mark.parametrize(
    ("state", "step"),
    [
        (JobState.RUNNING, "follow"),
        (JobState.UNKNOWN, "poll"),
        (JobState.STALE, "settled"),
        (JobState.COMPLETED, "settled"),
        (JobState.FAILED, "settled"),
        (JobState.CANCELLED, "settled"),
        (JobState.LOST, "settled"),
    ],
)
def test_what_wait_does_in_each_state(state: JobState, step: str) -> None:
    assert wait_step(state) == step


def test_wait_follows_from_right_after_the_entry_before_the_newest() -> None:
    assert follow_from([(b"9-0", {}), (b"8-1", {})]) == "8-1"
    assert follow_from([("9-0", {}), ("8-1", {})]) == "8-1"
    assert follow_from([(b"9-0", {})]) is None
    assert follow_from([]) is None


def test_snapshots_order_by_run_then_seq_then_stale_then_cancel() -> None:
    def status(
        fence: int, seq: int, state: JobState = JobState.RUNNING, cancel: bool = False
    ) -> JobStatus:
        return JobStatus(job_id="j", state=state, fence=fence, seq=seq, cancel_requested=cancel)

    ordered = [
        status(1, 9),
        status(1, 9, JobState.STALE),
        status(1, 9, JobState.STALE, cancel=True),
        status(1, 10, JobState.COMPLETED),
        status(2, 1),  # a later run supersedes whatever seq the earlier reached
    ]
    assert sorted(ordered, key=order_of) == ordered
    assert len({order_of(s) for s in ordered}) == len(ordered)


def test_a_watch_resumes_right_after_a_normalised_id_or_from_the_start() -> None:
    assert resume_point(None) == ((0, 0), None)
    assert resume_point("1700000000000-3") == ((1700000000000, 3), "1700000000000-3")
    assert resume_point("1700000000000") == ((1700000000000, 0), "1700000000000-0")
    with pytest.raises(ValueError, match="last_event_id"):
        resume_point("later")
