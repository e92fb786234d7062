"""taskiq (taskiq-redis stream broker) with ``jobpulse.integrations.taskiq``: real taskiq worker
processes, the real Redis."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from taskiq import AsyncTaskiqTask, TaskiqResult
from taskiq.kicker import AsyncKicker
from taskiq_redis import RedisAsyncResultBackend, RedisStreamBroker

from jobpulse import JobCancelled, JobState, JobStatus, StatusReader, request_cancel
from jobpulse._protocol.keys import KeySchema
from tests.support import eventually

pytestmark = pytest.mark.usefixtures("queue_keys")

TTL = 1.0  # what taskiq_worker.py gives the heartbeat (interval 0.25 s)
WORKER = "tests.integrations.taskiq_worker"
Spawn = Callable[..., subprocess.Popen[str]]
Kick = Callable[..., Awaitable[AsyncTaskiqTask[Any]]]


@pytest.fixture
async def kicker(redis_url: str) -> AsyncIterator[Callable[[str], Kick]]:
    """``kicker(queue)`` gives ``kick(task_name, *args)`` for that stream."""
    brokers: list[RedisStreamBroker] = []

    async def make_kick(queue: str) -> Kick:
        broker = RedisStreamBroker(redis_url, queue_name=queue).with_result_backend(
            RedisAsyncResultBackend(redis_url, prefix_str=queue)
        )
        await broker.startup()
        brokers.append(broker)

        async def kick(name: str, *args: Any) -> AsyncTaskiqTask[Any]:
            return await AsyncKicker(task_name=name, broker=broker, labels={}).kiq(*args)

        return kick

    yield make_kick  # type: ignore[misc]
    for broker in brokers:
        await broker.shutdown()


@pytest.fixture
def reader(redis: aioredis.Redis, ns: str) -> StatusReader:
    return StatusReader(redis, namespace=ns, cache_ttl=0)


async def _runs(redis: aioredis.Redis, key: str) -> int:
    return int(await redis.get(key) or 0)


async def _jobpulse_end(reader: StatusReader, task_id: str) -> JobStatus:
    """jobpulse's end of the task: written after taskiq saved its result, so wait for it."""

    async def ended() -> JobStatus | None:
        status = await reader.get(task_id)
        return status if status.state.is_terminal else None

    return await eventually(ended, within=5)


async def _result_nudging(
    task: AsyncTaskiqTask[Any], *kicks: Kick, counter: str, within: float = 20
) -> TaskiqResult[Any]:
    """Wait for ``task``'s result, kicking a ``probe`` on each stream every 0.3 s: taskiq-redis
    reclaims idle entries (XAUTOCLAIM) only after a read that fetched new messages."""

    async def ready() -> bool:
        if await task.is_ready():
            return True
        for kick in kicks:
            await kick("probe", counter)
        await asyncio.sleep(0.3)
        return False

    await eventually(ready, within=within)
    return await task.get_result()


async def test_progress_is_live_then_completed_and_taskiq_keeps_its_result(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    kicker: Callable[[str], Awaitable[Kick]],
    reader: StatusReader,
) -> None:
    queue, counter = f"{ns}-q", f"{ns}:runs"
    spawn(WORKER, redis_url, queue, ns, "jobpulse", "60000")
    kick = await kicker(queue)
    task = await kick("progress", counter, 40)

    async def advancing() -> Any:
        s = await reader.get(task.task_id)
        return s if s.state is JobState.RUNNING and s.done > 0 else None

    live = await eventually(advancing, within=10)
    assert (live.kind, live.stage, live.total) == ("progress", "crunch", 40)

    result = await task.wait_result(timeout=15)
    assert (result.is_err, result.return_value) == (False, {"items": 40})
    done = await _jobpulse_end(reader, task.task_id)
    assert (done.state, done.done, done.attempt) == (JobState.COMPLETED, 40, 1)
    assert await _runs(redis, counter) == 1


