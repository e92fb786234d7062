"""Dramatiq with ``jobpulse.integrations.dramatiq``: real Dramatiq worker processes (Redis
broker), the real Redis."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import dramatiq
import pytest
import redis.asyncio as aioredis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.message import Message
from dramatiq.results import ResultFailure, ResultMissing, Results
from dramatiq.results.backends import RedisBackend

from jobpulse import JobState, StatusReader, request_cancel
from tests.integrations.order import final_write_seen, first_line, monitor
from tests.support import eventually

pytestmark = pytest.mark.usefixtures("queue_keys")

TTL = 1.0  # what dramatiq_worker.py gives the heartbeat (interval 0.25 s)
WORKER = "tests.integrations.dramatiq_worker"
Spawn = Callable[..., subprocess.Popen[str]]


class Client:
    """Sends messages to the workers' actors by name and reads their results."""

    def __init__(self, url: str, ns: str) -> None:
        self.backend = RedisBackend(url=url, namespace=f"{ns}-res")
        self.broker = RedisBroker(url=url, namespace=f"{ns}-dq")
        self.broker.add_middleware(Results(backend=self.backend))
        self.ns = ns
        self.actors = {
            name: dramatiq.actor(
                lambda *a: None, actor_name=name, queue_name="q", broker=self.broker
            )
            for name in ("progress", "sleeper", "resumable", "probe", "gil_hold")
        }

    def send(self, name: str, *args: Any) -> Message[Any]:
        return self.actors[name].send(*args)

    async def result(self, message: Message[Any], timeout: float) -> Any:
        """The stored result (raises ``ResultFailure`` for a failed message), polled."""
        async with asyncio.timeout(timeout):
            while True:
                try:
                    return self.backend.get_result(message)
                except ResultMissing:
                    await asyncio.sleep(0.05)


@pytest.fixture
def client(redis_url: str, ns: str) -> Iterator[Client]:
    c = Client(redis_url, ns)
    yield c
    c.broker.close()
    # neither close() disconnects the pools: 2 sockets per test were left to a later GC
    # ("unclosed socket" warnings raised in whichever test ran then)
    c.broker.client.connection_pool.disconnect()
    c.backend.client.connection_pool.disconnect()


@pytest.fixture
def reader(redis: aioredis.Redis, ns: str) -> StatusReader:
    return StatusReader(redis, namespace=ns, cache_ttl=0)


async def _runs(redis: aioredis.Redis, ns: str, message_id: str) -> int:
    return int(await redis.get(f"{ns}:runs:{message_id}") or 0)


async def _final(reader: StatusReader, job_id: str) -> Any:
    status = await reader.get(job_id)
    return status if status.state.is_terminal else None


async def test_progress_is_live_then_completed_and_dramatiq_keeps_its_result(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    client: Client,
    reader: StatusReader,
) -> None:
    spawn(WORKER, redis_url, ns, "jobpulse")
    message = client.send("progress", 40)
    job_id = message.message_id

    async def advancing() -> Any:
        s = await reader.get(job_id)
        return s if s.state is JobState.RUNNING and s.done > 0 else None

    live = await eventually(advancing, within=10)
    assert (live.kind, live.stage, live.total) == ("progress", "crunch", 40)

    assert await client.result(message, 15) == {"items": 40}
    done = await eventually(lambda: _final(reader, job_id), within=5)  # just after Results
    assert (done.state, done.done, done.attempt) == (JobState.COMPLETED, 40, 1)
    assert await _runs(redis, ns, job_id) == 1


@pytest.mark.parametrize("results", ["results-first", "results-last"])
async def test_jobpulses_final_write_comes_after_results_stored_the_result(
    spawn: Spawn, redis_url: str, ns: str, client: Client, results: str
) -> None:
    # Results added before or after instrument(): a first version wrote jobpulse's final state
    # first when Results was added before it
    spawn(WORKER, redis_url, ns, "jobpulse", results)
    async with monitor(redis_url) as mon:
        message = client.send("progress", 4)
        assert await client.result(message, 15) == {"items": 4}
        final = await final_write_seen(mon, message.message_id, "COMPLETED")
    stored = first_line(mon, "LPUSH", client.backend.build_message_key(message))
    assert 0 <= stored < final


@pytest.mark.parametrize("mode", ["jobpulse", "plain"])
async def test_a_live_message_past_heartbeat_timeout_runs_once_dramatiqs_own_heartbeat(
    spawn: Spawn, redis: aioredis.Redis, redis_url: str, ns: str, client: Client, mode: str
) -> None:
    # heartbeat_timeout=3 s, maintenance on every fetch, a second worker idles; a 6 s actor.
    # Dramatiq's per-process heartbeat (its consumer threads poll while actors run) keeps a live
    # process's messages from being requeued: once with and without the integration.
    spawn(WORKER, redis_url, ns, mode)
    spawn(WORKER, redis_url, ns, mode)
    message = client.send("sleeper", 6)
    assert await client.result(message, 20) == "slept"
    assert await _runs(redis, ns, message.message_id) == 1


