"""The job's ``kind`` in the snapshot and the start entry, and ``jobpulse.current()``."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from jobpulse import JobHeartbeat, StatusReader, current, heartbeat
from jobpulse._protocol.keys import KeySchema

AnyRedis = aioredis.Redis | RedisCluster


async def test_kind_is_in_the_snapshot_the_start_entry_and_the_status(
    client: AnyRedis, ns: str
) -> None:
    keys = KeySchema(ns).job("kinded")
    async with heartbeat(client, "kinded", namespace=ns, kind="tasks.report"):
        assert await client.hget(keys.state, "kind") == b"tasks.report"
        running = await StatusReader(client, namespace=ns, cache_ttl=0).get("kinded")
    entries = await client.xrange(keys.events)
    assert entries[0][1][b"kind"] == b"start"
    assert entries[0][1][b"job_kind"] == b"tasks.report"
    assert b"job_kind" not in entries[-1][1]  # only the start entry names it
    assert running.kind == "tasks.report"
    events = [e async for e in StatusReader(client, namespace=ns).watch("kinded")]
    assert events[0].job_kind == "tasks.report"


async def test_no_kind_reads_as_none(client: AnyRedis, ns: str) -> None:
    async with heartbeat(client, "plain", namespace=ns):
        pass
    status = await StatusReader(client, namespace=ns).get("plain")
    assert status.kind is None


async def test_current_is_the_heartbeat_of_this_task_only(client: AnyRedis, ns: str) -> None:
    seen_outside: list[JobHeartbeat | None] = []
    entered = asyncio.Event()
    release = asyncio.Event()

    async def bystander() -> None:
        await entered.wait()
        seen_outside.append(current())
        release.set()

    other = asyncio.create_task(bystander())
    assert current() is None
    async with heartbeat(client, "outer", namespace=ns) as outer:
        assert current() is outer

        async def child() -> JobHeartbeat | None:
            return current()

        assert await asyncio.create_task(child()) is outer  # tasks made in the body inherit it
        async with heartbeat(client, "inner", namespace=ns) as inner:
            assert current() is inner
        assert current() is outer
        entered.set()
        await release.wait()
    await other
    assert current() is None
    assert seen_outside == [None]  # a task that did not enter it does not see it
