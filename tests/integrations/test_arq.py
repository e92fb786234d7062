"""arq with ``jobpulse.integrations.arq``: real arq worker processes, the real Redis."""

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
from arq.connections import ArqRedis, RedisSettings, create_pool
from arq.jobs import Job, JobResult
from arq.jobs import JobStatus as ArqStatus

from jobpulse import JobState, JobStatus, StatusReader, request_cancel
from tests.support import eventually

pytestmark = pytest.mark.usefixtures("queue_keys")

TTL = 1.0  # what arq_worker.py gives the heartbeat (interval 0.25 s)
WORKER = "tests.integrations.arq_worker"
Spawn = Callable[..., subprocess.Popen[str]]


@pytest.fixture
async def arq_pool(redis_url: str) -> AsyncIterator[ArqRedis]:
    pool = await create_pool(RedisSettings.from_dsn(redis_url))
    yield pool
    await pool.aclose()


@pytest.fixture
def reader(redis: aioredis.Redis, ns: str) -> StatusReader:
    return StatusReader(redis, namespace=ns, cache_ttl=0)


async def _runs(redis: aioredis.Redis, queue: str, job_id: str) -> int:
    return int(await redis.get(f"{queue}:runs:{job_id}") or 0)


async def _result(job: Job, within: float = 15) -> Any:
    """The job's result once arq stored it. Not ``Job.result()``: arq 0.25 reads the result and
    the queue's score there in two commands outside its transaction, so a result stored between
    the two raises ``ResultNotFound`` (seen once in this file's run)."""

    async def stored() -> JobResult | None:
        return await job.result_info()

    info = await eventually(stored, within=within)
    assert info.success, info.result
    return info.result


async def _jobpulse_end(reader: StatusReader, job_id: str) -> JobStatus:
    """jobpulse's end of the job: written after arq stored its result, so wait for it."""

    async def ended() -> JobStatus | None:
        status = await reader.get(job_id)
        return status if status.state.is_terminal else None

    return await eventually(ended, within=5)


async def _enqueue(pool: ArqRedis, queue: str, job_id: str, fn: str, *args: Any) -> Job:
    job = await pool.enqueue_job(fn, *args, _job_id=job_id, _queue_name=queue)
    assert job is not None
    return job


async def test_progress_is_live_then_completed_and_arq_keeps_its_result(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    arq_pool: ArqRedis,
    reader: StatusReader,
) -> None:
    queue, job_id = f"{ns}:q", f"{ns}-1"
    spawn(WORKER, redis_url, queue, ns, "jobpulse", "progress")
    job = await _enqueue(arq_pool, queue, job_id, "progress", 40)

    async def advancing() -> Any:
        s = await reader.get(job_id)
        return s if s.state is JobState.RUNNING and s.done > 0 else None

    live = await eventually(advancing, within=10)
    assert (live.kind, live.stage, live.total) == ("progress", "crunch", 40)

    assert await _result(job) == {"items": 40, "job": job_id}
    done = await _jobpulse_end(reader, job_id)
    assert (done.state, done.done, done.attempt) == (JobState.COMPLETED, 40, 1)
    assert await _runs(redis, queue, job_id) == 1


async def test_a_live_job_past_arqs_threshold_runs_once_with_jobpulse_and_twice_without(
    spawn: Spawn, redis_url: str, ns: str, redis: aioredis.Redis, arq_pool: ArqRedis
) -> None:
    # job_timeout=None: arq's in-progress key lives 10 s; the job runs 12 s
    spawn(WORKER, redis_url, f"{ns}:with", ns, "jobpulse", "sleeper")
    spawn(WORKER, redis_url, f"{ns}:without", ns, "plain", "sleeper")
    with_jp = await _enqueue(arq_pool, f"{ns}:with", f"{ns}-1", "sleeper", 12)
    without = await _enqueue(arq_pool, f"{ns}:without", f"{ns}-2", "sleeper", 12)

    results = await asyncio.gather(with_jp.result(timeout=30), without.result(timeout=30))

    assert results == ["slept", "slept"]
    assert await _runs(redis, f"{ns}:with", f"{ns}-1") == 1

    async def run_again() -> bool:
        return await _runs(redis, f"{ns}:without", f"{ns}-2") > 1

    await eventually(run_again, within=5)  # started again at +10 s, beside the first run


