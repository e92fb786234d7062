"""The pure parts shared by the queue integrations (no Redis)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import threading

import pytest

from jobpulse import JobState
from jobpulse.integrations import PulseOptions, job_id_for, kind_for
from jobpulse.integrations._common import (
    ClaimHold,
    HolderView,
    holder_alive,
    keep_claim,
    keep_claim_sync,
    refresh_delays,
    run_in_thread,
)
from tests.support import eventually

VALID = re.compile(r"[A-Za-z0-9._\-:/]{1,200}")


@pytest.mark.parametrize("queue_id", ["0f8e9a", "arq:cron:x:1", "saq:job:default:ab-1", "a" * 200])
def test_valid_ids_are_used_as_they_are(queue_id: str) -> None:
    assert job_id_for(queue_id) == queue_id
    assert job_id_for(queue_id.encode()) == queue_id


@pytest.mark.parametrize("queue_id", ["report 7", "", "a{b}", "é" * 300, "x" * 201, "tab\there"])
def test_other_ids_map_to_a_valid_deterministic_id(queue_id: str) -> None:
    mapped = job_id_for(queue_id)
    assert VALID.fullmatch(mapped)
    assert mapped == job_id_for(queue_id)
    assert re.fullmatch(r".*\.h[0-9a-f]{16}", mapped)


def test_mapping_keeps_a_readable_prefix_and_tells_ids_apart() -> None:
    assert job_id_for("report 7").startswith("report_7.h")
    assert job_id_for("report 7") != job_id_for("report_7") == "report_7"
    assert job_id_for("report 7") != job_id_for("report?7")


def test_kind_is_the_task_name_or_its_sanitised_form() -> None:
    assert kind_for("reports.build") == "reports.build"
    assert kind_for("Class.<locals>.task") == "Class._locals_.task"
    assert len(kind_for("k" * 300)) == 100


def test_options_are_checked_when_built() -> None:
    with pytest.raises(ValueError, match="ttl"):
        PulseOptions(interval=1.0, ttl=1.5)
    with pytest.raises(ValueError, match="interval"):
        PulseOptions(interval=0)
    with pytest.raises(ValueError, match="namespace"):
        PulseOptions(namespace="a b")
    assert PulseOptions(interval=0.5, ttl=2.0).claim_ttl == 2.5


def test_the_claim_is_refreshed_at_once_then_every_period() -> None:
    assert list(itertools.islice(refresh_delays(0.5), 4)) == [0.0, 0.5, 0.5, 0.5]


async def test_the_keeper_refreshes_at_once_and_goes_on_through_errors() -> None:
    calls: list[float] = []

    async def refresh() -> None:
        calls.append(asyncio.get_running_loop().time())
        if len(calls) == 2:
            raise ConnectionError("redis went away")  # logged, never stops the task

    async def three_calls() -> bool:
        return len(calls) >= 3

    async with keep_claim(refresh, 0.02, job_id="j"):
        await eventually(three_calls, within=5)
    seen = len(calls)
    await asyncio.sleep(0.1)
    assert len(calls) == seen  # stopped with the block


async def test_the_keeper_stops_even_when_a_refresh_swallows_its_cancellation() -> None:
    started = asyncio.Event()

    async def refresh() -> None:
        started.set()
        with contextlib.suppress(asyncio.CancelledError):  # as a client library may do
            await asyncio.sleep(10)

    async with asyncio.timeout(5):  # the block's exit must not hang
        async with keep_claim(refresh, 0.02, job_id="j"):
            await started.wait()


def test_the_sync_keeper_refreshes_while_held_and_watches_to_the_end() -> None:
    refreshed, watched = threading.Semaphore(0), threading.Semaphore(0)
    held = threading.Event()
    held.set()
    calls: list[str] = []

    def refresh() -> None:
        calls.append("refresh")
        refreshed.release()
        if len(calls) == 1:
            raise ConnectionError("a fault is logged, the next refresh goes on")

    def watch() -> None:
        watched.release()

    with keep_claim_sync(refresh, 0.01, job_id="j", holds=held.is_set, watch=watch):
        for _ in range(3):
            assert refreshed.acquire(timeout=5)  # at once, then on through the fault
        held.clear()  # the lease is lost: no refresh any more, the watch goes on
        for _ in range(3):
            assert watched.acquire(timeout=5)
        count = calls.count("refresh")
        for _ in range(3):
            assert watched.acquire(timeout=5)
        assert calls.count("refresh") == count


def test_a_claim_is_refreshed_only_while_the_lease_is_held_and_never_again_after() -> None:
    hold = ClaimHold()
    assert [hold.ask(held) for held in (True, True, False, True)] == [True, True, False, False]
    assert ClaimHold(False).ask(True) is False  # nothing to keep


async def test_the_keeper_stops_refreshing_once_the_lease_is_not_held() -> None:
    calls: list[int] = []
    held = True

    async def refresh() -> None:
        calls.append(1)

    async def refreshed(n: int) -> bool:
        return len(calls) >= n

    async with keep_claim(refresh, 0.01, job_id="j", holds=lambda: held):
        await eventually(lambda: refreshed(2), within=5)
        held = False
        seen = len(calls)
        await asyncio.sleep(0.1)  # ten periods: none refreshes
        assert len(calls) == seen


RUNNING = HolderView(JobState.RUNNING, 7, 1000)


@pytest.mark.parametrize(
    ("now", "alive"),
    [
        (RUNNING, False),  # not a beat since: a dead worker whose lease has not expired yet
        (HolderView(JobState.STALE, 7, 1000), False),
        (HolderView(JobState.RUNNING, 7, 1250), True),  # it beat: alive
        (HolderView(JobState.COMPLETED, 7, 1250), True),  # it ended its run: it was alive
        (HolderView(JobState.FAILED, 7, 1000), True),
        (HolderView(JobState.CANCELLED, 7, 1000), True),
        (HolderView(JobState.RUNNING, 8, 2000), True),  # a newer attempt runs
        (HolderView(JobState.LOST, 8, 1000), False),  # a sweeper took it over: resume it
        (HolderView(JobState.UNKNOWN, None, None), False),  # nothing holds it now
    ],
)
def test_a_duplicate_waits_only_for_a_holder_that_is_not_alive(
    now: HolderView, alive: bool
) -> None:
    assert holder_alive(RUNNING, now) is alive


def test_a_holder_seen_ended_at_the_first_look_is_alive() -> None:
    ended = HolderView(JobState.COMPLETED, 7, 1000)
    assert holder_alive(ended, ended)


async def test_a_thread_outlives_every_cancel_of_its_task() -> None:
    release = threading.Event()
    task = asyncio.get_running_loop().create_task(run_in_thread(release.wait, 5))
    await asyncio.sleep(0.02)
    for _ in range(3):  # a queue cancels again while the thread runs (SAQ, anyio scopes)
        task.cancel()
        await asyncio.sleep(0.02)
        assert not task.done()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