async def test_prefetched_messages_waiting_past_heartbeat_timeout_run_once(
    spawn: Spawn, redis: aioredis.Redis, redis_url: str, ns: str, client: Client
) -> None:
    # one worker of two threads and Dramatiq's default prefetch (twice that): two of four 4 s
    # actors wait 4 s for a thread, past heartbeat_timeout (3 s), with maintenance on every
    # fetch; the live process keeps them
    spawn(WORKER, redis_url, ns, "jobpulse")
    messages = [client.send("sleeper", 4) for _ in range(4)]
    for message in messages:
        assert await client.result(message, 20) == "slept"
    assert [await _runs(redis, ns, m.message_id) for m in messages] == [1, 1, 1, 1]


@pytest.mark.parametrize("mode", ["jobpulse", "threadbeats"])
async def test_an_actor_holding_the_gil_for_3_ttl_is_never_stale_with_the_sidecar(
    spawn: Spawn,
    redis: aioredis.Redis,
    redis_url: str,
    ns: str,
    client: Client,
    reader: StatusReader,
    mode: str,
) -> None:
    # Issue 29: the actor holds the GIL for 3 s (3 x ttl) in one C call, so every thread of its
    # worker process stops: with beats from a thread (sidecar=False) the job is read STALE;
    # with the sidecar the helper process beats meanwhile. Dramatiq's own consumer heartbeat
    # stops too (jobpulse does not keep it): its timeout is 10 s here, above the hold.
    spawn(WORKER, redis_url, ns, mode, "10000")
    spawn(WORKER, redis_url, ns, mode, "10000")
    message = client.send("gil_hold", 3)
    job_id = message.message_id
    await eventually(lambda: redis.exists(f"{ns}:holding:{job_id}"), within=10)
    seen: set[JobState] = set()
    result = asyncio.ensure_future(client.result(message, 20))
    while not result.done():  # observed from this process, every 50 ms
        seen.add((await reader.get(job_id)).state)
        await asyncio.sleep(0.05)
    if mode == "threadbeats":
        result.exception()  # how Dramatiq recorded it does not matter here
        assert JobState.STALE in seen
        return
    assert await result == "held"
    assert JobState.STALE not in seen
    assert await _runs(redis, ns, job_id) == 1
    final = await eventually(lambda: _final(reader, job_id), within=5)
    assert (final.state, final.attempt) == (JobState.COMPLETED, 1)


async def test_a_killed_workers_message_is_stale_within_ttl_then_resumed_once(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    client: Client,
    reader: StatusReader,
) -> None:
    first = spawn(WORKER, redis_url, ns, "jobpulse")
    message = client.send("resumable")
    job_id = message.message_id
    await eventually(lambda: redis.exists(f"{ns}:checkpointed:{job_id}"), within=10)

    os.kill(first.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    first.wait()

    async def stale() -> bool:
        return (await reader.get(job_id)).state is JobState.STALE

    await eventually(stale, within=TTL + 0.5)
    assert time.monotonic() - killed_at <= TTL + 0.5

    spawn(WORKER, redis_url, ns, "jobpulse")  # its maintenance requeues the dead worker's message
    assert await client.result(message, 15) == {"resumed_from": {"step": 5}, "attempt": 2}
    assert await _runs(redis, ns, job_id) == 2
    final = await eventually(lambda: _final(reader, job_id), within=5)
    assert (final.state, final.attempt) == (JobState.COMPLETED, 2)


async def test_request_cancel_fails_the_message_without_retry(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    client: Client,
    reader: StatusReader,
) -> None:
    spawn(WORKER, redis_url, ns, "jobpulse")
    message = client.send("sleeper", 30)  # max_retries=3: a cancel must not be retried
    job_id = message.message_id

    async def running() -> bool:
        return (await reader.get(job_id)).state is JobState.RUNNING

    await eventually(running, within=10)
    assert await request_cancel(redis, job_id, namespace=ns)

    # Results stores a failure only for a message failed for good (after_nack): a retried one
    # would have no result yet
    with pytest.raises(ResultFailure) as failure:
        await client.result(message, 10)
    assert failure.value.orig_exc_type == "JobCancelled"
    assert (await reader.get(job_id)).state is JobState.CANCELLED
    assert await _runs(redis, ns, job_id) == 1


async def test_without_the_integration_actors_run_and_current_is_none(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    client: Client,
    reader: StatusReader,
) -> None:
    spawn(WORKER, redis_url, ns, "plain")
    message = client.send("probe")
    assert await client.result(message, 10) == "none"
    assert (await reader.get(message.message_id)).state is JobState.UNKNOWN
