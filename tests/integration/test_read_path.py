"""The read on the wire (``_reader/fetch.py``): HMGET + PTTL + TIME in one write on a pooled
connection for plain clients, redis-py's pipeline for a cluster; RESP2 and RESP3, bytes and
text replies, both shells; a server that refuses ``TIME``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from jobpulse import JobState, StatusReader, script_time
from jobpulse._protocol.keys import KeySchema
from jobpulse._provision import LocalCluster, RedisServer
from jobpulse.sync import StatusReader as SyncStatusReader

SNAPSHOT = {
    "status": "RUNNING", "stage": "load", "done": "40", "total": "100", "rate": "2.5",
    "seq": "7", "fence": "3", "attempt": "1", "worker": "w:1", "meta": '{"a": 1}',
}  # fmt: skip


async def _seed(client: Any, ns: str, job: str, *, alive: bool = True) -> int:
    """A RUNNING snapshot whose beat was 2 s ago by the server's clock; returns that time."""
    keys = KeySchema(ns).job(job)
    seconds, micros = (
        await client.execute_command("TIME", target_nodes=None)
        if isinstance(client, RedisCluster)
        else await client.time()
    )
    beat = int(seconds) * 1000 + int(micros) // 1000 - 2000
    await client.hset(keys.state, mapping={**SNAPSHOT, "heartbeat_ms": beat, "progress_ms": beat})
    if alive:
        await client.set(keys.alive, 1, px=60_000)
    return beat


def _check(status: Any, job: str) -> None:
    assert status.job_id == job
    assert status.state is JobState.RUNNING
    assert (status.stage, status.done, status.total, status.rate) == ("load", 40, 100, 2.5)
    assert (status.seq, status.fence, status.attempt, status.worker) == (7, 3, 1, "w:1")
    assert status.meta == {"a": 1}
    assert status.percent == 40.0
    assert status.heartbeat_age is not None
    assert 2.0 <= status.heartbeat_age < 5.0


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("decode", [False, True])
async def test_get_decodes_the_same_status_over_resp2_and_resp3_bytes_and_text(
    redis_url: str, ns: str, protocol: int, decode: bool
) -> None:
    client = aioredis.Redis.from_url(redis_url, protocol=protocol, decode_responses=decode)
    try:
        beat = await _seed(client, ns, "j")
        async with StatusReader(client, namespace=ns, cache_ttl=0) as reader:
            status = await reader.get("j")
            _check(status, "j")
            assert status.heartbeat_ms == beat
            assert status.server_ms is not None
            assert status.server_ms - beat >= 2000
        async with StatusReader(client, namespace=ns, cache_ttl=0) as narrow:
            only = await narrow.get("j", fields=["done"])
            assert only.done == 40
            assert only.stage is None  # fields not asked are not read
        async with StatusReader(client, namespace=ns, cache_ttl=0) as reader:
            await client.delete(KeySchema(ns).alive("j"))
            assert (await reader.get("j")).state is JobState.STALE
    finally:
        await client.delete(*KeySchema(ns).job("j").all())
        await client.aclose()


async def test_the_fast_path_and_the_pipeline_give_the_same_status_single_and_cluster(
    client: aioredis.Redis | RedisCluster, ns: str
) -> None:
    await _seed(client, ns, "same")
    async with StatusReader(client, namespace=ns, cache_ttl=0) as reader:
        first = await reader.get("same")
        _check(first, "same")
        # the other way of sending the read (pipeline on a single Redis) gives the same answer
        reader._fast = not reader._fast and not isinstance(client, RedisCluster)
        second = await reader.get("same")
        _check(second, "same")
        assert second.server_ms is not None
        assert first.server_ms is not None
        assert second.server_ms >= first.server_ms


async def test_one_get_is_one_hmget_one_pttl_one_time_and_keeps_the_connection_in_step(
    private_redis: RedisServer,
) -> None:
    client = aioredis.Redis.from_url(private_redis.url, max_connections=2)
    try:
        await _seed(client, "ns", "j")
        await client.set("ns:{wrong}:state", "a string")  # WRONGTYPE on HMGET, mid-write
        await client.config_resetstat()
        async with StatusReader(client, namespace="ns", cache_ttl=0) as reader:
            for _ in range(5):
                _check(await reader.get("j"), "j")
                with pytest.raises(Exception, match="not a hash"):
                    await reader.get("wrong")
            # the error reply was read in its place: the pool's connections answer in step
            assert await client.get("ns:{wrong}:state") == b"a string"
        stats = await client.info("commandstats")
        assert stats["cmdstat_hmget"]["calls"] == 10
        assert stats["cmdstat_pttl"]["calls"] == 10
        assert stats["cmdstat_time"]["calls"] == 10
    finally:
        await client.aclose()


