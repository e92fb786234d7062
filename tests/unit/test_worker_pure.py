"""Pure worker logic: lease decisions, rate and ETA, encodings, the progress cell."""

from __future__ import annotations

import pickle
import threading

import pytest

from jobpulse import JobCancelled, LeaseLostCause, ProgressCell
from jobpulse._protocol import calls
from jobpulse._protocol.calls import BeatCode, BeatReply
from jobpulse._protocol.codec import dump_json, fmt_float, fmt_int
from jobpulse._worker.lease import Lease
from jobpulse._worker.progress import LANES
from jobpulse._worker.sampling import RateWindow


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (5000 * 8 + 1 * 2, BeatReply(BeatCode.WRITTEN, False, 5000, 0)),
        (5000 * 8 + 2 * 2 + 1, BeatReply(BeatCode.RETAKEN, True, 5000, 0)),
        (5000 * 8 + 3 * 2, BeatReply(BeatCode.RESEND_STATIC, False, 5000, 0)),
        ([0, 1, 5000, 40], BeatReply(BeatCode.SEQ_BEHIND, True, 5000, 40)),
        (-1, BeatReply(BeatCode.TAKEN_OVER, False, 0, 0)),
        (-2, BeatReply(BeatCode.FENCED_OUT, False, 0, 0)),
    ],
)
def test_beat_reply_codes(reply: object, expected: BeatReply) -> None:
    """The one reading of ``beat.lua``'s replies (the tickers decode with it)."""
    assert calls.decode_beat(reply) == expected


def test_lease_expires_by_the_local_clock_counted_from_the_send_time() -> None:
    lease = Lease(ttl=6.0, renewed_at=100.0)
    assert not lease.expire_if_due(105.9)
    lease.renewed(103.0)
    assert lease.deadline == 109.0
    lease.renewed(101.0)  # an older reply never moves the deadline back
    assert lease.deadline == 109.0
    lease.tried(104.0)  # a beat sent in time, never answered
    assert not lease.expire_if_due(108.9)
    assert lease.expire_if_due(109.0)
    assert lease.lost is LeaseLostCause.EXPIRED
    assert not lease.lose(LeaseLostCause.TAKEN_OVER)  # the first cause wins
    lease.renewed(200.0)  # a lost lease is never renewed
    assert lease.lost is LeaseLostCause.EXPIRED


def test_a_late_worker_is_not_expired_until_its_late_beat_fails() -> None:
    """No beat sent before the deadline (a frozen process): late, not lost; the next beat
    decides, and only a renewal answered in time or a beat sent in time and unanswered count."""
    lease = Lease(ttl=6.0, renewed_at=100.0)
    assert lease.late(200.0)
    assert not lease.expire_if_due(200.0)
    lease.tried(200.0)  # the late beat is in flight: still late, its reply decides
    assert lease.late(200.5)
    assert not lease.expire_if_due(200.5)
    lease.renewed(200.0)  # beat.lua re-took it
    assert lease.held
    assert lease.deadline == 206.0
    assert lease.tried_at is None


def test_rate_and_eta_over_a_sliding_window() -> None:
    w = RateWindow(window=10.0)
    assert w.rate() is None
    for t in range(0, 30):
        w.add(float(t), t * 5)
    assert w.rate() == pytest.approx(5.0)
    assert w.eta(145, 200) == pytest.approx(11.0)
    assert w.eta(145, None) is None
    w.add(30.0, 0)  # progress went back (a new attempt): the window restarts
    assert w.rate() is None


def test_encodings_are_plain_decimal_strings() -> None:
    assert fmt_int(None) == ""
    assert fmt_int(12) == "12"
    assert fmt_float(1.23456) == "1.235"
    assert fmt_float(2.0) == "2"
    assert fmt_float(float("nan")) == ""
    assert fmt_float(float("inf")) == ""
    assert fmt_float(-0.0001) == "0"
    assert dump_json({"a": [1, "é"]}, limit=100, name="meta") == '{"a":[1,"é"]}'


def test_progress_cell_counts_lanes_and_survives_pickling() -> None:
    cell = ProgressCell(total=10)
    try:
        cell.advance()
        copy = pickle.loads(pickle.dumps(cell))  # what a process pool does
        copy.advance(4)
        copy.set_total(20)
        assert cell.done == 5
        assert cell.total == 20
        assert not copy.cancelled
        cell._cancel()
        assert copy.cancelled
        with pytest.raises(JobCancelled):
            copy.check()
    finally:
        cell._unlink()


def test_threads_advancing_one_cell_are_counted_exactly() -> None:
    cell = ProgressCell()
    try:

        def work() -> None:
            for _ in range(100_000):
                cell.advance()

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert cell.done == 400_000
    finally:
        cell._unlink()


def test_progress_cell_refuses_bad_totals() -> None:
    with pytest.raises(ValueError, match="total"):
        ProgressCell(total=-1)
    cell = ProgressCell()
    try:
        with pytest.raises(TypeError, match="total"):
            cell.set_total(1.5)  # type: ignore[arg-type]
    finally:
        cell._unlink()


def test_leftover_blocks_of_dead_processes_are_removed(tmp_path: object) -> None:
    from pathlib import Path

    d = Path(str(tmp_path))
    (d / "jobpulse_999999999_abc").write_bytes(b"x")  # no such pid
    import os

    (d / f"jobpulse_{os.getpid()}_def").write_bytes(b"x")  # alive: kept
    (d / "other_1_x").write_bytes(b"x")
    assert ProgressCell.remove_leftovers(str(d)) == ["jobpulse_999999999_abc"]
    assert sorted(p.name for p in d.iterdir()) == [f"jobpulse_{os.getpid()}_def", "other_1_x"]


def test_copies_beyond_the_lanes_keep_every_count() -> None:
    """Copy 64 used to write the creator's lane and copy 65 the first copy's: each ``set`` is
    this copy's own count, and a lane handed out again goes on from its count."""
    cell = ProgressCell()
    try:
        cell.set(3)
        for _ in range(150):
            copy = pickle.loads(pickle.dumps(cell))
            copy.set(10)
            del copy  # a pool process drops the task's arguments after the call
        assert cell.done == 1503
        live = [pickle.loads(pickle.dumps(cell)) for _ in range(LANES - 1)]
        for each in live:
            each.advance(2)
        del each
        assert cell.done == 1503 + 2 * (LANES - 1)
        with pytest.raises(RuntimeError, match="alive at once"):
            pickle.dumps(cell)
        live.pop().advance()
        pickle.loads(pickle.dumps(cell)).advance(5)  # a lane came free
        assert cell.done == 1503 + 2 * (LANES - 1) + 1 + 5
    finally:
        cell._unlink()


def test_sampler_lists_child_processes_every_children_every_seconds_and_measures_them() -> None:
    """Listing children reads every process's /proc entry: a sample reuses the list until
    ``children_every`` passed (a new pool child counts from the next listing)."""
    import subprocess
    import sys

    from jobpulse._worker.sampling import ProcessSampler

    now = [0.0]
    sampler = ProcessSampler(lambda: now[0], max_age=0.5, children_every=5.0)
    alone = sampler.sample()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        now[0] = 1.0
        sampler.sample()
        assert child.pid not in sampler._children  # listed at 0 s: not yet looked again
        now[0] = 5.0
        with_child = sampler.sample()
        assert child.pid in sampler._children
        assert with_child.rss_bytes > alone.rss_bytes  # the child's memory counts
    finally:
        child.kill()
        child.wait()
