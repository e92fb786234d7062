"""SAQ with ``jobpulse.integrations.saq``: real SAQ worker processes, the real Redis."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from saq import Queue
from saq.job import TERMINAL_STATUSES, Job, Status

from jobpulse import JobState, JobStatus, StatusReader, request_cancel
from jobpulse._protocol.keys import KeySchema
from jobpulse.integrations.saq import ABORT_ERROR
from tests.support import eventually

pytestmark = pytest.mark.usefixtures("queue_keys")

TTL = 1.0  # what saq_worker.py gives the heartbeat (interval 0.25 s)
WORKER = "tests.integrations.saq_worker"
Spawn = Callable[..., subprocess.Popen[str]]


@pytest.fixture
async def queues(redis_url: str) -> AsyncIterator[Callable[[str], Queue]]:
    made: list[Queue] = []

    def make(name: str) -> Queue:
        made.append(Queue.from_url(redis_url, name=name))
        return made[-1]

    yield make
    for q in made:
        await q.disconnect()


@pytest.fixture
def reader(redis: aioredis.Redis, ns: str) -> StatusReader:
    return StatusReader(redis, namespace=ns, cache_ttl=0)


async def _runs(redis: aioredis.Redis, queue: str, key: str) -> int:
    return int(await redis.get(f"{queue}:runs:{key}") or 0)


async def _ended(queue: Queue, key: str, within: float = 15) -> Job:
    async def ended() -> Job | None:
        job = await queue.job(key)
        ok = job is not None and job.status in (Status.COMPLETE, Status.FAILED, Status.ABORTED)
        return job if ok else None

    return await eventually(ended, within=within)


async def _jobpulse_end(reader: StatusReader, job_id: str) -> JobStatus:
    """jobpulse's end of the job: written after SAQ stored its outcome, so wait for it."""

    async def ended() -> JobStatus | None:
        status = await reader.get(job_id)
        return status if status.state.is_terminal else None

    return await eventually(ended, within=5)


async def _enqueue(queue: Queue, key: str, fn: str, **kwargs: Any) -> Job:
    job = await queue.enqueue(fn, key=key, timeout=0, **kwargs)
    assert job is not None
    return job


async def test_progress_is_live_then_completed_and_saq_keeps_its_result(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    queues: Callable[[str], Queue],
    reader: StatusReader,
) -> None:
    queue = queues(f"{ns}-q")
    spawn(WORKER, redis_url, queue.name, ns, "jobpulse", "60")
    job = await _enqueue(queue, f"{ns}-1", "progress", n=40)

    async def advancing() -> Any:
        s = await reader.get(job.id)
        return s if s.state is JobState.RUNNING and s.done > 0 else None

    live = await eventually(advancing, within=10)
    assert (live.kind, live.stage, live.total) == ("progress", "crunch", 40)

    ended = await _ended(queue, job.key)
    assert (ended.status, ended.result) == (Status.COMPLETE, {"items": 40, "job": job.key})
    done = await _jobpulse_end(reader, job.id)
    assert (done.state, done.done, done.attempt) == (JobState.COMPLETED, 40, 1)
    assert await _runs(redis, queue.name, job.key) == 1


async def test_a_def_task_runs_in_a_thread_with_current_set(
    spawn: Spawn, redis_url: str, ns: str, queues: Callable[[str], Queue], reader: StatusReader
) -> None:
    queue = queues(f"{ns}-q")
    spawn(WORKER, redis_url, queue.name, ns, "jobpulse", "60")
    job = await _enqueue(queue, f"{ns}-1", "threaded", n=20)
    ended = await _ended(queue, job.key)
    assert (ended.status, ended.result) == (Status.COMPLETE, 20)
    done = await _jobpulse_end(reader, job.id)
    assert (done.state, done.done, done.kind) == (JobState.COMPLETED, 20, "threaded")


async def test_a_live_job_past_saqs_heartbeat_runs_once_with_jobpulse_and_again_without(
    spawn: Spawn, redis_url: str, ns: str, redis: aioredis.Redis, queues: Callable[[str], Queue]
) -> None:
    # heartbeat=1: SAQ's sweep (every second) takes a job untouched for 1 s as stuck
    with_jp, without = queues(f"{ns}-with"), queues(f"{ns}-without")
    spawn(WORKER, redis_url, with_jp.name, ns, "jobpulse", "1")
    spawn(WORKER, redis_url, without.name, ns, "plain", "1")
    a = await _enqueue(with_jp, f"{ns}-1", "sleeper", seconds=5, heartbeat=1, retries=3)
    b = await _enqueue(without, f"{ns}-2", "sleeper", seconds=5, heartbeat=1, retries=3)

    ended = await _ended(with_jp, a.key)
    assert (ended.status, ended.result) == (Status.COMPLETE, "slept")
    assert await _runs(redis, with_jp.name, a.key) == 1

    async def run_again() -> bool:
        return await _runs(redis, without.name, b.key) > 1

    await eventually(run_again, within=15)  # swept, aborted and retried while it ran


