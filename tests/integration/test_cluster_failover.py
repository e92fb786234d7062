"""Redis Cluster failover: a master is SIGKILLed mid-job and its replica takes over."""

from __future__ import annotations

import signal

import pytest
from redis.asyncio.cluster import RedisCluster

from jobpulse import LeaseLost, heartbeat
from jobpulse._protocol.keys import KeySchema
from jobpulse._provision import LocalCluster

from ..support import eventually


@pytest.fixture
def own_cluster() -> LocalCluster:
    with LocalCluster(node_timeout=1000) as cluster:
        yield cluster  # type: ignore[misc]


async def _master_port_of(client: RedisCluster, key: str) -> int:
    node = client.get_node_from_key(key)
    assert node is not None
    return int(node.port)


async def test_killing_the_jobs_master_mid_job_the_job_goes_on_or_is_claimed_once(
    own_cluster: LocalCluster,
) -> None:
    client = RedisCluster.from_url(own_cluster.url)
    await client.initialize()
    keys = KeySchema("jobpulse").job("failover")
    try:
        port = await _master_port_of(client, keys.state)
        victim = next(s for s in own_cluster.servers if s.port == port)
        outcome = "completed"
        try:
            async with heartbeat(client, "failover", interval=0.2, ttl=8.0) as hb:
                hb.progress.advance(5)
                await eventually(lambda: _done(client, keys.state, b"5"), within=10)
                assert victim.proc is not None
                victim.proc.send_signal(signal.SIGKILL)
                victim.proc.wait(5)
                hb.progress.advance(5)
                # the replica is promoted (cluster-node-timeout 1 s); beats resume on it
                await eventually(lambda: _done(client, keys.state, b"10"), within=30, step=0.2)
                new_port = await _master_port_of(client, keys.state)
                assert new_port != port
        except LeaseLost:
            outcome = "lost"  # allowed: the promoted replica had not seen the lease yet
        state = await client.hgetall(keys.state)
        # the snapshot is never silently lost: it ends in one terminal state, written once
        if outcome == "completed":
            assert state[b"status"] == b"COMPLETED"
            assert state[b"done"] == b"10"
        else:
            assert state[b"status"] in (b"LOST", b"RUNNING")
        ends = [e for _, e in await client.xrange(keys.events) if e[b"kind"] == b"end"]
        assert len(ends) <= 1
    finally:
        await client.aclose()


async def _done(client: RedisCluster, key: str, value: bytes) -> bool:
    try:
        return await client.hget(key, "done") == value  # type: ignore[no-any-return]
    except Exception:
        return False
