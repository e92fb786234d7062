"""RQ with ``jobpulse.integrations.rq``: real RQ worker processes (forked work horses), the real
Redis."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_sync
import redis.asyncio as aioredis
from rq import Queue, Retry
from rq.command import send_stop_job_command
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry, StartedJobRegistry
from rq.worker import Worker

from jobpulse import JobCancelled, JobState, StatusReader, Sweeper, request_cancel
from jobpulse._worker.arena import NAME_PREFIX
from tests.integrations.order import final_write_seen, first_line, monitor
from tests.support import eventually

pytestmark = pytest.mark.usefixtures("queue_keys")

TTL = 1.0  # what rq_worker.py gives the heartbeat (interval 0.25 s)
WORKER = "tests.integrations.rq_worker"
TASKS = "tests.integrations.rq_worker"
Spawn = Callable[..., subprocess.Popen[str]]


@pytest.fixture
def queue(redis_url: str, ns: str) -> Iterator[Queue]:
    connection = redis_sync.Redis.from_url(redis_url)
    yield Queue(f"{ns}-q", connection=connection)
    with_keys = [k for k in connection.scan_iter(match=f"rq:*{ns}*", count=1000)]
    if with_keys:
        connection.delete(*with_keys)
    connection.close()


@pytest.fixture
def reader(redis: aioredis.Redis, ns: str) -> StatusReader:
    return StatusReader(redis, namespace=ns, cache_ttl=0)


def _enqueue(queue: Queue, job_id: str, fn: str, *args: Any, retry: bool = False) -> Job:
    return queue.enqueue(
        f"{TASKS}.{fn}", *args, job_id=job_id, retry=Retry(max=1) if retry else None
    )


async def _count(redis: aioredis.Redis, ns: str, what: str, job_id: str) -> int:
    return int(await redis.get(f"{ns}:{what}:{job_id}") or 0)


async def _final(reader: StatusReader, job_id: str) -> Any:
    status = await reader.get(job_id)
    return status if status.state.is_terminal else None


def _status(job: Job) -> Callable[[], Any]:
    async def check() -> Any:
        return job.get_status(refresh=True) in (JobStatus.FINISHED, JobStatus.FAILED)

    return check


def _gone(pid: int) -> bool:
    """The process is gone or a zombie (its new parent may never reap it here)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


async def test_progress_is_live_then_completed_and_rq_keeps_its_result(
    spawn: Spawn, redis_url: str, ns: str, redis: aioredis.Redis, queue: Queue, reader: StatusReader
) -> None:
    job_id = f"{ns}-1"
    spawn(WORKER, redis_url, ns, "jobpulse")
    job = _enqueue(queue, job_id, "progress", ns, 40)

    async def advancing() -> Any:
        s = await reader.get(job_id)
        return s if s.state is JobState.RUNNING and s.done > 0 else None

    live = await eventually(advancing, within=10)
    assert (live.kind, live.stage, live.total) == (f"{TASKS}.progress", "crunch", 40)

    await eventually(_status(job), within=15)
    assert job.get_status() is JobStatus.FINISHED
    assert job.return_value() == {"items": 40}
    done = await eventually(lambda: _final(reader, job_id), within=5)  # just after RQ's record
    assert (done.state, done.done, done.attempt) == (JobState.COMPLETED, 40, 1)
    assert await _count(redis, ns, "runs", job_id) == 1


@pytest.mark.parametrize("mode", ["jobpulse", "plain"])
async def test_a_live_job_past_the_registry_ttl_runs_once_with_jobpulse_only(
    spawn: Spawn, redis_url: str, ns: str, redis: aioredis.Redis, queue: Queue, mode: str
) -> None:
    # the StartedJobRegistry TTL is 3 s, maintenance every 1 s, a second worker idles; 6 s job
    job_id = f"{ns}-1"
    spawn(WORKER, redis_url, ns, mode)
    spawn(WORKER, redis_url, ns, mode)
    job = _enqueue(queue, job_id, "sleeper", ns, 6, retry=True)
    if mode == "jobpulse":
        await eventually(_status(job), within=15)
        assert job.get_status() is JobStatus.FINISHED
        assert await _count(redis, ns, "runs", job_id) == 1
    else:

        async def run_again() -> bool:
            return await _count(redis, ns, "runs", job_id) > 1

        await eventually(run_again, within=10)  # abandoned at +3 s and retried beside the first