@pytest.mark.parametrize("mode", ["jobpulse", "jobpulse-threadbeats"])
async def test_a_def_job_holding_the_gil_for_3_ttl_runs_once_and_is_never_stale_with_the_sidecar(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    queues: Callable[[str], Queue],
    reader: StatusReader,
    mode: str,
) -> None:
    # Issue 29: two workers on one queue, SAQ's sweep every second (one worker sweeps at a time,
    # under SAQ's lock), heartbeat=1: a job untouched for 1 s is swept and retried. A plain def
    # job holds the GIL for 3 s (3 x ttl) in one C call: every thread of its worker stops, its
    # event loop too, and with it the loop's beats and its refresh of the job's touched time.
    # With the sidecar the helper process beats and refreshes meanwhile; with beats from the
    # loop (sidecar=False) the other worker's sweep retries the job.
    queue = queues(f"{ns}-q")
    spawn(WORKER, redis_url, queue.name, ns, mode, "1")
    spawn(WORKER, redis_url, queue.name, ns, mode, "1")
    job = await _enqueue(queue, f"{ns}-1", "gil_hold", seconds=3, heartbeat=1, retries=3)
    await eventually(lambda: redis.exists(f"{queue.name}:holding:{job.key}"), within=10)
    if mode == "jobpulse-threadbeats":

        async def run_again() -> bool:
            return await _runs(redis, queue.name, job.key) > 1

        await eventually(run_again, within=15)  # swept and retried while it held the GIL
        return
    seen: set[JobState] = set()
    for _ in range(300):  # observed from this process every 50 ms until SAQ stored an outcome
        seen.add((await reader.get(job.id)).state)
        stored = await queue.job(job.key)
        if stored is not None and stored.status in TERMINAL_STATUSES:
            break
        await asyncio.sleep(0.05)
    assert stored is not None
    assert (stored.status, stored.result, stored.attempts) == (Status.COMPLETE, "held", 1)
    assert JobState.STALE not in seen
    assert await _runs(redis, queue.name, job.key) == 1
    done = await _jobpulse_end(reader, job.id)
    assert (done.state, done.attempt) == (JobState.COMPLETED, 1)


