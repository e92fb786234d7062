"""The packed read under faults: a connection cut between the request and its reply, a read
cancelled while its reply is on the way. The pool never hands out a connection out of step."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from jobpulse import JobState, StatusReader
from jobpulse._protocol.keys import KeySchema

from .conftest import Proxied


async def _seed(client: aioredis.Redis, job: str, done: int) -> None:
    keys = KeySchema("ns").job(job)
    await client.hset(keys.state, mapping={"status": "RUNNING", "done": done, "seq": 1})
    await client.set(keys.alive, 1, px=60_000)


async def test_a_reply_lost_mid_read_is_sent_again_by_the_connections_retry(
    proxied: Proxied,
) -> None:
    await _seed(proxied.direct, "cut", 5)
    client = aioredis.Redis.from_url(proxied.proxy.url, retry=Retry(NoBackoff(), 2))
    try:
        async with StatusReader(client, namespace="ns", cache_ttl=0) as reader:
            assert (await reader.get("cut")).done == 5  # a pooled connection exists
            cut = proxied.proxy.drop_reply_once(b"ns:{cut}:state")
            status = await reader.get("cut")  # Redis ran it; the reply never came; sent again
            assert cut.is_set()
            assert status.state is JobState.RUNNING
            assert status.done == 5
            assert await client.hget("ns:{cut}:state", "done") == b"5"  # the pool is in step
    finally:
        await client.aclose()


async def test_a_reply_lost_mid_read_without_retries_raises_and_the_next_read_is_in_step(
    proxied: Proxied,
) -> None:
    await _seed(proxied.direct, "cut", 5)
    await _seed(proxied.direct, "other", 6)
    client = proxied.via_proxy  # redis-py's default here: no retry
    async with StatusReader(client, namespace="ns", cache_ttl=0) as reader:
        assert (await reader.get("cut")).done == 5
        cut = proxied.proxy.drop_reply_once(b"ns:{cut}:state")
        with pytest.raises(redis.exceptions.ConnectionError):
            await reader.get("cut")
        assert cut.is_set()
        assert (await reader.get("other")).done == 6
        assert (await reader.get("cut")).done == 5


async def test_a_read_cancelled_while_its_reply_is_on_the_way_leaves_no_stale_reply(
    proxied: Proxied,
) -> None:
    await _seed(proxied.direct, "slow", 1)
    await _seed(proxied.direct, "next", 2)
    client = proxied.via_proxy
    async with StatusReader(client, namespace="ns", cache_ttl=0) as reader:
        assert (await reader.get("slow")).done == 1
        proxied.proxy.delay_reply_once(b"ns:{slow}:state", 0.5)
        task = asyncio.create_task(reader.get("slow"))
        await asyncio.sleep(0.15)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert task.cancelled()
        await asyncio.sleep(0.6)  # the held reply has been released by now
        # every later read and command gets its own reply, not the cancelled read's
        assert (await reader.get("next")).done == 2
        assert await client.hget("ns:{next}:state", "done") == b"2"
        assert (await reader.get("slow")).done == 1


async def test_a_read_that_times_out_raises_and_leaves_the_pool_in_step(proxied: Proxied) -> None:
    await _seed(proxied.direct, "held", 3)
    await _seed(proxied.direct, "after", 4)
    client = aioredis.Redis.from_url(proxied.proxy.url, socket_timeout=0.3)
    try:
        async with StatusReader(client, namespace="ns", cache_ttl=0) as reader:
            assert (await reader.get("held")).done == 3
            proxied.proxy.blackhole = True  # the request and its reply are held
            with pytest.raises(redis.exceptions.TimeoutError):
                await reader.get("held")
            proxied.proxy.blackhole = False  # the held bytes flow again, to a closed connection
            await asyncio.sleep(0.2)
            assert (await reader.get("after")).done == 4
            assert (await reader.get("held")).done == 3
            assert await client.hget("ns:{after}:state", "done") == b"4"
    finally:
        await client.aclose()