async def test_jobpulses_final_write_comes_after_rq_stored_the_result(
    spawn: Spawn, redis_url: str, ns: str, queue: Queue
) -> None:
    # a first version ended the heartbeat around job.perform(), before RQ recorded the result
    job_id = f"{ns}-1"
    spawn(WORKER, redis_url, ns, "jobpulse")
    async with monitor(redis_url) as mon:
        job = _enqueue(queue, job_id, "progress", ns, 4)
        await eventually(_status(job), within=15)
        final = await final_write_seen(mon, job_id, "COMPLETED")
    stored = first_line(mon, "XADD", f"rq:results:{job_id}")
    assert 0 <= stored < final


async def test_a_busy_worker_stays_in_rqs_worker_registry(
    spawn: Spawn, redis_url: str, ns: str, redis: aioredis.Redis, queue: Queue
) -> None:
    # RQ's default job_monitoring_interval (30 s), maintenance every 1 s by the idle second worker.
    # A first version gave the worker's own key the 3 s registry TTL: it expired a few seconds
    # into the job, maintenance dropped the worker from rq:workers and nothing added it back.
    job_id = f"{ns}-1"
    spawn(WORKER, redis_url, ns, "jobpulse")
    spawn(WORKER, redis_url, ns, "jobpulse")
    job = _enqueue(queue, job_id, "sleeper", ns, 8)
    await eventually(lambda: redis.lindex(f"{ns}:pids:{job_id}", 0), within=10)
    await asyncio.sleep(5)  # past the 3 s TTL, several maintenance runs later
    busy = Job.fetch(job_id, connection=queue.connection).worker_name
    workers = {w.name: w for w in Worker.all(queue=queue)}
    assert len(workers) == 2
    assert busy in workers
    assert workers[busy].get_state() == "busy"
    await eventually(_status(job), within=15)
    assert job.get_status() is JobStatus.FINISHED
    assert len(Worker.all(queue=queue)) == 2


@pytest.mark.parametrize("mode", ["jobpulse", "threadbeats"])
async def test_a_job_holding_the_gil_in_its_horse_runs_once_and_is_never_stale_with_the_sidecar(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    queue: Queue,
    reader: StatusReader,
    mode: str,
) -> None:
    # Issue 29: the work horse holds the GIL for 5 s (5 x ttl; more than the 3 s registry TTL)
    # in one C call, so every thread of the horse stops. With beats and the registry refresh
    # from threads of the horse (sidecar=False) the entry expires, maintenance (every 1 s)
    # abandons the job and the idle second worker re-runs it; with the sidecar the horse's
    # helper process beats and refreshes the entry meanwhile. (With the sidecar's beats but
    # the refresh left in the horse, the job was delivered to the other worker too, which met
    # JobBusy: counted by ``deliveries``, before the body's ``runs``.)
    job_id = f"{ns}-1"
    spawn(WORKER, redis_url, ns, mode)
    spawn(WORKER, redis_url, ns, mode)
    job = _enqueue(queue, job_id, "gil_hold", ns, 5, retry=True)
    await eventually(lambda: redis.exists(f"{ns}:holding:{job_id}"), within=10)
    if mode == "threadbeats":

        async def run_again() -> bool:
            return await _count(redis, ns, "runs", job_id) > 1

        await eventually(run_again, within=15)
        return
    seen: set[JobState] = set()
    while not await _count(redis, ns, "done", job_id):  # observed from this process
        seen.add((await reader.get(job_id)).state)
        await asyncio.sleep(0.05)
    await eventually(_status(job), within=10)
    assert job.get_status() is JobStatus.FINISHED
    assert JobState.STALE not in seen
    await asyncio.sleep(2)  # a re-run, had maintenance abandoned the job, would have started
    assert await _count(redis, ns, "deliveries", job_id) == 1  # never handed to the other
    assert await _count(redis, ns, "runs", job_id) == 1
    final = await eventually(lambda: _final(reader, job_id), within=5)
    assert (final.state, final.attempt) == (JobState.COMPLETED, 1)


