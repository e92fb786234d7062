"""A job's slot held MIGRATING on a real Redis Cluster: its keys already sit on the importing
node, so every command for them is answered ASK. jobpulse follows ASK itself, ``ASKING`` and
the command in one write on one connection of the importing node (``_protocol/cluster.py``),
so beats, the final write, ``get()``, the watch and a cancel go on for as long as the slot
stays MIGRATING.

redis-py 8.1's asyncio cluster client sends ``ASKING`` and the command on two pooled
connections; with two or more free connections on the importing node (made here up front, as
any busy client has) the command arrives without ``ASKING``, is sent back with MOVED, and after
16 redirections fails: before this fix the job lost its lease in this test every time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster

from jobpulse import Event, JobCancelled, JobState, StatusReader, heartbeat, request_cancel
from jobpulse._protocol.keys import JobKeys, KeySchema
from jobpulse._provision import LocalCluster

from ..support import eventually


@pytest.fixture
def own_cluster() -> Iterator[LocalCluster]:
    """A cluster of this test's own: a slot of it is left MIGRATING for seconds."""
    with LocalCluster(masters=3, replicas=0) as cluster:
        yield cluster


@dataclass
class Migration:
    client: RedisCluster
    keys: JobKeys
    slot: int
    src: ClusterNode
    dst: ClusterNode
    admin: dict[str, Redis]
    node_id: dict[str, str]

    async def hold(self, *, job: bool = True) -> None:
        """MIGRATING on src, IMPORTING on dst, every key of the slot moved to dst: the slot
        is held there (no SETSLOT NODE yet), so src answers ASK for the job's keys (``job``:
        they exist)."""
        await self.admin[self.dst.name].execute_command(
            "CLUSTER", "SETSLOT", self.slot, "IMPORTING", self.node_id[self.src.name]
        )
        await self.admin[self.src.name].execute_command(
            "CLUSTER", "SETSLOT", self.slot, "MIGRATING", self.node_id[self.dst.name]
        )
        names = await self.admin[self.src.name].execute_command(
            "CLUSTER", "GETKEYSINSLOT", self.slot, 100
        )
        if not job:
            assert names == []
            return
        assert {n.decode() for n in names} >= {self.keys.state, self.keys.alive}
        await self.admin[self.src.name].execute_command(
            "MIGRATE", self.dst.host, self.dst.port, "", 0, 5000, "KEYS", *names
        )

    async def end(self) -> None:
        """The slot becomes dst's on every master (destination first, as redis-cli does)."""
        order = [self.dst.name, self.src.name]
        order += [n for n in self.admin if n not in order]
        for name in order:
            await self.admin[name].execute_command(
                "CLUSTER", "SETSLOT", self.slot, "NODE", self.node_id[self.dst.name]
            )

    async def src_keys(self) -> int:
        return int(
            await self.admin[self.src.name].execute_command("CLUSTER", "COUNTKEYSINSLOT", self.slot)
        )


@pytest.fixture
async def migration(own_cluster: LocalCluster) -> AsyncIterator[Migration]:
    client = await RedisCluster.from_url(own_cluster.url).initialize()
    keys = KeySchema("jobpulse").job("asked")
    src = client.get_node_from_key(keys.state)
    assert src is not None
    dst = next(n for n in client.get_primaries() if n.name != src.name)
    admin = {n.name: Redis(host=n.host, port=n.port) for n in client.get_primaries()}
    try:
        node_id = {
            name: (await r.execute_command("CLUSTER", "MYID")).decode() for name, r in admin.items()
        }
        # Several free connections on the importing node, as a client serving other work has.
        await asyncio.gather(*(client.execute_command("PING", target_nodes=dst) for _ in range(4)))
        yield Migration(client, keys, client.keyslot(keys.state), src, dst, admin, node_id)
    finally:
        for r in admin.values():
            await r.aclose()
        await client.aclose()


async def test_a_job_goes_on_while_its_slot_stays_migrating(migration: Migration) -> None:
    client = migration.client
    async with StatusReader(client, cache_ttl=0, watch_block=0.2, liveness_interval=0.5) as reader:
        events: list[Event] = []

        async def watch() -> None:
            async for event in reader.watch("asked"):
                events.append(event)

        async with heartbeat(client, "asked", interval=0.05, ttl=1.0, stream_every=1) as hb:
            watching = asyncio.create_task(watch())
            await hb.checkpoint(step="before")
            await eventually(lambda: _true(any(e.details == {"step": "before"} for e in events)))
            await migration.hold()
            assert await migration.src_keys() == 0
            beats = hb.statistics().beats_written
            # Three leases' worth of time with the slot MIGRATING: every beat is asked over.
            for step in range(6):
                hb.progress.advance(1)
                await hb.checkpoint(step=step)
                status = await reader.get("asked")
                assert status.state is JobState.RUNNING
                await asyncio.sleep(0.5)
            assert hb.statistics().beats_written > beats + 30
            assert status.done == 6  # the last read saw the last checkpoint's progress
            await eventually(lambda: _true(any(e.details == {"step": 5} for e in events)))
        # The final write went through ASK too: the job ended COMPLETED on dst.
        assert (await reader.get("asked")).state is JobState.COMPLETED
        await asyncio.wait_for(watching, 10)
    assert await migration.src_keys() == 0  # nothing was written back on the old owner
    assert events[-1].kind == "end"
    assert [e.details["step"] for e in events if e.kind == "checkpoint"] == [
        "before",
        *range(6),
    ]
    await migration.end()


async def test_a_cancel_reaches_a_job_whose_slot_stays_migrating(migration: Migration) -> None:
    client = migration.client
    with pytest.raises(JobCancelled):
        async with heartbeat(client, "asked", interval=0.05, ttl=1.0) as hb:
            await hb.checkpoint(step="before")
            await migration.hold()
            assert await request_cancel(client, "asked")  # cancel.lua, asked over to dst
            await asyncio.sleep(10)
            pytest.fail("the body should have been cancelled")
    assert (await StatusReader(client, cache_ttl=0).get("asked")).state is JobState.CANCELLED
    assert await migration.src_keys() == 0
    await migration.end()


async def test_a_job_cannot_start_in_a_slot_held_migrating_and_says_why(
    migration: Migration,
) -> None:
    """A new job's keys exist nowhere yet: the importing node answers its multi-key acquire
    TRYAGAIN (Redis's rule for a slot being imported) until the move ends."""
    client = migration.client
    await migration.hold(job=False)
    with pytest.raises(TimeoutError, match=r"TryAgainError.*acquire its lease"):
        async with heartbeat(client, "asked", interval=0.05, ttl=1.0):
            pytest.fail("the job should not have started")
    assert (await StatusReader(client, cache_ttl=0).get("asked")).state is JobState.UNKNOWN
    await migration.end()
    async with heartbeat(client, "asked", interval=0.05, ttl=1.0) as hb:  # the move is over
        assert hb.attempt == 1
    assert (await StatusReader(client, cache_ttl=0).get("asked")).state is JobState.COMPLETED


async def _true(value: bool) -> bool:
    return value
