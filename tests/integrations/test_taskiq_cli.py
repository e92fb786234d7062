"""taskiq's own CLI worker (``taskiq worker module:broker``) with
``jobpulse.integrations.taskiq``, running plain ``def`` tasks (taskiq runs them in a thread) beside
an ``async def`` one: real worker processes started by the CLI, the real Redis."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from taskiq import AsyncTaskiqTask
from taskiq.kicker import AsyncKicker
from taskiq_redis import RedisAsyncResultBackend, RedisStreamBroker

from jobpulse import JobCancelled, JobState, StatusReader, request_cancel
from tests.support import eventually

pytestmark = pytest.mark.usefixtures("queue_keys")

APP = "tests.integrations.taskiq_cli_app:broker"
TASKS = "tests.integrations.taskiq_cli_tasks"  # a tasks module the CLI imports after APP
Kick = Callable[..., Any]


@pytest.fixture
async def cli_worker(
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    session_procs: Callable[..., subprocess.Popen[bytes]],
) -> AsyncIterator[Kick]:
    """One ``taskiq worker`` (one child process) on a stream of this test's own; yields
    ``kick(task_name, *args)``. The consumer group is made first, so no kick is missed while
    the worker starts."""
    queue = f"{ns}-cli"
    await redis.xgroup_create(queue, "taskiq", id="$", mkstream=True)
    env = {"JOBPULSE_TEST_URL": redis_url, "JOBPULSE_TEST_QUEUE": queue, "JOBPULSE_TEST_NS": ns}
    argv = [sys.executable, "-m", "taskiq", "worker", APP, TASKS, "--workers", "1"]
    session_procs([*argv, "--no-configure-logging"], env)
    broker = RedisStreamBroker(redis_url, queue_name=queue).with_result_backend(
        RedisAsyncResultBackend(redis_url, prefix_str=queue)
    )
    await broker.startup()

    async def kick(name: str, *args: Any, **labels: Any) -> AsyncTaskiqTask[Any]:
        return await AsyncKicker(task_name=name, broker=broker, labels=labels).kiq(*args)

    yield kick
    await broker.shutdown()


@pytest.fixture
def reader(redis: aioredis.Redis, ns: str) -> StatusReader:
    return StatusReader(redis, namespace=ns, cache_ttl=0)


async def test_a_sync_task_sees_current_and_its_progress_is_live_then_completed(
    cli_worker: Kick, redis: aioredis.Redis, ns: str, reader: StatusReader
) -> None:
    counter = f"{ns}:runs"
    task = await cli_worker("sync_progress", counter, 40)

    async def advancing() -> Any:
        s = await reader.get(task.task_id)
        return s if s.state is JobState.RUNNING and (s.done or 0) > 0 else None

    live = await eventually(advancing, within=20)  # the CLI worker imports, then starts
    assert (live.kind, live.stage, live.total) == ("sync_progress", "crunch", 40)

    # taskiq saves the result first, then (post_save) jobpulse writes the final state: a reader
    # that saw the result sees the final state a moment later, never before it
    async def ended(task_id: str) -> Any:
        s = await reader.get(task_id)
        return s if s.state is not JobState.RUNNING else None

    result = await task.wait_result(timeout=15)
    assert (result.is_err, result.return_value) == (False, {"items": 40, "job_id": task.task_id})
    done = await eventually(lambda: ended(task.task_id), within=5)
    assert (done.state, done.done, done.total, done.attempt) == (JobState.COMPLETED, 40, 40, 1)

    other = await cli_worker("async_progress", counter, 10)  # an async task, same worker
    result = await other.wait_result(timeout=15)
    assert (result.is_err, result.return_value) == (False, {"items": 10})
    assert (await eventually(lambda: ended(other.task_id), within=5)).state is JobState.COMPLETED
    assert int(await redis.get(counter) or 0) == 2


async def test_request_cancel_stops_a_sync_task_at_its_next_check(
    cli_worker: Kick, redis: aioredis.Redis, ns: str, reader: StatusReader
) -> None:
    counter, marker = f"{ns}:runs", f"{ns}:advanced"
    task = await cli_worker("sync_until_cancelled", counter, marker)
    await eventually(lambda: redis.exists(marker), within=20)
    assert await request_cancel(redis, task.task_id, namespace=ns)

    result = await task.wait_result(timeout=10)
    assert result.is_err
    assert isinstance(result.error, JobCancelled)
    # the result is stored once the thread returned (run_in_thread waits for it): it no longer
    # advances, and jobpulse's last count is the thread's last count
    final = await reader.get(task.task_id)
    assert final.state is JobState.CANCELLED
    assert final.done == int(await redis.get(marker) or 0)
    assert int(await redis.get(counter) or 0) == 1


async def test_a_timeout_label_stops_a_sync_task_at_its_next_check(
    cli_worker: Kick, redis: aioredis.Redis, ns: str, reader: StatusReader
) -> None:
    counter, marker = f"{ns}:runs", f"{ns}:advanced"
    # A def task beats from the sidecar helper, which the worker process starts with its first
    # def task (0.5 s or more on a loaded machine, inside taskiq's timeout): start it first, so
    # the 1 s timeout falls in this task's body.
    warm = await cli_worker("sync_progress", f"{ns}:warm", 1)
    assert not (await warm.wait_result(timeout=20)).is_err
    task = await cli_worker("sync_until_cancelled", counter, marker, timeout=1)
    result = await task.wait_result(timeout=20)
    assert result.is_err
    assert isinstance(result.error, TimeoutError)
    # the heartbeat waited for the thread, which stopped at its next check()
    final = await reader.get(task.task_id)
    assert final.state is JobState.CANCELLED
    assert final.done == int(await redis.get(marker) or 0)
    assert int(await redis.get(counter) or 0) == 1


async def test_a_timeout_label_ends_an_async_task_cancelled_not_stale(
    cli_worker: Kick, redis: aioredis.Redis, ns: str, reader: StatusReader
) -> None:
    # taskiq's timeout is an anyio cancel scope, which cancels again at every await: a first
    # version had the heartbeat's final write cancelled too, and the job went STALE
    task = await cli_worker("async_progress", f"{ns}:runs", 1000, timeout=1)
    result = await task.wait_result(timeout=20)
    assert result.is_err
    assert isinstance(result.error, TimeoutError)
    final = await reader.get(task.task_id)  # written before taskiq stored its result
    assert final.state is JobState.CANCELLED
    assert 0 < (final.done or 0) < 1000


async def test_a_task_of_a_module_the_cli_imports_later_runs_under_a_heartbeat(
    cli_worker: Kick, reader: StatusReader
) -> None:
    task = await cli_worker("late_probe")
    result = await task.wait_result(timeout=20)
    assert (result.is_err, result.return_value) == (False, "late_probe")
    assert (await reader.get(task.task_id)).state is JobState.COMPLETED
