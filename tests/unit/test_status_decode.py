"""Decoding a snapshot read into a JobStatus, and a stream entry into an Event (no Redis)."""

from __future__ import annotations

import dataclasses

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from jobpulse import Event, JobState, JobStatus, ProtocolError
from jobpulse._protocol.codec import parse_stream_id
from jobpulse._reader.event import decode_event
from jobpulse._reader.status import (
    ALL_FIELDS,
    check_fields,
    decode_snapshot,
    decode_values,
    live_statuses,
)

NOW = 1_700_000_010_000

RUNNING = {
    "status": "RUNNING", "stage": "load", "done": "25", "total": "100", "rate": "12.5",
    "eta_s": "6", "rss_bytes": "1048576", "cpu_s": "1.25", "loop_lag_ms": "2.5", "seq": "7",
    "fence": "3", "attempt": "2", "worker": "host:1", "started_ms": "1700000000000",
    "heartbeat_ms": "1700000009000", "progress_ms": "1700000004000", "finished_ms": None,
    "error": None, "meta": '{"user": "ada"}', "cancel": None,
}  # fmt: skip


def test_running_snapshot_decodes_every_field() -> None:
    s = decode_snapshot("j", RUNNING, 4000, NOW)
    assert s.state is JobState.RUNNING
    assert (s.done, s.total, s.percent) == (25, 100, 25.0)
    assert s.rate == 12.5
    assert s.eta == 6.0
    assert s.cpu_seconds == 1.25
    assert s.loop_lag == pytest.approx(0.0025)
    assert (s.seq, s.fence, s.attempt, s.worker) == (7, 3, 2, "host:1")
    assert s.heartbeat_age == pytest.approx(1.0)
    assert s.progress_age == pytest.approx(6.0)  # alive, not advancing
    assert s.meta == {"user": "ada"}
    assert s.cancel_requested is False
    assert s.finished_ms is None
    assert s.error is None
    assert s.as_dict()["state"] == "RUNNING"


def test_decoded_status_is_the_frozen_dataclass_a_keyword_build_gives() -> None:
    """The decoder sets the slots directly (no keyword ``__init__``): the result is still a
    frozen ``JobStatus``, equal to the one ``JobStatus(...)`` builds from the same values."""
    s = decode_snapshot("j", {**RUNNING, "cancel": "1", "kind": "etl"}, 4000, NOW)
    expected = JobStatus(
        job_id="j", state=JobState.RUNNING, stage="load", done=25, total=100, percent=25.0,
        rate=12.5, eta=6.0, rss_bytes=1048576, cpu_seconds=1.25, loop_lag=0.0025, seq=7,
        fence=3, attempt=2, worker="host:1", heartbeat_age=1.0, progress_age=6.0, error=None,
        meta={"user": "ada"}, kind="etl", started_ms=1700000000000,
        heartbeat_ms=1700000009000, progress_ms=1700000004000, finished_ms=None,
        cancel_requested=True, server_ms=NOW,
    )  # fmt: skip
    assert s == expected
    assert repr(s) == repr(expected)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.done = 1  # type: ignore[misc]


def test_running_without_liveness_key_is_stale() -> None:
    assert decode_snapshot("j", RUNNING, -2, NOW).state is JobState.STALE
    assert decode_snapshot("j", RUNNING, -1, NOW).state is JobState.RUNNING  # key without TTL


@pytest.mark.parametrize("status", ["COMPLETED", "FAILED", "CANCELLED", "LOST"])
def test_terminal_states_are_never_stale(status: str) -> None:
    s = decode_snapshot("j", {**RUNNING, "status": status}, -2, NOW)
    assert s.state is JobState(status)
    assert s.state.is_terminal
    assert s.state.is_settled


def test_no_status_is_unknown() -> None:
    assert decode_snapshot("j", dict.fromkeys(RUNNING), -2, NOW).state is JobState.UNKNOWN
    # a foreign hash with fields but no status
    foreign = {**RUNNING, "status": None, "done": "x"}
    assert decode_snapshot("j", foreign, -2, NOW).state is JobState.UNKNOWN


def test_percent_needs_a_positive_total_and_is_capped() -> None:
    assert decode_snapshot("j", {**RUNNING, "total": None}, 1, NOW).percent is None
    assert decode_snapshot("j", {**RUNNING, "total": "0"}, 1, NOW).percent is None
    assert decode_snapshot("j", {**RUNNING, "done": "150"}, 1, NOW).percent == 100.0


