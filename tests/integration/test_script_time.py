"""Argument time: on a server that refuses ``TIME`` in scripts (``rename-command TIME``), the
worker (both shells), the sweeper and ``request_cancel`` work with the time as the scripts' last
argument; on a server that allows it, nothing changes."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

import jobpulse
from jobpulse import JobCancelled, JobState, Sweeper, heartbeat, request_cancel, script_time
from jobpulse._protocol import calls
from jobpulse._protocol.clock import clock_of, refuses_time
from jobpulse._protocol.keys import KeySchema
from jobpulse._protocol.scripts import SCRIPTS
from jobpulse._provision import RedisServer

from ..support import eventually

pytestmark = pytest.mark.destructive


@pytest.fixture
def no_time() -> Iterator[RedisServer]:
    """A server with TIME renamed away: neither scripts nor clients may call it."""
    with RedisServer(args=["--rename-command", "TIME", ""]) as server:
        yield server


@pytest.fixture
def renamed_time() -> Iterator[RedisServer]:
    """A server whose TIME is called JPTIME: scripts cannot read the clock, clients can."""
    with RedisServer(args=["--rename-command", "TIME", "JPTIME"]) as server:
        yield server


@pytest.fixture
async def aclient(no_time: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(no_time.url)
    yield client
    await client.aclose()


async def _snapshot(client: aioredis.Redis, ns: str, job: str) -> dict[str, str]:
    raw = await client.hgetall(KeySchema(ns).state(job))
    return {k.decode(): v.decode() for k, v in raw.items()}


async def test_the_server_refuses_time_in_scripts_and_a_server_mode_client_says_so(
    aclient: aioredis.Redis, ns: str
) -> None:
    script_time(aclient, mode="server")
    call = calls.enroll(KeySchema(ns).index_for("j"), "j", 1000)
    with pytest.raises(ResponseError) as caught:
        await calls.run(aclient, call)
    assert refuses_time(caught.value)
    assert await aclient.zcard(KeySchema(ns).index_for("j")) == 0  # refused before any write


async def test_async_job_runs_and_ends_completed_in_auto_detected_argument_time(
    aclient: aioredis.Redis, ns: str
) -> None:
    before = time.time() * 1000
    async with heartbeat(aclient, "a-1", total=10, interval=0.05, ttl=1.0, namespace=ns) as hb:
        hb.progress.set(4)
        hb.set_stage("load")
        await hb.checkpoint(step=1)
        seq = int((await _snapshot(aclient, ns, "a-1"))["seq"])
        await eventually(lambda: _later(aclient, ns, "a-1", seq + 3), within=5.0)  # beats go on
        hb.progress.set(10)
    after = time.time() * 1000
    clock = clock_of(aclient)
    assert clock.arguments
    assert clock.bound is None
    snap = await _snapshot(aclient, ns, "a-1")
    assert snap["status"] == "COMPLETED"
    assert snap["done"] == "10"
    assert snap["stage"] == "load"
    for field in ("started_ms", "heartbeat_ms", "progress_ms", "finished_ms"):
        assert before - 1 <= int(snap[field]) <= after + 1, field
    entries = await aclient.xrange(KeySchema(ns).events("a-1"))
    kinds = [e[1][b"kind"].decode() for e in entries]
    assert kinds[0] == "start"
    assert "checkpoint" in kinds
    assert kinds[-1] == "end"
    stamps = [int(e[1][b"ts_ms"]) for e in entries]
    assert stamps == sorted(stamps)
    assert before - 1 <= stamps[0]
    assert stamps[-1] <= after + 1


async def _later(client: aioredis.Redis, ns: str, job: str, seq: int) -> bool:
    return int((await _snapshot(client, ns, job)).get("seq", 0)) >= seq


async def test_a_script_flush_mid_job_reloads_the_argument_variant(
    aclient: aioredis.Redis, ns: str
) -> None:
    async with heartbeat(aclient, "f-1", interval=0.05, ttl=1.0, namespace=ns):
        seq = int((await _snapshot(aclient, ns, "f-1"))["seq"])
        await aclient.script_flush()
        await eventually(lambda: _later(aclient, ns, "f-1", seq + 3), within=5.0)
    assert clock_of(aclient).arguments
    assert (await _snapshot(aclient, ns, "f-1"))["status"] == "COMPLETED"


async def test_remote_cancel_reaches_a_job_in_argument_time(
    aclient: aioredis.Redis, ns: str
) -> None:
    script_time(aclient, mode="argument", time_command=None)
    with pytest.raises(JobCancelled):
        async with heartbeat(aclient, "c-1", interval=0.05, ttl=1.0, namespace=ns):
            assert await request_cancel(aclient, "c-1", namespace=ns)
            await asyncio.sleep(30)  # cancelled by the next beat's reply
    snap = await _snapshot(aclient, ns, "c-1")
    assert snap["status"] == "CANCELLED"
    kinds = [e[1][b"kind"] for e in await aclient.xrange(KeySchema(ns).events("c-1"))]
    assert kinds == [b"start", b"cancel", b"end"]


async def test_sweeper_claims_a_dead_workers_job_once_in_argument_time(
    aclient: aioredis.Redis, ns: str
) -> None:
    schema = KeySchema(ns)
    # A worker that started the job and died: index entry and acquire, then nothing.
    deadline = await calls.run(aclient, calls.enroll(schema.index_for("d-1"), "d-1", 200))
    acquire = calls.acquire(
        schema.job("d-1").all(), token="tok", ttl_ms=200, maxlen=100, worker="w", latest=deadline
    )
    reply = await calls.run(aclient, acquire)
    assert reply.code is calls.AcquireCode.STARTED
    assert clock_of(aclient).arguments  # detected on the first call
    await eventually(lambda: _gone(aclient, schema.job("d-1").alive), within=5.0)
    await aclient.script_flush()  # the sweeper reloads the argument variants it sends
    sweeper = Sweeper(aclient, namespace=ns)
    stale = await eventually(sweeper.sweep, within=5.0)
    assert [job.job_id for job in stale] == ["d-1"]
    assert stale[0].fence > reply.fence
    snap = await _snapshot(aclient, ns, "d-1")
    assert snap["status"] == "LOST"
    assert int(snap["finished_ms"]) >= reply.started_ms
    assert await Sweeper(aclient, namespace=ns).sweep() == []  # redelivered only after 60 s


async def _gone(client: aioredis.Redis, key: str) -> bool:
    return await client.exists(key) == 0


def test_sync_job_ends_completed_with_a_renamed_time_sampled_outside_scripts(
    renamed_time: RedisServer, ns: str
) -> None:
    client = redis.Redis.from_url(renamed_time.url)
    try:
        clock = script_time(client, time_command="JPTIME")
        with jobpulse.sync.heartbeat(
            client, "s-1", interval=0.05, ttl=1.0, namespace=ns, sidecar=False
        ) as hb:
            hb.progress.set(3)
            hb.checkpoint(step=1)
        assert clock.arguments
        bound = clock.bound
        assert bound is not None
        assert bound < 0.5
        seconds, micros = client.execute_command("JPTIME")
        server_ms = int(seconds) * 1000 + int(micros) // 1000
        raw = client.hgetall(KeySchema(ns).state("s-1"))
        snap = {k.decode(): v.decode() for k, v in raw.items()}
        assert snap["status"] == "COMPLETED"
        assert snap["done"] == "3"
        ahead_ms = math.ceil(bound * 1000) + 1  # the estimate's bound (see the test below)
        assert server_ms - 5000 <= int(snap["finished_ms"]) <= server_ms + ahead_ms
    finally:
        client.close()


async def test_default_time_sends_the_beat_command_unchanged(
    redis: aioredis.Redis, ns: str
) -> None:
    async with heartbeat(redis, "p-1", interval=0.05, ttl=1.0, namespace=ns):
        await eventually(lambda: _later(redis, ns, "p-1", 4), within=5.0)
    clock = clock_of(redis)
    command = ["EVALSHA", SCRIPTS.beat.sha, 4, *KeySchema(ns).job("p-1").all(), "t", 1, 1000, 2]
    assert not clock.arguments
    assert clock.stamp(command) is command
    assert (await _snapshot(redis, ns, "p-1"))["status"] == JobState.COMPLETED.name


async def test_forced_argument_time_runs_a_job_and_a_claim_on_a_single_server_and_a_cluster(
    client: aioredis.Redis | RedisCluster, ns: str
) -> None:
    clock = script_time(client, mode="argument")
    async with heartbeat(client, "g-1", interval=0.05, ttl=1.0, namespace=ns) as hb:
        hb.progress.set(2)
        await hb.checkpoint(step=1)
    bound = clock.bound
    assert bound is not None  # sampled from TIME outside the scripts
    assert bound < 0.5
    raw = await client.hgetall(KeySchema(ns).state("g-1"))
    assert raw[b"status"] == b"COMPLETED"
    seconds, micros = await client.execute_command("TIME")
    server_ms = int(seconds) * 1000 + int(micros) // 1000
    # The stamp is the sample's midpoint estimate: ahead of the server by up to the bound (half
    # the sample's round trip, a few ms on a loaded machine; one sample, so the bound read now
    # covers the stamp's), and whole milliseconds
    ahead_ms = math.ceil(bound * 1000) + 1
    assert server_ms - 10_000 <= int(raw[b"finished_ms"]) <= server_ms + ahead_ms
    schema = KeySchema(ns)
    deadline = await calls.run(client, calls.enroll(schema.index_for("g-2"), "g-2", 200))
    acquire = calls.acquire(
        schema.job("g-2").all(), token="tok", ttl_ms=200, maxlen=100, worker="w", latest=deadline
    )
    reply = await calls.run(client, acquire)
    assert reply.code is calls.AcquireCode.STARTED
    sweeper = Sweeper(client, namespace=ns)
    stale = await eventually(sweeper.sweep, within=5.0)
    assert [job.job_id for job in stale] == ["g-2"]