@pytest.mark.parametrize("mode", ["jobpulse", "plain"])
async def test_killing_the_main_process_the_orphan_never_finishes_over_the_rerun(
    spawn: Spawn, redis_url: str, ns: str, redis: aioredis.Redis, queue: Queue, mode: str
) -> None:
    job_id = f"{ns}-1"
    first = spawn(WORKER, redis_url, ns, mode)
    _enqueue(queue, job_id, "sleeper", ns, 5, retry=True)
    horse = int(await eventually(lambda: redis.lindex(f"{ns}:pids:{job_id}", 0), within=10))
    os.kill(first.pid, signal.SIGKILL)  # the main process only: the horse lives on
    first.wait()
    spawn(WORKER, redis_url, ns, mode)
    if mode == "jobpulse":
        killed_at = time.monotonic()

        async def horse_gone() -> bool:
            return _gone(horse)

        await eventually(horse_gone, within=TTL)
        assert time.monotonic() - killed_at <= TTL
        await eventually(lambda: _count(redis, ns, "done", job_id), within=20)  # the re-run
        assert await _count(redis, ns, "runs", job_id) == 2
        assert await _count(redis, ns, "done", job_id) == 1
    else:

        async def both_done() -> bool:
            return await _count(redis, ns, "done", job_id) == 2

        await eventually(both_done, within=20)  # the orphan finished beside the re-run