async def test_a_killed_workers_job_is_stale_within_ttl_then_resumed_once(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    queues: Callable[[str], Queue],
    reader: StatusReader,
) -> None:
    queue = queues(f"{ns}-q")
    first = spawn(WORKER, redis_url, queue.name, ns, "jobpulse", "1")
    job = await _enqueue(queue, f"{ns}-1", "resumable", heartbeat=2, retries=2)
    await eventually(lambda: redis.exists(f"{queue.name}:checkpointed:{job.key}"), within=10)

    os.kill(first.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    first.wait()

    async def stale() -> bool:
        return (await reader.get(job.id)).state is JobState.STALE

    await eventually(stale, within=TTL + 0.5)
    assert time.monotonic() - killed_at <= TTL + 0.5

    # the next worker's sweep finds the job untouched for 2 s, aborts and retries it
    spawn(WORKER, redis_url, queue.name, ns, "jobpulse", "1")
    ended = await _ended(queue, job.key, within=20)
    assert ended.status is Status.COMPLETE
    assert ended.result == {"resumed_from": {"step": 5}, "attempt": 2}
    assert await _runs(redis, queue.name, job.key) == 2
    final = await _jobpulse_end(reader, job.id)
    assert (final.state, final.attempt) == (JobState.COMPLETED, 2)


async def test_request_cancel_aborts_the_job_in_saq(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    queues: Callable[[str], Queue],
    reader: StatusReader,
) -> None:
    queue = queues(f"{ns}-q")
    spawn(WORKER, redis_url, queue.name, ns, "jobpulse", "60")
    job = await _enqueue(queue, f"{ns}-1", "sleeper", seconds=30)

    async def running() -> bool:
        return (await reader.get(job.id)).state is JobState.RUNNING

    await eventually(running, within=10)
    assert await request_cancel(redis, job.id, namespace=ns)

    ended = await _ended(queue, job.key)
    assert (ended.status, ended.error) == (Status.ABORTED, ABORT_ERROR)
    assert (await reader.get(job.id)).state is JobState.CANCELLED
    assert await _runs(redis, queue.name, job.key) == 1


@pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")  # in saq 0.26
async def test_saqs_abort_ends_the_jobpulse_job_cancelled(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    queues: Callable[[str], Queue],
    reader: StatusReader,
) -> None:
    queue = queues(f"{ns}-q")
    spawn(WORKER, redis_url, queue.name, ns, "jobpulse", "60")
    job = await _enqueue(queue, f"{ns}-1", "sleeper", seconds=30)

    async def running() -> bool:
        return (await reader.get(job.id)).state is JobState.RUNNING

    await eventually(running, within=10)
    await job.abort("stop it")

    ended = await _ended(queue, job.key)
    assert (ended.status, ended.error) == (Status.ABORTED, "stop it")

    async def cancelled() -> bool:
        return (await reader.get(job.id)).state is JobState.CANCELLED

    await eventually(cancelled, within=5)
    assert await _runs(redis, queue.name, job.key) == 1


async def test_without_the_integration_tasks_run_and_current_is_none(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    queues: Callable[[str], Queue],
    reader: StatusReader,
) -> None:
    queue = queues(f"{ns}-q")
    spawn(WORKER, redis_url, queue.name, ns, "plain", "60")
    job = await _enqueue(queue, f"{ns}-1", "probe")
    ended = await _ended(queue, job.key)
    assert (ended.status, ended.result) == (Status.COMPLETE, "none")
    assert (await reader.get(job.id)).state is JobState.UNKNOWN


async def _marks(redis: aioredis.Redis, queue: str, key: str) -> list[tuple[str, int]]:
    """The ``(what, wall clock ms)`` marks the job's bodies wrote, in order."""
    raw = await redis.lrange(f"{queue}:marks:{key}", 0, -1)
    return [(what, int(ms)) for what, ms in (m.decode().split("@") for m in raw)]


async def test_an_orphaned_def_body_never_keeps_the_claim_after_its_lease_is_lost(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    queues: Callable[[str], Queue],
    reader: StatusReader,
) -> None:
    # Another attempt takes the lease over; the worker's next beat learns it (LeaseLost): the
    # def body's thread cannot be stopped and runs 2 s more. SAQ's touched time (the claim)
    # must not move from then on, while the thread runs.
    queue = queues(f"{ns}-q")
    spawn(WORKER, redis_url, queue.name, ns, "jobpulse", "60")
    job = await _enqueue(queue, f"{ns}-1", "orphan", seconds=2.0)

    async def running() -> bool:
        return (await reader.get(job.id)).state is JobState.RUNNING

    await eventually(running, within=10)
    await redis.set(KeySchema(ns).job(job.id).alive, "another-attempt:1", px=30_000)

    touched: list[int] = []

    async def thread_ended() -> bool:
        marks = dict(await _marks(redis, queue.name, job.key))
        if "ended" in marks:
            return True
        stored = await queue.job(job.key)
        assert stored is not None
        touched.append(stored.touched)
        return False

    await eventually(thread_ended, within=15)
    marks = dict(await _marks(redis, queue.name, job.key))
    assert touched  # sampled while the orphaned thread ran
    assert max(touched) <= marks["lost"]


async def test_a_def_body_past_saqs_timeout_never_overlaps_the_retry(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    queues: Callable[[str], Queue],
    reader: StatusReader,
) -> None:
    # timeout=2 cancels the first attempt during its 3.5 s step; SAQ cancels it again at once
    # and waits up to its 1 s hard deadline, then retries. The cancelled run's heartbeat (and
    # lease) must live until its thread returns, and the retry (a 0.1 s step) start after.
    queue = queues(f"{ns}-q")
    spawn(WORKER, redis_url, queue.name, ns, "jobpulse", "60")
    job = await queue.enqueue("step", key=f"{ns}-1", first=3.5, later=0.1, timeout=2, retries=2)
    assert job is not None

    ended = await _ended(queue, job.key, within=20)
    assert (ended.status, ended.result, ended.attempts) == (Status.COMPLETE, "stepped", 2)
    marks = [what for what, _ in await _marks(redis, queue.name, job.key)]
    assert marks == ["start", "end", "start", "end"]  # run 2 started after run 1's thread ended
    done = await _jobpulse_end(reader, job.id)
    assert (done.state, done.attempt) == (JobState.COMPLETED, 2)


async def test_jobpulses_end_is_written_after_saqs_own_outcome(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    queues: Callable[[str], Queue],
    reader: StatusReader,
) -> None:
    # SAQ stores COMPLETE 0.5 s after the function returned (slow finish): whoever sees
    # jobpulse's COMPLETED and then reads SAQ finds SAQ's COMPLETE and the result already.
    queue = queues(f"{ns}-q")
    spawn(WORKER, redis_url, queue.name, ns, "jobpulse-slow-finish", "60")
    job = await _enqueue(queue, f"{ns}-1", "progress", n=5)

    async def completed() -> bool:
        return (await reader.get(job.id)).state is JobState.COMPLETED

    await eventually(completed, within=15)
    stored = await queue.job(job.key)
    assert stored is not None
    assert (stored.status, stored.result) == (Status.COMPLETE, {"items": 5, "job": job.key})