def test_percent_has_two_decimals_rounded_down() -> None:
    """Issue 25: the JSON and SSE carried 48.86666666666667; 99,999 of 100,000 is not 100."""
    exact = {**RUNNING, "done": "733", "total": "1500"}
    assert decode_snapshot("j", exact, 1, NOW).percent == 48.86
    almost = {**RUNNING, "done": "99999", "total": "100000"}
    assert decode_snapshot("j", almost, 1, NOW).percent == 99.99
    third = {**RUNNING, "done": "1", "total": "3"}
    assert decode_snapshot("j", third, 1, NOW).percent == 33.33


def test_ages_never_negative() -> None:
    s = decode_snapshot("j", {**RUNNING, "heartbeat_ms": str(NOW + 5)}, 1, NOW)
    assert s.heartbeat_age == 0.0


def test_fields_not_fetched_are_none() -> None:
    s = decode_snapshot("j", {"status": "RUNNING", "done": "3", "seq": "1"}, 1, NOW)
    assert s.done == 3
    assert s.total is None
    assert s.meta is None
    assert s.cancel_requested is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("status", "BOGUS"),
        ("status", "running"),
        ("done", "abc"),
        ("done", "²"),
        ("seq", "1.5"),
        ("fence", ""),
        ("rate", "fast"),
        ("rate", "nan"),
        ("cpu_s", "inf"),
        ("meta", "{not json"),
    ],
)
def test_corrupt_values_raise_protocol_error(field: str, value: str) -> None:
    raw = {**RUNNING, field: value}
    if value == "":
        raw[field] = "x"  # "" is "absent"; a blank is not corrupt
    with pytest.raises(ProtocolError, match=field if field != "status" else "status"):
        decode_snapshot("j", raw, 1, NOW)


def test_values_bytes_and_str_and_non_utf8() -> None:
    names = ["status", "done", "meta"]
    assert decode_values("j", names, [b"RUNNING", b"", None]) == {
        "status": "RUNNING",
        "done": None,
        "meta": None,
    }
    assert decode_values("j", names, ["RUNNING", "1", ""])["done"] == "1"
    with pytest.raises(ProtocolError, match="UTF-8"):
        decode_values("j", names, [b"\xff", None, None])
    with pytest.raises(ProtocolError):
        decode_values("j", names, [None])


def test_check_fields() -> None:
    assert check_fields(None) is None
    assert check_fields(["done", "status"]) == ("done", "status")
    assert set(ALL_FIELDS) >= {"meta", "cancel"}
    with pytest.raises(ValueError, match="percent"):
        check_fields(["percent"])
    with pytest.raises(TypeError):
        check_fields("done")
    with pytest.raises(TypeError):
        check_fields(5)


def test_event_decodes_from_bytes_and_str() -> None:
    raw = {b"kind": b"checkpoint", b"status": b"RUNNING", b"stage": b"", b"done": b"5",
           b"total": b"", b"seq": b"9", b"fence": b"2", b"ts_ms": b"1700000000123",
           b"details": b'{"offset": 10}'}  # fmt: skip
    e = decode_event(b"1700000000123-0", raw)
    assert e == Event(
        id="1700000000123-0", kind="checkpoint", status="RUNNING", done=5, seq=9, fence=2,
        ts=1700000000.123, details={"offset": 10},
    )  # fmt: skip
    assert not e.terminal
    s = decode_event("1-1", {k.decode(): v.decode() for k, v in raw.items()} | {"kind": "end"})
    assert s.terminal
    assert s.done == 5
    assert decode_event("1-2", ["kind", "stale", "status", "LOST"]).terminal


@pytest.mark.parametrize(
    "raw",
    [
        {"status": "RUNNING"},  # no kind
        {"kind": "beat", "done": "many"},
        {"kind": "beat", "details": "{"},
        {b"kind": b"\xfe"},
    ],
)
def test_corrupt_event_raises_protocol_error(raw: dict[object, object]) -> None:
    with pytest.raises(ProtocolError):
        decode_event("1-0", raw)


def test_parse_stream_id() -> None:
    assert parse_stream_id("1700000000000-3") == (1700000000000, 3)
    assert parse_stream_id(b"5") == (5, 0)
    assert parse_stream_id("2-0") > parse_stream_id("1-99")
    for bad in ("", "-1", "1-", "a-1", "1-2-3", "\u0661-1"):  # the last: an Arabic-Indic digit
        with pytest.raises(ValueError, match="stream id"):
            parse_stream_id(bad)


def test_a_job_list_shows_running_and_stale_jobs_and_skips_corrupt_ones() -> None:
    def status(job: str, state: JobState) -> JobStatus:
        return JobStatus(job_id=job, state=state)

    running, stale = status("a", JobState.RUNNING), status("b", JobState.STALE)
    results = [running, status("c", JobState.COMPLETED), ProtocolError("corrupt"), stale]
    assert live_statuses(results) == [running, stale]
    down = RedisConnectionError("down")
    with pytest.raises(RedisConnectionError):
        live_statuses([running, down])
