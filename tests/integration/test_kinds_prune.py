"""The sweeper prunes the kinds set (``ns:{#kinds}``): a kind leaves it only when it was not
indexed for ``retention`` and its index is empty, never while a job of it starts. On a single
Redis and on a real Redis Cluster (the kinds set and each kind's index in different slots)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from jobpulse import Sweeper, heartbeat
from jobpulse._protocol.keys import KeySchema

AnyRedis = aioredis.Redis | RedisCluster
RETENTION = 60.0  # the sweeper's: a kind not indexed for 60 s may go


async def _kinds(client: AnyRedis, ns: str) -> list[str]:
    raw = await client.zrange(KeySchema(ns).kinds(), 0, -1)
    return sorted(k.decode() for k in raw)


async def _server_ms(client: AnyRedis) -> int:
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def test_old_kinds_with_empty_indexes_go_recent_and_busy_ones_stay(
    client: AnyRedis, ns: str
) -> None:
    schema = KeySchema(ns)
    now = await _server_ms(client)
    old = now - int(RETENTION * 1000) - 10_000
    await client.zadd(
        schema.kinds(),
        {"gone-a": old - 3, "busy": old - 2, "gone-c": old - 1, "recent": now + 5_000},
    )
    await client.zadd(schema.kind_index("busy"), {"job-1": 1})  # a job of it is indexed
    await Sweeper(client, namespace=ns, retention=RETENTION).sweep()
    # gone-a goes; busy stays, and so does every older-than-cutoff kind scored after it
    assert await _kinds(client, ns) == ["busy", "gone-c", "recent"]

    await client.zrem(schema.kind_index("busy"), "job-1")
    await Sweeper(client, namespace=ns, retention=RETENTION).sweep()
    assert await _kinds(client, ns) == ["recent"]


async def test_a_sweeper_prunes_at_most_once_a_minute(client: AnyRedis, ns: str) -> None:
    schema = KeySchema(ns)
    sweeper = Sweeper(client, namespace=ns, retention=RETENTION)
    await sweeper.sweep()  # the first sweep prunes (nothing there)
    await client.zadd(schema.kinds(), {"old": 1})
    await sweeper.sweep()
    assert await _kinds(client, ns) == ["old"]  # not due yet for this sweeper
    await Sweeper(client, namespace=ns, retention=RETENTION).sweep()
    assert await _kinds(client, ns) == []


class _StartsBeforeRemoval:
    """The sweeper's client, which runs ``before()`` — a job starting — between the prune's
    index check and its removal: the race the prune must survive."""

    def __init__(self, real: AnyRedis, before: Callable[[], Awaitable[None]]) -> None:
        self._real = real
        self._before = before

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    async def zremrangebyscore(self, *args: Any) -> Any:
        await self._before()
        return await self._real.zremrangebyscore(*args)


async def test_a_job_starting_between_the_check_and_the_removal_keeps_its_kind(
    client: AnyRedis, ns: str
) -> None:
    schema = KeySchema(ns)
    await client.zadd(schema.kinds(), {"report": 1})  # indexed long ago, no job now
    hb = heartbeat(client, "r-1", namespace=ns, kind="report", interval=0.2, ttl=2.0)

    async def start() -> None:
        await hb.__aenter__()

    sweeper = Sweeper(_StartsBeforeRemoval(client, start), namespace=ns, retention=RETENTION)
    try:
        await sweeper.sweep()
        assert hb.fence > 0  # the job started inside the prune
        assert await _kinds(client, ns) == ["report"]
        assert await client.zscore(schema.kinds(), "report") > await _server_ms(client)
        assert await client.zcard(schema.kind_index("report")) == 1
    finally:
        await hb.__aexit__(None, None, None)