@pytest.fixture
def no_time() -> Iterator[RedisServer]:
    """A server with TIME renamed away: nobody may ask the server's clock."""
    with RedisServer(args=["--rename-command", "TIME", ""]) as server:
        yield server


async def _errors(client: aioredis.Redis) -> int:
    return int((await client.info("errorstats")).get("errorstat_ERR", {}).get("count", 0))


async def test_a_server_that_refuses_time_is_read_on_the_wall_clock_and_time_is_asked_once(
    no_time: RedisServer,
) -> None:
    client = aioredis.Redis.from_url(no_time.url)
    try:
        keys = KeySchema("ns").job("j")
        beat = int(time.time() * 1000) - 2000
        await client.hset(keys.state, mapping={**SNAPSHOT, "heartbeat_ms": beat})
        await client.set(keys.alive, 1, px=60_000)
        baseline = await _errors(client)  # the connection's own handshake errors, if any
        async with StatusReader(client, namespace="ns", cache_ttl=0) as reader:
            before = int(time.time() * 1000)
            status = await reader.get("j")
            after = int(time.time() * 1000)
            assert status.state is JobState.RUNNING
            assert status.done == 40
            assert status.server_ms is not None
            assert before <= status.server_ms <= after
            assert status.heartbeat_age is not None
            assert 2.0 <= status.heartbeat_age < 5.0
            refused = await _errors(client)
            assert refused == baseline + 1  # the one TIME refused
            for _ in range(3):
                assert (await reader.get("j")).state is JobState.RUNNING
            assert await _errors(client) == refused  # never asked again
            await client.delete(keys.alive)
            assert (await reader.get("j")).state is JobState.STALE  # the verdict is unchanged
    finally:
        await client.aclose()


def test_the_sync_reader_reads_a_server_that_refuses_time_and_one_with_time_renamed() -> None:
    with (
        RedisServer(args=["--rename-command", "TIME", ""]) as none,
        RedisServer(args=["--rename-command", "TIME", "JPTIME"]) as renamed,
    ):
        for server, command in ((none, None), (renamed, "JPTIME")):
            client = redis.Redis.from_url(server.url)
            try:
                if command is not None:
                    script_time(client, time_command=command)
                keys = KeySchema("ns").job("j")
                client.hset(keys.state, mapping=SNAPSHOT)
                reader = SyncStatusReader(client, namespace="ns", cache_ttl=0)
                before = int(time.time() * 1000)
                status = reader.get("j")
                assert status.state is JobState.STALE  # RUNNING without a liveness key
                assert status.server_ms is not None
                assert status.server_ms >= before - 1000
                if command is None:
                    assert reader._time.refused == "TIME"
                else:  # the renamed command is asked in every read: the server's own clock
                    assert reader._time.refused is None
                    seconds, micros = client.execute_command("JPTIME")
                    server_now = int(seconds) * 1000 + int(micros) // 1000
                    assert status.server_ms <= server_now
                    stats = client.info("commandstats")
                    assert stats["cmdstat_time"]["calls"] == 2  # the read's and ours
            finally:
                client.close()


def test_the_sync_reader_sends_the_same_read_over_resp3_and_after_a_killed_connection(
    private_redis: RedisServer,
) -> None:
    client = redis.Redis.from_url(private_redis.url, protocol=3)
    killer = redis.Redis.from_url(private_redis.url)
    try:
        keys = KeySchema("ns").job("j")
        client.hset(keys.state, mapping=SNAPSHOT)
        client.set(keys.alive, 1, px=60_000)
        reader = SyncStatusReader(client, namespace="ns", cache_ttl=0)
        assert reader.get("j").done == 40
        # the pooled connection dies between two reads: the connection's retry reconnects
        killer.client_kill_filter(_type="normal", skipme=True)
        status = reader.get("j")
        assert status.state is JobState.RUNNING
        assert status.done == 40
    finally:
        killer.close()
        client.close()


async def test_a_reader_on_a_cluster_client_never_initialized_reads(
    redis_cluster: LocalCluster, ns: str
) -> None:
    """``RedisCluster.from_url(...)`` as most code builds it (no ``await initialize()``): the
    first read must learn the slot map itself (found by the nemesis run on the cluster: the read
    asked the client for the job's node before any command had loaded the map, and raised
    ``SlotNotCoveredError``)."""
    seeder = await RedisCluster.from_url(redis_cluster.url).initialize()
    fresh = RedisCluster.from_url(redis_cluster.url)
    try:
        await _seed(seeder, ns, "fresh")
        status = await StatusReader(fresh, namespace=ns, cache_ttl=0).get("fresh")
        assert status.state is JobState.RUNNING
        assert status.seq == 7
    finally:
        keys = KeySchema(ns).job("fresh")
        await seeder.delete(keys.state)
        await seeder.delete(keys.alive)
        await seeder.aclose()
        await fresh.aclose()