async def test_a_killed_workers_job_is_stale_within_ttl_then_resumed_once(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    arq_pool: ArqRedis,
    reader: StatusReader,
) -> None:
    queue, job_id = f"{ns}:q", f"{ns}-1"
    first = spawn(WORKER, redis_url, queue, ns, "jobpulse", "resumable")
    job = await _enqueue(arq_pool, queue, job_id, "resumable")
    await eventually(lambda: redis.exists(f"{queue}:checkpointed:{job_id}"), within=10)

    os.kill(first.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    first.wait()

    async def stale() -> bool:
        return (await reader.get(job_id)).state is JobState.STALE

    await eventually(stale, within=TTL + 0.5)
    assert time.monotonic() - killed_at <= TTL + 0.5

    spawn(WORKER, redis_url, queue, ns, "jobpulse", "resumable")
    assert await _result(job) == {"resumed_from": {"step": 5}, "attempt": 2}
    assert await _runs(redis, queue, job_id) == 2
    final = await _jobpulse_end(reader, job_id)
    assert (final.state, final.attempt) == (JobState.COMPLETED, 2)


async def test_request_cancel_aborts_the_job_in_arq(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    arq_pool: ArqRedis,
    reader: StatusReader,
) -> None:
    queue, job_id = f"{ns}:q", f"{ns}-1"
    spawn(WORKER, redis_url, queue, ns, "jobpulse", "sleeper")
    job = await _enqueue(arq_pool, queue, job_id, "sleeper", 30)

    async def running() -> bool:
        return (await reader.get(job_id)).state is JobState.RUNNING

    await eventually(running, within=10)
    assert await request_cancel(redis, job_id, namespace=ns)

    info = await eventually(job.result_info, within=10)
    assert not info.success
    assert isinstance(info.result, asyncio.CancelledError)  # arq's "aborted" outcome
    assert await job.status() is ArqStatus.complete
    assert (await reader.get(job_id)).state is JobState.CANCELLED
    assert await _runs(redis, queue, job_id) == 1


async def test_arqs_abort_ends_the_jobpulse_job_cancelled(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    arq_pool: ArqRedis,
    reader: StatusReader,
) -> None:
    queue, job_id = f"{ns}:q", f"{ns}-1"
    spawn(WORKER, redis_url, queue, ns, "jobpulse", "sleeper")
    job = await _enqueue(arq_pool, queue, job_id, "sleeper", 30)

    async def running() -> bool:
        return (await reader.get(job_id)).state is JobState.RUNNING

    await eventually(running, within=10)
    assert await job.abort(timeout=10) is True
    status = await reader.get(job_id)
    assert status.state is JobState.CANCELLED
    assert await _runs(redis, queue, job_id) == 1


async def test_without_the_integration_tasks_run_and_current_is_none(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    arq_pool: ArqRedis,
    reader: StatusReader,
) -> None:
    queue, job_id = f"{ns}:q", f"{ns}-1"
    spawn(WORKER, redis_url, queue, ns, "plain", "probe")
    job = await _enqueue(arq_pool, queue, job_id, "probe")
    assert await _result(job, within=10) == "none"
    assert (await reader.get(job_id)).state is JobState.UNKNOWN


async def test_jobpulses_end_is_written_after_arqs_own_result(
    spawn: Spawn, redis_url: str, ns: str, arq_pool: ArqRedis, reader: StatusReader
) -> None:
    # arq stores the result 0.5 s after the function returned (a slow on_job_end): whoever sees
    # jobpulse's COMPLETED and then reads arq finds arq's result already.
    queue, job_id = f"{ns}:q", f"{ns}-1"
    spawn(WORKER, redis_url, queue, ns, "jobpulse-slow-finish", "progress")
    job = await _enqueue(arq_pool, queue, job_id, "progress", 5)

    async def completed() -> bool:
        return (await reader.get(job_id)).state is JobState.COMPLETED

    await eventually(completed, within=15)
    info = await job.result_info()
    assert info is not None
    assert (info.success, info.result) == (True, {"items": 5, "job": job_id})
