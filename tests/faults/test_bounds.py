"""Time bounds hold on Python 3.11 although redis-py sends every command through
``asyncio.wait_for`` (which on 3.11 drops a cancellation that lands as the send completes), and
``LeaseLost`` surfaces within ttl plus about one interval when Redis is unreachable.

The 3.11 tests run many short trials against a server kept busy (``DEBUG SLEEP 0.2`` in a loop),
each with a deadline a fraction of a millisecond away, so that some deadlines land as a send
completes: on main about 3 trials in 10 ran to the end of the slow call and raised nothing. The
beat budget and the final write have longer deadlines; their tests starve the loop (below)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as aioredis

from jobpulse import LeaseLost, LeaseLostCause, StateNotWritten, StatusReader, heartbeat
from jobpulse._protocol.deadline import cancellable
from jobpulse._protocol.keys import KeySchema
from jobpulse._provision import RedisServer
from jobpulse._recovery.sweeper import Sweeper

from ..support import eventually
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


# The beat budget and the final write are bounded by deadlines of 10 ms and more, which land long
# after the send in a loop that keeps up. They land as a send completes when the loop is starved:
# a callback that blocks it past the deadline right after a send started (CPU-bound code in an
# async body, a synchronous library call). The timer and the finished send are then handled in
# the same loop iteration (or the send first), and 3.11's ``wait_for`` returns the send's result
# instead of the cancellation: the deadline has passed and nothing raised. The reply is late (a
# held reply, a blackhole), so a call that ran on waits for it, at most until the client's
# ``socket_timeout``: made 30 s here, far beyond every bound. Verified: with the ``cancellable``
# of the ticker's pipeline or of the final write replaced by a plain ``await``, these tests fail
# (the long job does not beat again within 5 s; the exit takes 31 s).


async def _hog(stop: asyncio.Event, block: float) -> None:
    """Block the event loop for ``block`` seconds (``time.sleep``, as CPU-bound code would) in
    every loop iteration until ``stop`` is set."""
    while not stop.is_set():
        await asyncio.sleep(0)
        time.sleep(block)


async def test_a_beat_pipeline_is_given_up_at_its_budget_in_a_starved_loop(
    proxied: Proxied,
) -> None:
    """A beat pipeline is bounded by the smallest lease time left among its jobs: when its reply
    is late and the loop is starved, it is given up at that budget, and the other job in it
    beats again on a new connection. Before, it waited for the late reply (20 s), and the
    long-lived job could not beat for as long."""
    redis = aioredis.Redis.from_url(proxied.proxy.url, socket_timeout=30)
    interval = 0.5  # beats of jobs due within interval / 10 share a pipeline
    block = 0.8  # > the short job's lease left at a beat (about ttl - interval = 0.5 s)

    async def short_job() -> None:
        async with heartbeat(redis, "short-lease", interval=interval, ttl=1.0):
            await asyncio.sleep(60)  # ends by the local-ttl stop

    try:
        async with heartbeat(redis, "long-lease", interval=interval, ttl=30.0) as long:
            short = asyncio.create_task(short_job())
            await eventually(lambda: _true(long.statistics().beats_written >= 3))
            # The next pipeline (both jobs' beats) is answered 20 s late, and the loop is
            # starved from the moment it is built: the deadline lands as its send completes.
            sent = long.statistics().beats_sent
            proxied.proxy.delay_reply_once(b"long-lease", 20.0)
            await _hog_from(lambda: long.statistics().beats_sent > sent, block, steps=3)
            given_up = long.statistics().beats_written
            await eventually(lambda: _true(long.statistics().beats_written > given_up), within=5)
            assert long.statistics().lease == "held"
        with pytest.raises(LeaseLost) as info:
            await short
    finally:
        await redis.aclose()
    assert info.value.cause is LeaseLostCause.EXPIRED  # its lease ran out in the starved loop


async def _hog_from(started: Callable[[], bool], block: float, steps: int) -> None:
    """Once ``started()`` is true, block the event loop ``block`` seconds in each of ``steps``
    loop iterations in a row (as CPU-bound code would)."""
    while not started():
        await asyncio.sleep(0)
    for _ in range(steps):
        time.sleep(block)
        await asyncio.sleep(0)


async def _true(value: bool) -> bool:
    return value


async def test_the_final_write_gives_up_at_final_timeout_in_a_starved_loop(
    proxied: Proxied,
) -> None:
    """The final write is bounded by ``final_timeout``: with Redis not answering and the loop
    starved, ``StateNotWritten`` is raised once the bound and the hog's last block are over,
    not after ``socket_timeout`` (30 s)."""
    redis = aioredis.Redis.from_url(proxied.proxy.url, socket_timeout=30)
    final_timeout, block = 0.05, 0.1
    stop = asyncio.Event()
    hogging: asyncio.Task[None] | None = None
    try:
        with pytest.raises(StateNotWritten):
            async with heartbeat(
                redis, "starved-final", interval=0.1, ttl=10.0, final_timeout=final_timeout
            ):
                await asyncio.sleep(0.3)
                proxied.proxy.blackhole = True
                hogging = asyncio.create_task(_hog(stop, block))
                ended_at = time.monotonic()
        elapsed = time.monotonic() - ended_at
    finally:
        stop.set()
        if hogging is not None:
            await hogging
        proxied.proxy.blackhole = False
        await redis.aclose()
    # Every loop iteration of the exit costs a block (about ten of them: ~1 s); the call that
    # ran on waited for socket_timeout (30 s).
    assert elapsed < 10.0