async def test_a_live_task_past_the_idle_timeout_runs_once_with_jobpulse_and_again_without(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    kicker: Callable[[str], Awaitable[Kick]],
) -> None:
    # idle_timeout=1000 ms; the task runs 4 s; probes make the broker read (and XAUTOCLAIM)
    spawn(WORKER, redis_url, f"{ns}-with", ns, "jobpulse", "1000")
    spawn(WORKER, redis_url, f"{ns}-without", ns, "plain", "1000")
    kick_with, kick_without = await kicker(f"{ns}-with"), await kicker(f"{ns}-without")
    with_jp = await kick_with("sleeper", f"{ns}:with", 4)
    without = await kick_without("sleeper", f"{ns}:without", 4)

    result = await _result_nudging(with_jp, kick_with, kick_without, counter=f"{ns}:probes")
    assert (result.is_err, result.return_value) == (False, "slept")
    assert await _runs(redis, f"{ns}:with") == 1
    # without: reclaimed after 1 s idle and started again beside the first run
    result = await _result_nudging(without, kick_without, counter=f"{ns}:probes")
    assert (result.is_err, result.return_value) == (False, "slept")
    assert await _runs(redis, f"{ns}:without") > 1


@pytest.mark.parametrize("mode", ["jobpulse", "jobpulse-threadbeats"])
async def test_a_def_task_holding_the_gil_for_3_ttl_runs_once_and_is_never_stale_with_the_sidecar(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    kicker: Callable[[str], Awaitable[Kick]],
    reader: StatusReader,
    mode: str,
) -> None:
    # Issue 29: two workers on one stream, idle_timeout=1000 ms (the other worker's reads,
    # nudged by probes, XAUTOCLAIM entries idle that long). A plain def task holds the GIL for
    # 3 s (3 x ttl) in one C call: every thread of its worker stops, its event loop too, and
    # with it the loop's beats and the worker's _DeliveryKeeper. With the sidecar the helper
    # process beats and re-claims the task's entry meanwhile; with beats from the loop
    # (sidecar=False) the entry idles and the other worker takes it.
    queue, counter, probes = f"{ns}-q", f"{ns}:runs", f"{ns}:probes"
    spawn(WORKER, redis_url, queue, ns, mode, "1000")
    spawn(WORKER, redis_url, queue, ns, mode, "1000")
    kick = await kicker(queue)
    task = await kick("gil_hold", counter, f"{ns}:holding", 3)
    deliveries = f"{ns}:deliveries:{task.task_id}"
    await eventually(lambda: redis.exists(f"{ns}:holding"), within=10)
    seen: set[JobState] = set()
    tick = 0
    while not await task.is_ready():  # observed from this process every 50 ms until a result
        seen.add((await reader.get(task.task_id)).state)
        if tick % 6 == 0:
            await kick("probe", probes)  # the other worker reads, then XAUTOCLAIMs
        tick += 1
        await asyncio.sleep(0.05)
    if mode == "jobpulse-threadbeats":
        assert await _runs(redis, deliveries) > 1  # handed on to the other worker meanwhile
        return
    result = await task.get_result()
    assert (result.is_err, result.return_value) == (False, "held")
    assert JobState.STALE not in seen
    for _ in range(7):  # 2 s more of probes: a handed-on copy would be delivered by now
        await kick("probe", probes)
        await asyncio.sleep(0.3)
    assert await _runs(redis, deliveries) == 1
    assert await _runs(redis, counter) == 1
    done = await _jobpulse_end(reader, task.task_id)
    assert (done.state, done.attempt) == (JobState.COMPLETED, 1)


