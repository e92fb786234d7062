"""Time bounds hold on Python 3.11 although redis-py sends every command through
``asyncio.wait_for`` (which on 3.11 drops a cancellation that lands as the send completes), and
``LeaseLost`` surfaces within ttl plus about one interval when Redis is unreachable.

The 3.11 tests run many short trials against a server kept busy (``DEBUG SLEEP 0.2`` in a loop),
each with a deadline a fraction of a millisecond away, so that some deadlines land as a send
completes: on main about 3 trials in 10 ran to the end of the slow call and raised nothing."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from jobpulse import LeaseLost, LeaseLostCause, StatusReader, heartbeat
from jobpulse._protocol.deadline import cancellable
from jobpulse._protocol.keys import KeySchema
from jobpulse._provision import RedisServer
from jobpulse._recovery.sweeper import Sweeper

from .conftest import Proxied

TRIALS = 60
STALL = 0.2


@pytest.fixture
async def busy() -> AsyncIterator[aioredis.Redis]:
    """A client of a private server that is asleep (``DEBUG SLEEP``) most of the time."""
    with RedisServer(args=["--enable-debug-command", "yes"]) as server:
        client = aioredis.Redis.from_url(server.url)
        admin = aioredis.Redis.from_url(server.url)
        await client.ping()
        await admin.ping()

        done = asyncio.Event()

        async def stall() -> None:
            while not done.is_set():  # a flag, not cancel(): 3.11 may swallow that (see above)
                await admin.execute_command("DEBUG", "SLEEP", STALL)
                await asyncio.sleep(0.001)

        stalling = asyncio.create_task(stall())
        try:
            yield client
        finally:
            done.set()
            await stalling
            await client.aclose()
            await admin.aclose()


def _tiny() -> float:
    return random.uniform(0, 0.0005)


async def _outcome(call: asyncio.Task[object], within: float = 5.0) -> str:
    """'timeout' when the call raised TimeoutError, 'ran on' when it returned or hung."""
    done, _ = await asyncio.wait((call,), timeout=within)
    if not done:
        while not call.done():  # a swallowed cancellation: cancel until it ends
            call.cancel()
            await asyncio.wait((call,), timeout=0.05)
        return "ran on"
    if call.cancelled() or not isinstance(call.exception(), TimeoutError):
        return "ran on"
    return "timeout"


async def test_a_redis_call_under_a_deadline_always_times_out(busy: aioredis.Redis) -> None:
    redis = busy

    async def ping(limit: float) -> None:
        async with asyncio.timeout(limit):
            await cancellable(redis.ping())

    outcomes = [await _outcome(asyncio.create_task(ping(_tiny()))) for _ in range(TRIALS)]
    assert outcomes == ["timeout"] * TRIALS


async def test_a_timeout_around_sweep_always_raises(busy: aioredis.Redis) -> None:
    sweeper = Sweeper(busy)

    async def sweep(limit: float) -> None:
        async with asyncio.timeout(limit):
            await sweeper.sweep()

    outcomes = [await _outcome(asyncio.create_task(sweep(_tiny()))) for _ in range(TRIALS)]
    assert outcomes == ["timeout"] * TRIALS


async def test_wait_times_out_on_time(busy: aioredis.Redis) -> None:
    reader = StatusReader(busy, cache_ttl=0)

    async def wait(limit: float) -> None:
        await reader.wait("never-started", timeout=limit)

    try:
        outcomes = [await _outcome(asyncio.create_task(wait(_tiny()))) for _ in range(TRIALS)]
    finally:
        await reader.aclose()
    assert outcomes == ["timeout"] * TRIALS


async def test_acquire_gives_up_within_its_ttl(busy: aioredis.Redis) -> None:
    """The acquire is bounded by ttl: with a ttl shorter than one reply, entering raises."""

    async def enter(i: int) -> None:
        ttl = max(_tiny(), 0.0001)
        async with heartbeat(busy, f"acq-{i}", ttl=ttl, interval=ttl / 2):
            pass

    outcomes = [await _outcome(asyncio.create_task(enter(i))) for i in range(TRIALS)]
    assert outcomes == ["timeout"] * TRIALS


async def test_lease_lost_surfaces_within_ttl_plus_an_interval_when_redis_is_unreachable(
    proxied: Proxied,
) -> None:
    """Redis blackholed past ttl: the body is cancelled at ttl and ``LeaseLost`` is raised about
    one interval later (the LOST write is best effort), not after ``final_timeout`` (30 s)."""
    keys = KeySchema("jobpulse").job("unreachable")
    interval, ttl = 0.1, 1.0
    with pytest.raises(LeaseLost) as info:
        async with heartbeat(proxied.via_proxy, "unreachable", interval=interval, ttl=ttl) as hb:
            await asyncio.sleep(3 * interval)  # a few beats renewed the lease
            renewed = hb._lease.renewed_at
            proxied.proxy.blackhole = True
            cut_at = time.monotonic()
            await asyncio.sleep(60)  # cancelled by the local-ttl stop
    raised_after = time.monotonic() - cut_at
    proxied.proxy.blackhole = False
    assert info.value.cause is LeaseLostCause.EXPIRED
    assert raised_after < ttl + 2 * interval + 0.3  # was final_timeout (30 s) on main
    assert renewed > 0
    # Nobody wrote LOST yet: the snapshot still says RUNNING, and a sweeper will claim it.
    assert await proxied.direct.hget(keys.state, "status") == b"RUNNING"
