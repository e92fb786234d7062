"""The sweeper's pure parts: decoding a claim reply and checking configuration (no Redis)."""

from __future__ import annotations

import pytest

from jobpulse._protocol import calls
from jobpulse._recovery.sweeper import StaleJob, SweeperConfig, _stale_job
from jobpulse._recovery.tally import prune_bound

_CLAIM = calls.claim(("k",) * 5, maxlen=1, retention_ms=1, error="", redeliver_ms=1, token="")


def stale_job(job_id: str, reply: list[object]) -> StaleJob:
    """The StaleJob of a raw ``claim.lua`` reply, decoded as the sweeper decodes it."""
    return _stale_job(job_id, _CLAIM.decode(reply))


def test_claim_reply_decodes_to_a_stale_job() -> None:
    reply = [1, 5, 10_500, b"status", b"RUNNING", b"attempt", b"2", b"worker", b"h:1"]
    reply += [b"heartbeat_ms", b"9000", b"stage", "load", b"checkpoint", b'{"offset":7}']
    job = stale_job("j", reply)
    assert job == StaleJob(
        job_id="j",
        attempt=2,
        fence=5,
        stale_for=1.5,
        claimed_at_ms=10_500,
        checkpoint={"offset": 7},
        snapshot=job.snapshot,
    )
    assert job.snapshot["status"] == "RUNNING"
    assert (job.worker, job.stage) == ("h:1", "load")
    assert "snapshot" not in repr(job)


def test_missing_or_corrupt_fields_do_not_break_the_claimed_job() -> None:
    job = stale_job("j", [1, 3, 1000, "status", "RUNNING", "checkpoint", "{not json"])
    assert job.checkpoint is None
    assert job.attempt == 0
    assert job.stale_for == 0.0
    started = stale_job("j", [1, 3, 4000, "started_ms", "1000", "heartbeat_ms", ""])
    assert started.stale_for == 3.0  # no beat yet: counted from the start


@pytest.mark.parametrize(
    ("options", "error", "name"),
    [
        ({"batch": 0}, ValueError, "batch"),
        ({"batch": True}, TypeError, "batch"),
        ({"maxlen": -1}, ValueError, "maxlen"),
        ({"retention": 0}, ValueError, "retention"),
        ({"retention": float("inf")}, ValueError, "retention"),
        ({"retention": "1"}, TypeError, "retention"),
    ],
)
def test_config_names_the_bad_field(options: dict[str, object], error: type, name: str) -> None:
    with pytest.raises(error, match=name):
        SweeperConfig(**options)  # type: ignore[arg-type]


def test_the_kinds_prune_stops_below_the_first_kind_that_must_stay() -> None:
    scored = [("a", 1.0), ("b", 2.0), ("c", 3.0)]
    assert prune_bound(scored, [0, 0, 0], cutoff_ms=50, limit=10) == "50"  # all read, all empty
    assert prune_bound(scored, [0, 1, 0], cutoff_ms=50, limit=10) == "(2.0"  # b stays, c too
    assert prune_bound(scored, [0, None, 0], cutoff_ms=50, limit=10) == "(2.0"  # unread: stays
    assert prune_bound(scored, [3, 0, 0], cutoff_ms=50, limit=10) is None
    # a capped read: kinds scored like the last one read may lie beyond it
    assert prune_bound(scored, [0, 0, 0], cutoff_ms=50, limit=3) == "(3.0"
    assert prune_bound([], [], cutoff_ms=50, limit=3) is None