async def test_a_killed_workers_job_is_stale_within_ttl_then_resumed_once(
    spawn: Spawn, redis_url: str, ns: str, redis: aioredis.Redis, queue: Queue, reader: StatusReader
) -> None:
    job_id = f"{ns}-1"
    first = spawn(WORKER, redis_url, ns, "jobpulse")
    job = _enqueue(queue, job_id, "resumable", ns, retry=True)
    await eventually(lambda: redis.exists(f"{ns}:checkpointed:{job_id}"), within=10)

    os.kill(first.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    first.wait()

    async def stale() -> bool:
        return (await reader.get(job_id)).state is JobState.STALE

    await eventually(stale, within=TTL + 0.5 + 0.25)  # the horse stops within one interval
    assert time.monotonic() - killed_at <= TTL + 0.75

    spawn(WORKER, redis_url, ns, "jobpulse")  # its maintenance retries the abandoned job
    final = await eventually(lambda: _final(reader, job_id), within=15)
    await eventually(_status(job), within=5)
    assert job.return_value() == {"resumed_from": {"step": 5}, "attempt": 2}
    assert await _count(redis, ns, "runs", job_id) == 2
    assert (final.state, final.attempt) == (JobState.COMPLETED, 2)


async def test_request_cancel_fails_the_job_in_rq_with_job_cancelled(
    spawn: Spawn, redis_url: str, ns: str, redis: aioredis.Redis, queue: Queue, reader: StatusReader
) -> None:
    job_id = f"{ns}-1"
    spawn(WORKER, redis_url, ns, "jobpulse")
    job = _enqueue(queue, job_id, "sleeper", ns, 30)

    async def running() -> bool:
        return (await reader.get(job_id)).state is JobState.RUNNING

    await eventually(running, within=10)
    assert await request_cancel(redis, job_id, namespace=ns)

    await eventually(_status(job), within=10)
    assert job.get_status() is JobStatus.FAILED
    result = job.latest_result()
    assert result is not None
    assert JobCancelled.__name__ in str(result.exc_string)
    final = await eventually(lambda: _final(reader, job_id), within=5)  # just after RQ's record
    assert final.state is JobState.CANCELLED
    assert await _count(redis, ns, "runs", job_id) == 1


async def test_a_job_returning_after_a_cancel_request_is_finished_in_rq_cancelled_in_jobpulse(
    spawn: Spawn, redis_url: str, ns: str, redis: aioredis.Redis, queue: Queue, reader: StatusReader
) -> None:
    # progress() never calls check(): it returns its result; RQ records it before jobpulse's end
    job_id = f"{ns}-1"
    spawn(WORKER, redis_url, ns, "jobpulse")
    job = _enqueue(queue, job_id, "progress", ns, 100)

    async def running() -> bool:
        return (await reader.get(job_id)).state is JobState.RUNNING

    await eventually(running, within=10)
    assert await request_cancel(redis, job_id, namespace=ns)
    await eventually(_status(job), within=15)
    assert job.get_status() is JobStatus.FINISHED
    assert job.return_value() == {"items": 100}
    final = await eventually(lambda: _final(reader, job_id), within=5)
    assert final.state is JobState.CANCELLED
    assert await _count(redis, ns, "runs", job_id) == 1


async def test_without_the_integration_jobs_run_and_current_is_none(
    spawn: Spawn, redis_url: str, ns: str, redis: aioredis.Redis, queue: Queue, reader: StatusReader
) -> None:
    job_id = f"{ns}-1"
    spawn(WORKER, redis_url, ns, "plain")
    job = _enqueue(queue, job_id, "probe", ns)
    await eventually(_status(job), within=10)
    assert job.return_value() == "none"
    assert (await reader.get(job_id)).state is JobState.UNKNOWN


async def test_stop_job_command_is_stopped_in_rq_and_stale_then_lost_in_jobpulse(
    spawn: Spawn, redis_url: str, ns: str, redis: aioredis.Redis, queue: Queue, reader: StatusReader
) -> None:
    # RQ's stop-job SIGKILLs the work horse's process group: nothing of the job is written by it
    job_id = f"{ns}-1"
    spawn(WORKER, redis_url, ns, "jobpulse")
    job = _enqueue(queue, job_id, "sleeper", ns, 30, retry=True)
    horse = int(await eventually(lambda: redis.lindex(f"{ns}:pids:{job_id}", 0), within=10))

    async def running() -> bool:
        return (await reader.get(job_id)).state is JobState.RUNNING

    await eventually(running, within=10)
    send_stop_job_command(queue.connection, job_id)

    async def stopped() -> bool:
        return job.get_status(refresh=True) is JobStatus.STOPPED

    await eventually(stopped, within=10)
    gone_at = time.monotonic()
    assert _gone(horse)

    async def stale() -> bool:
        return (await reader.get(job_id)).state is JobState.STALE

    await eventually(stale, within=TTL + 0.5)
    assert time.monotonic() - gone_at <= TTL + 0.5
    # RQ's own state agrees: failed, not started, not retried (retries_left is not used)
    assert job_id in FailedJobRegistry(queue=queue)
    assert job_id not in StartedJobRegistry(queue=queue)
    assert job_id not in queue.get_job_ids()
    # a sweeper claims it once its index deadline passed: LOST, never RUNNING or COMPLETED
    sweeper, claimed = Sweeper(redis, namespace=ns), list[str]()

    async def swept() -> bool:
        claimed.extend(job.job_id for job in await sweeper.sweep())
        return bool(claimed)

    await eventually(swept, within=10)
    assert claimed == [job_id]
    final = await reader.get(job_id)
    assert (final.state, final.attempt) == (JobState.LOST, 1)
    assert await _count(redis, ns, "runs", job_id) == 1
    assert await _count(redis, ns, "done", job_id) == 0
    # the horse's resource tracker died in its group: the next horse removes the horse's block
    # (unlocked, its pid gone) before it creates its own
    after = _enqueue(queue, f"{ns}-2", "progress", ns, 2)
    await eventually(_status(after), within=10)
    assert sorted(Path("/dev/shm").glob(f"{NAME_PREFIX}{horse}_*")) == []
