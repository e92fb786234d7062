"""Redis Cluster failover: a master is SIGKILLed mid-job and its replica takes over."""

from __future__ import annotations

import signal

import pytest
from redis.asyncio.cluster import RedisCluster

from jobpulse import heartbeat
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


async def test_killing_the_jobs_master_mid_job_the_job_goes_on_on_the_promoted_replica(
    own_cluster: LocalCluster,
) -> None:
    """The replica has every write up to the kill (WAIT), the failover (node timeout 1 s) is
    far shorter than the lease (8 s): the one right outcome is that the job goes on on the
    promoted replica and completes, with its snapshot and exactly one end entry."""
    client = RedisCluster.from_url(own_cluster.url)
    await client.initialize()
    keys = KeySchema("jobpulse").job("failover")
    try:
        port = await _master_port_of(client, keys.state)
        victim = next(s for s in own_cluster.servers if s.port == port)
        async with heartbeat(client, "failover", interval=0.2, ttl=8.0) as hb:
            hb.progress.advance(5)
            await eventually(lambda: _done(client, keys.state, b"5"), within=10)
            node = client.get_node_from_key(keys.state)
            acked = await client.execute_command("WAIT", 1, 5000, target_nodes=node)
            assert acked == 1  # the replica holds the lease and the snapshot
            assert victim.proc is not None
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait(5)
            hb.progress.advance(5)
            # the replica is promoted (cluster-node-timeout 1 s); beats resume on it
            await eventually(lambda: _done(client, keys.state, b"10"), within=30, step=0.2)
            new_port = await _master_port_of(client, keys.state)
            assert new_port != port
        state = await client.hgetall(keys.state)
        assert state[b"status"] == b"COMPLETED"
        assert state[b"done"] == b"10"
        assert state[b"fence"] == str(hb.fence).encode()
        ends = [e for _, e in await client.xrange(keys.events) if e[b"kind"] == b"end"]
        assert len(ends) == 1
    finally:
        await client.aclose()


async def _done(client: RedisCluster, key: str, value: bytes) -> bool:
    try:
        return await client.hget(key, "done") == value  # type: ignore[no-any-return]
    except Exception:
        return False
