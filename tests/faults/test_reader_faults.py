"""The reader under faults: a lagging replica never sends it back in time."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from jobpulse import JobState, StatusReader, heartbeat
from jobpulse._provision import RedisServer

from ..support import eventually
from .proxy import FaultProxy


async def test_a_reader_alternating_with_a_lagging_replica_never_goes_back_in_time(
    private_redis: RedisServer,
) -> None:
    master = aioredis.Redis.from_url(private_redis.url)
    with (
        RedisServer() as replica_server,
        FaultProxy(private_redis.port) as replication_link,  # the replica lags 300 ms
        FaultProxy([private_redis.port, replica_server.port]) as balancer,
    ):
        replication_link.latency = 0.3
        replica = aioredis.Redis.from_url(replica_server.url)
        await replica.execute_command("REPLICAOF", "127.0.0.1", str(replication_link.port))
        await eventually(lambda: _synced(replica), within=20)
        via_balancer = aioredis.Redis.from_url(balancer.url)
        try:
            async with (
                StatusReader(via_balancer, cache_ttl=0) as reader,
                heartbeat(master, "lagged", interval=0.02, ttl=2.0) as hb,
            ):
                await eventually(lambda: replica.exists("jobpulse:{lagged}:state"), within=10)
                seqs: list[int] = []
                for _ in range(60):
                    hb.progress.advance()
                    status = await reader.get("lagged")
                    assert status.state is JobState.RUNNING
                    assert status.seq is not None
                    seqs.append(status.seq)
                    # the next read opens a new connection: to the other server
                    await via_balancer.connection_pool.disconnect()
                    await asyncio.sleep(0.03)
                kept = reader.statistics().cache.kept_newer
            assert seqs == sorted(seqs), seqs
            assert kept > 0, "the replica never answered with an older snapshot: nothing tested"
        finally:
            await via_balancer.aclose()
            await replica.aclose()
            await master.aclose()


async def _synced(replica: aioredis.Redis) -> bool:
    info = await replica.info("replication")
    return info.get("master_link_status") == "up"