async def test_a_killed_workers_task_is_stale_within_ttl_then_resumed_once(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    kicker: Callable[[str], Awaitable[Kick]],
    reader: StatusReader,
) -> None:
    queue, counter, marker = f"{ns}-q", f"{ns}:runs", f"{ns}:checkpointed"
    first = spawn(WORKER, redis_url, queue, ns, "jobpulse", "1500")
    kick = await kicker(queue)
    task = await kick("resumable", counter, marker)
    await eventually(lambda: redis.exists(marker), within=10)

    os.kill(first.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    first.wait()

    async def stale() -> bool:
        return (await reader.get(task.task_id)).state is JobState.STALE

    await eventually(stale, within=TTL + 0.5)
    assert time.monotonic() - killed_at <= TTL + 0.5

    spawn(WORKER, redis_url, queue, ns, "jobpulse", "1500")
    result = await _result_nudging(task, kick, counter=f"{ns}:probes")
    assert result.return_value == {"resumed_from": {"step": 5}, "attempt": 2}
    assert await _runs(redis, counter) == 2
    final = await _jobpulse_end(reader, task.task_id)
    assert (final.state, final.attempt) == (JobState.COMPLETED, 2)


async def test_request_cancel_ends_the_task_with_a_jobcancelled_error_result(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    kicker: Callable[[str], Awaitable[Kick]],
    reader: StatusReader,
) -> None:
    queue, counter = f"{ns}-q", f"{ns}:runs"
    spawn(WORKER, redis_url, queue, ns, "jobpulse", "60000")
    kick = await kicker(queue)
    task = await kick("sleeper", counter, 30)

    async def running() -> bool:
        return (await reader.get(task.task_id)).state is JobState.RUNNING

    await eventually(running, within=10)
    assert await request_cancel(redis, task.task_id, namespace=ns)

    result = await task.wait_result(timeout=10)
    assert result.is_err
    assert isinstance(result.error, JobCancelled)
    assert (await reader.get(task.task_id)).state is JobState.CANCELLED
    assert await _runs(redis, counter) == 1


async def test_without_the_integration_tasks_run_and_current_is_none(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    kicker: Callable[[str], Awaitable[Kick]],
    reader: StatusReader,
) -> None:
    queue = f"{ns}-q"
    spawn(WORKER, redis_url, queue, ns, "plain", "60000")
    kick = await kicker(queue)
    task = await kick("probe", f"{ns}:runs")
    result = await task.wait_result(timeout=10)
    assert result.return_value == "none"
    assert (await reader.get(task.task_id)).state is JobState.UNKNOWN


async def _pending_by_consumer(redis: aioredis.Redis, stream: str) -> dict[str, int]:
    """How many entries of the stream's consumer group are pending, per consumer."""
    summary = await redis.xpending(stream, "taskiq")
    return {c["name"].decode(): int(c["pending"]) for c in summary["consumers"] or []}


async def test_entries_read_ahead_while_a_slot_is_busy_run_once(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    kicker: Callable[[str], Awaitable[Kick]],
) -> None:
    # One slot (max_async_tasks=1) and taskiq-redis's default read-ahead (xread_count=100): the
    # first worker holds t1's entry while t0 runs. idle_timeout=1000 ms; a second worker's reads
    # XAUTOCLAIM entries idle that long. Every delivery the first worker holds stays fresh.
    queue = f"{ns}-q"
    spawn(WORKER, redis_url, queue, ns, "jobpulse", "1000", "1")
    kick = await kicker(queue)
    t0 = await kick("sleeper", f"{ns}:t0", 3)
    t1 = await kick("sleeper", f"{ns}:t1", 1)

    async def both_held_by_one_consumer() -> bool:
        return sorted((await _pending_by_consumer(redis, queue)).values()) == [2]

    await eventually(both_held_by_one_consumer, within=5)
    spawn(WORKER, redis_url, queue, ns, "jobpulse", "1000")

    for task in (t0, t1):
        result = await _result_nudging(task, kick, counter=f"{ns}:probes")
        assert (result.is_err, result.return_value) == (False, "slept")

    async def all_acknowledged() -> bool:
        return sum((await _pending_by_consumer(redis, queue)).values()) == 0

    await eventually(all_acknowledged, within=5)
    assert (await _runs(redis, f"{ns}:t0"), await _runs(redis, f"{ns}:t1")) == (1, 1)


async def test_a_duplicate_delivery_of_a_live_task_never_runs_its_body(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    kicker: Callable[[str], Awaitable[Kick]],
    reader: StatusReader,
) -> None:
    # A second message with the same task id while the first runs. The first run ends 1 s after
    # the gate opens, inside the ttl + interval (1.25 s) a duplicate used to wait for ANY holder
    # (it then took the free lease and ran the whole task again, attempt 2).
    queue, counter, gate = f"{ns}-q", f"{ns}:runs", f"{ns}:gate"
    spawn(WORKER, redis_url, queue, ns, "jobpulse", "60000")
    kick = await kicker(queue)
    first = await kick("gated", counter, gate, 1.0)

    async def running() -> bool:
        return (await reader.get(first.task_id)).state is JobState.RUNNING

    await eventually(running, within=10)
    broker = RedisStreamBroker(redis_url, queue_name=queue)
    await broker.startup()
    try:
        kicker_of = AsyncKicker(task_name="gated", broker=broker, labels={})
        await kicker_of.with_task_id(first.task_id).kiq(counter, gate, 1.0)
    finally:
        await broker.shutdown()

    async def both_delivered() -> bool:
        return sum((await _pending_by_consumer(redis, queue)).values()) == 2

    await eventually(both_delivered, within=5)
    await redis.set(gate, 1)

    async def all_acknowledged() -> bool:
        return sum((await _pending_by_consumer(redis, queue)).values()) == 0

    await eventually(all_acknowledged, within=10)
    assert await _runs(redis, counter) == 1
    done = await reader.get(first.task_id)
    assert (done.state, done.attempt) == (JobState.COMPLETED, 1)


async def test_a_killed_workers_read_ahead_entries_are_handed_on_and_run_once(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    kicker: Callable[[str], Awaitable[Kick]],
    reader: StatusReader,
) -> None:
    # The keeper lives in the worker: once it is killed, neither the running task's entry nor
    # the one it read ahead is refreshed, and another worker runs each once.
    queue, marker = f"{ns}-q", f"{ns}:checkpointed"
    first = spawn(WORKER, redis_url, queue, ns, "jobpulse", "1500", "1")
    kick = await kicker(queue)
    t0 = await kick("resumable", f"{ns}:t0", marker)
    t1 = await kick("sleeper", f"{ns}:t1", 0.1)

    async def both_held_by_one_consumer() -> bool:
        return sorted((await _pending_by_consumer(redis, queue)).values()) == [2]

    await eventually(lambda: redis.exists(marker), within=10)
    await eventually(both_held_by_one_consumer, within=5)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()

    spawn(WORKER, redis_url, queue, ns, "jobpulse", "1500")
    for task in (t0, t1):
        result = await _result_nudging(task, kick, counter=f"{ns}:probes")
        assert not result.is_err
    assert (await _runs(redis, f"{ns}:t0"), await _runs(redis, f"{ns}:t1")) == (2, 1)
    assert (await _jobpulse_end(reader, t0.task_id)).attempt == 2


async def test_jobpulses_end_is_written_after_taskiqs_own_result(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    kicker: Callable[[str], Awaitable[Kick]],
    reader: StatusReader,
) -> None:
    # The result backend saves 0.5 s after the task returned: whoever sees jobpulse's
    # COMPLETED and then reads taskiq finds the result already.
    queue = f"{ns}-q"
    spawn(WORKER, redis_url, queue, ns, "jobpulse-slow-finish", "60000")
    kick = await kicker(queue)
    task = await kick("progress", f"{ns}:runs", 5)

    async def completed() -> bool:
        return (await reader.get(task.task_id)).state is JobState.COMPLETED

    await eventually(completed, within=15)
    assert await task.is_ready()
    result = await task.get_result()
    assert (result.is_err, result.return_value) == (False, {"items": 5})


async def test_the_entry_of_a_task_that_lost_its_lease_is_no_longer_refreshed(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    kicker: Callable[[str], Awaitable[Kick]],
    reader: StatusReader,
) -> None:
    # Another attempt takes the lease over; the worker's next beat learns it (LeaseLost): the
    # def body's thread cannot be stopped and runs 3 s more. Its stream entry must go idle
    # (another worker's XAUTOCLAIM may hand it on) while the thread still runs.
    queue, lost, ended = f"{ns}-q", f"{ns}:lost", f"{ns}:ended"
    spawn(WORKER, redis_url, queue, ns, "jobpulse", "60000")
    kick = await kicker(queue)
    task = await kick("orphan", f"{ns}:runs", lost, ended, 3.0)

    async def running() -> bool:
        return (await reader.get(task.task_id)).state is JobState.RUNNING

    await eventually(running, within=10)
    await redis.set(KeySchema(ns).job(task.task_id).alive, "another-attempt:1", px=30_000)
    await eventually(lambda: redis.exists(lost), within=5)

    async def idle_for_a_second() -> bool:
        assert not await redis.exists(ended)  # the orphaned thread still runs
        entries = await redis.xpending_range(queue, "taskiq", "-", "+", 10)
        return any(e["time_since_delivered"] >= 1000 for e in entries)

    await eventually(idle_for_a_second, within=5)
