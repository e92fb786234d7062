"""The shared ticker: one beat loop per client, and a server-clock offset taken only from
replies that carry the server's time."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import redis.asyncio as aioredis

from jobpulse import LeaseLost, LeaseLostCause, heartbeat
from jobpulse._protocol.keys import KeySchema
from jobpulse._provision import RedisServer

from ..faults.proxy import FaultProxy
from ..support import eventually


async def _written(hb: object, more_than: int) -> bool:
    return hb.statistics().beats_written > more_than  # type: ignore[attr-defined,no-any-return]


async def _server_ms(redis: aioredis.Redis) -> int:
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def test_a_refused_beat_leaves_other_jobs_index_deadlines_in_the_future(
    redis: aioredis.Redis, ns: str
) -> None:
    """A fenced-out job's beat replies ``{-2,0,0,0}``: its zero is not the server's clock, so
    the next index refresh of another job on the same client stays ahead of the server time."""
    schema = KeySchema(ns)
    index = schema.index_for("steady")
    async with heartbeat(
        redis, "steady", namespace=ns, interval=1.0, ttl=10.0, index_every=1
    ) as steady:
        with pytest.raises(LeaseLost) as info:
            async with heartbeat(redis, "doomed", namespace=ns, interval=0.05, ttl=5.0):
                await eventually(lambda: _written(steady, 0), within=5)
                # Right after steady's beat: the doomed job's next beat (within 0.05 s) is
                # refused long before steady's next one (1 s), so it is the last reply seen.
                keys = schema.job("doomed")
                await redis.delete(keys.alive)
                await redis.incr(keys.fence)  # a sweeper's claim moved the fence
                await asyncio.sleep(30)  # cancelled once the refused beat is seen
        assert info.value.cause is LeaseLostCause.FENCED_OUT
        written = steady.statistics().beats_written
        await eventually(lambda: _written(steady, written), within=5)  # refreshed its entry
        score = await redis.zscore(index, "steady")
        now = await _server_ms(redis)
    assert score is not None
    assert score > now  # was about 20,000 (1970) before: a sweeper would claim it at once


async def test_a_job_entering_while_the_last_loop_drains_never_starts_a_second_loop(
    private_redis: RedisServer,
) -> None:
    """The last job leaves while its beat is in flight; jobs enter while that send drains and
    after it ended: exactly one beat loop runs for the client, whatever the order."""
    with FaultProxy(private_redis.port) as proxy:
        client = aioredis.Redis.from_url(proxy.url)
        try:
            held, leave = asyncio.Event(), asyncio.Event()

            async def first() -> None:
                async with heartbeat(client, "first", interval=0.1, ttl=5.0) as hb:
                    await eventually(lambda: _written(hb, 0), within=5)
                    sent = hb.statistics().beats_sent
                    proxy.latency = 2.0  # the next beat's reply is held 2 s by the proxy
                    await eventually(lambda: _true(hb.statistics().beats_sent > sent), within=5)
                    await asyncio.sleep(0.3)  # its reply is in the proxy, waiting
                    proxy.latency = 0.0
                    held.set()
                    await leave.wait()

            running = asyncio.create_task(first())
            await asyncio.wait_for(held.wait(), 10)
            (old_loop,) = _ticker_tasks()
            leave.set()
            await running  # its final write went through a connection of its own
            async with heartbeat(client, "second", interval=0.1, ttl=5.0):
                assert not old_loop.done()  # still draining the held beat
                await asyncio.wait_for(old_loop, 5)
                async with heartbeat(client, "third", interval=0.1, ttl=5.0) as third:
                    await eventually(lambda: _written(third, 2), within=5)
                    assert _loops() == 1
        finally:
            with contextlib.suppress(Exception):
                await client.aclose()


def _ticker_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == "jobpulse-ticker" and not t.done()]


def _loops() -> int:
    return len(_ticker_tasks())


async def _true(value: bool) -> bool:
    return value
