"""Redis Cluster resharding mid-job: the job's slot moves to another master (MIGRATING /
IMPORTING, MIGRATE of its keys, SETSLOT NODE) while it beats and a reader watches it. The slot
is held MIGRATING with the job's keys already on the importing node for two leases' worth of
time (every command for them is answered ASK: jobpulse follows it with ``ASKING`` on the same
connection, ``_protocol/cluster.py``), then becomes the new owner's (MOVED from then on): the
beats go on, the watch loses and repeats nothing, and ``get`` answers throughout.

Before jobpulse followed ASK itself, holding the slot MIGRATING failed this test in 2 of 14
runs: redis-py 8.1's asyncio cluster client sends ``ASKING`` and the command on two pooled
connections, so a beat got through only when the pool handed out the same one twice, and the
job could go ``ttl`` without a written beat (docs/scaling.md, "Resharding").
``test_cluster_ask.py`` makes that pairing fail every time."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from jobpulse import Event, JobState, JobStatus, StatusReader, heartbeat
from jobpulse._protocol.errors import is_redis_fault
from jobpulse._protocol.keys import KeySchema
from jobpulse._provision import LocalCluster

from ..support import eventually


@pytest.fixture
def own_cluster() -> Iterator[LocalCluster]:
    """A cluster of this test's own: it is resharded."""
    with LocalCluster(masters=3, replicas=0) as cluster:
        yield cluster


async def test_moving_the_jobs_slot_mid_job_beats_and_watch_go_on(
    own_cluster: LocalCluster,
) -> None:
    client = await RedisCluster.from_url(own_cluster.url).initialize()
    try:
        keys = KeySchema("jobpulse").job("moving")
        slot = client.keyslot(keys.state)
        src = client.get_node_from_key(keys.state)
        assert src is not None
        dst = next(n for n in client.get_primaries() if n.name != src.name)
        admin = {n.name: Redis(host=n.host, port=n.port) for n in client.get_primaries()}
        node_id = {
            name: (await r.execute_command("CLUSTER", "MYID")).decode() for name, r in admin.items()
        }

        # Several free connections on the importing node, as a busy client has.
        await asyncio.gather(*(client.execute_command("PING", target_nodes=dst) for _ in range(4)))

        async def written(hb: object, more_than: int) -> bool:
            return hb.statistics().beats_written > more_than  # type: ignore[attr-defined,no-any-return]

        try:
            async with StatusReader(client, watch_block=0.5, liveness_interval=0.5) as reader:
                events: list[Event] = []

                async def watch() -> None:
                    async for event in reader.watch("moving"):
                        events.append(event)

                async with heartbeat(
                    client, "moving", interval=0.05, ttl=1.0, stream_every=1
                ) as hb:
                    watching = asyncio.create_task(watch())
                    await hb.checkpoint(step="before")
                    await eventually(
                        lambda: _true(any(e.details == {"step": "before"} for e in events))
                    )

                    # 1. The slot moves: its keys go to dst, then every master learns the
                    # slot is dst's. Destination first, then source, then the others (as
                    # redis-cli does), so no node sends a client back and forth.
                    hb.progress.advance(3)
                    await admin[dst.name].execute_command(
                        "CLUSTER", "SETSLOT", slot, "IMPORTING", node_id[src.name]
                    )
                    await admin[src.name].execute_command(
                        "CLUSTER", "SETSLOT", slot, "MIGRATING", node_id[dst.name]
                    )
                    names = await admin[src.name].execute_command(
                        "CLUSTER", "GETKEYSINSLOT", slot, 100
                    )
                    assert {n.decode() for n in names} >= {keys.state, keys.events, keys.alive}
                    await admin[src.name].execute_command(
                        "MIGRATE", dst.host, dst.port, "", 0, 5000, "KEYS", *names
                    )
                    # Held MIGRATING for two leases: beats, reads and the watch are asked over.
                    held = hb.statistics().beats_written
                    for step in range(4):
                        await hb.checkpoint(step=f"held {step}")
                        assert (await StatusReader(client, cache_ttl=0).get("moving")).state is (
                            JobState.RUNNING
                        )
                        await asyncio.sleep(0.5)
                    assert hb.statistics().beats_written > held + 20
                    assert hb.statistics().lease == "held"
                    order = [
                        dst.name,
                        src.name,
                        *(n for n in admin if n not in (dst.name, src.name)),
                    ]
                    for name in order:
                        await admin[name].execute_command(
                            "CLUSTER", "SETSLOT", slot, "NODE", node_id[dst.name]
                        )
                    assert (
                        await admin[src.name].execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)
                        == 0
                    )
                    # 2. The slot is dst's (MOVED from now on): beats, reads and the watch go on.
                    mid = await eventually(lambda: _read(client, "moving"), within=30)
                    assert mid.state is JobState.RUNNING
                    beats = hb.statistics().beats_written
                    hb.progress.advance(4)
                    await hb.checkpoint(step="after")
                    await eventually(lambda: written(hb, beats + 5), within=30)
                await asyncio.wait_for(watching, 30)
                status = await reader.get("moving")
                stats = reader.statistics().watch
        finally:
            for r in admin.values():
                await r.aclose()
        ids = [e[0].decode() for e in await client.xrange(keys.events)]
        assert [e.id for e in events] == ids  # no gap, no duplicate across the move
        assert [e.details for e in events if e.kind == "checkpoint"] == [
            {"step": "before"},
            *({"step": f"held {step}"} for step in range(4)),
            {"step": "after"},
        ]
        assert events[-1].kind == "end"
        assert status.state is JobState.COMPLETED
        assert status.done == 7
        assert await admin_owner(client, keys.state) == dst.name
        assert stats.reroutes >= 1  # the watch loop saw ASK or MOVED and re-resolved
    finally:  # also on failure: a client left open fails a later test (unclosed sockets)
        await client.aclose()


async def admin_owner(client: RedisCluster, key: str) -> str:
    await client.nodes_manager.initialize()
    node = client.get_node_from_key(key)
    assert node is not None
    return str(node.name)


async def _read(client: RedisCluster, job_id: str) -> JobStatus | None:
    try:
        return await StatusReader(client, cache_ttl=0).get(job_id)
    except Exception as exc:
        if not is_redis_fault(exc):
            raise
        return None


async def _true(value: bool) -> bool:
    return value
