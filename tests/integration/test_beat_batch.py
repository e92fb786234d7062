"""``beat.lua`` beats several jobs in one call: each job is checked (owner, fence, seq) and
answered on its own, a batch replayed answers each job as the first run did, and the ticker
sends one call per batch of due jobs (per hash slot on a cluster)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import ResponseError

from jobpulse import heartbeat, script_time
from jobpulse._protocol import calls
from jobpulse._protocol.calls import BeatCode, BeatReply
from jobpulse._protocol.keys import JobKeys, KeySchema, alive_value
from jobpulse._provision import LocalCluster, RedisServer

from ..support import eventually

AnyRedis = aioredis.Redis | RedisCluster


def same_slot_ids(count: int) -> list[str]:
    """``count`` job ids whose keys share one hash slot (a cluster batch holds only those)."""
    first = "batch-0"
    slot = key_slot(first.encode())
    ids = [first]
    for i in itertools.count(1):
        if len(ids) == count:
            return ids
        if key_slot(f"batch-{i}".encode()) == slot:
            ids.append(f"batch-{i}")
    raise AssertionError("unreachable")


async def started(client: AnyRedis, keys: JobKeys) -> tuple[int, int]:
    """Acquire the job with token ``tok``; (fence, the snapshot's seq)."""
    acquire = calls.acquire(keys.all(), token="tok", ttl_ms=60_000, maxlen=100, worker="w")
    reply = await calls.run(client, acquire)
    assert reply.code is calls.AcquireCode.STARTED
    return reply.fence, reply.seq


def segment(fence: int, seq: int, done: str, event: bool = False) -> list[Any]:
    return calls.beat_segment(
        token="tok",
        fence=fence,
        ttl_ms=60_000,
        seq=seq,
        fields={"done": done, "total": "", "stage": ""},
        event=("checkpoint", '{"at":' + done + "}", 100) if event else None,
    )


async def test_each_job_of_a_batch_is_checked_and_answered_on_its_own(
    client: AnyRedis, ns: str
) -> None:
    schema = KeySchema(ns)
    ok, fenced, taken, behind = (schema.job(i) for i in same_slot_ids(4))
    state = {k: await started(client, k) for k in (ok, fenced, taken, behind)}
    await client.delete(fenced.alive)  # a claim moved the fence on: alive gone
    await client.set(fenced.fence, state[fenced][0] + 1)
    await client.set(taken.alive, "someone-else:1")  # another worker holds the lease
    await client.hset(behind.state, "seq", 50)  # a newer snapshot than the beat's
    await client.set(behind.alive, alive_value("tok", state[behind][0], 50), keepttl=True)

    batch = [
        (k.all(), segment(state[k][0], state[k][1] + 1, "7", event=True))
        for k in (ok, fenced, taken, behind)
    ]
    first = await calls.run(client, calls.beats(batch))
    assert [r.code for r in first if isinstance(r, BeatReply)] == [
        BeatCode.WRITTEN,
        BeatCode.FENCED_OUT,
        BeatCode.TAKEN_OVER,
        BeatCode.SEQ_BEHIND,
    ]
    assert first[3] == BeatReply(BeatCode.SEQ_BEHIND, False, first[3].now_ms, 50)  # type: ignore[union-attr]
    assert await client.hget(ok.state, "done") == b"7"
    for refused in (fenced, taken, behind):
        assert await client.hget(refused.state, "done") == b"0"  # nothing written
    assert await client.get(taken.alive) == b"someone-else:1"
    assert await client.get(fenced.alive) is None  # not renewed for a fenced-out beat

    again = await calls.run(client, calls.beats(batch))  # a client retry of the same call
    assert [r.code for r in again if isinstance(r, BeatReply)] == [r.code for r in first]  # type: ignore[union-attr]
    kinds = [e[1][b"kind"] for e in await client.xrange(ok.events)]
    assert kinds == [b"start", b"checkpoint"]  # written once
    for refused in (fenced, taken, behind):
        assert [e[1][b"kind"] for e in await client.xrange(refused.events)] == [b"start"]


async def test_a_command_failing_for_one_job_leaves_the_others_written(
    redis: aioredis.Redis, ns: str
) -> None:
    schema = KeySchema(ns)
    jobs = [schema.job(f"j-{i}") for i in range(3)]
    state = {k: await started(redis, k) for k in jobs}
    await redis.delete(jobs[1].state)
    await redis.set(jobs[1].state, "not a hash")  # HMGET on it fails with WRONGTYPE
    batch = [(k.all(), segment(state[k][0], state[k][1] + 1, "3")) for k in jobs]
    replies = await calls.run(redis, calls.beats(batch))
    assert isinstance(replies[1], ResponseError)
    assert "WRONGTYPE" in str(replies[1])
    for i in (0, 2):
        assert replies[i] == BeatReply(BeatCode.WRITTEN, False, replies[i].now_ms, 0)  # type: ignore[union-attr]
        assert await redis.hget(jobs[i].state, "done") == b"3"


async def test_the_ticker_beats_jobs_due_together_in_one_call(
    private_redis: RedisServer,
) -> None:
    client = aioredis.Redis.from_url(private_redis.url)
    release = asyncio.Event()

    async def job(i: int) -> int:
        async with heartbeat(client, f"many-{i}", interval=1.0, ttl=6.0) as hb:
            await release.wait()
        return hb.statistics().beats_sent

    try:
        tasks = [asyncio.create_task(job(i)) for i in range(40)]
        await eventually(lambda: _all_running(client, 40), within=10)
        await client.config_resetstat()
        await asyncio.sleep(3.5)
        stats = await client.info("commandstats")
        release.set()
        await asyncio.gather(*tasks)
    finally:
        await client.aclose()
    beats = stats["cmdstat_getex"]["calls"]  # each beat GETEXes alive once (and nothing else)
    calls_sent = stats["cmdstat_evalsha"]["calls"]
    assert beats >= 40 * 2
    assert calls_sent * 5 <= beats  # 40 jobs that entered together share a few calls a tick


async def _all_running(client: aioredis.Redis, n: int) -> bool:
    return await client.zcard(KeySchema().index(0)) == n


async def test_a_batch_in_argument_time_writes_every_job_at_the_stamped_time(
    client: AnyRedis, ns: str
) -> None:
    """A server that refuses TIME in scripts: the batch takes the time as its last argument
    (one for all its jobs), each job's segment unchanged."""
    clock = script_time(client, mode="argument", time_command=None)  # the local wall clock
    schema = KeySchema(ns)
    jobs = [schema.job(i) for i in same_slot_ids(3)]
    state = {k: await started(client, k) for k in jobs}
    batch = [(k.all(), segment(state[k][0], state[k][1] + 1, "4")) for k in jobs]
    before = clock.now_ms()
    replies = await calls.run(client, calls.beats(batch))
    after = clock.now_ms()
    for keys, reply in zip(jobs, replies, strict=True):
        assert isinstance(reply, BeatReply)
        assert reply.code is BeatCode.WRITTEN
        assert before <= reply.now_ms <= after
        assert int(await client.hget(keys.state, "heartbeat_ms")) == reply.now_ms
        assert await client.hget(keys.state, "done") == b"4"


async def test_jobs_of_one_slot_beat_together_through_a_cluster_pipeline(
    redis_cluster: LocalCluster, ns: str
) -> None:
    """On a cluster the ticker groups due jobs by hash slot: jobs whose ids share a slot go in
    one call (its keys all in that slot, as the cluster pipeline requires), the others alone."""
    client = RedisCluster.from_url(redis_cluster.url)
    ids = [*same_slot_ids(3), "alone-1", "alone-2"]
    release = asyncio.Event()

    async def job(job_id: str) -> tuple[int, int]:
        async with heartbeat(client, job_id, namespace=ns, interval=0.05, ttl=2.0) as hb:
            await release.wait()
            hb.progress.set(9)
            await hb.checkpoint(step=1)  # a beat answered as written after the set
        stats = hb.statistics()
        return stats.beats_written, stats.beats_failed

    try:
        await client.script_load(calls.SCRIPTS.beat.text)  # on every master: no NOSCRIPT retry
        tasks = [asyncio.create_task(job(i)) for i in ids]
        await asyncio.sleep(0.6)  # about ten beats each, the same-slot ones sharing calls
        release.set()
        results = await asyncio.gather(*tasks)
        for job_id, (written, failed) in zip(ids, results, strict=True):
            assert written >= 5, job_id
            assert failed == 0, job_id
            state = await client.hgetall(KeySchema(ns).state(job_id))
            assert (state[b"status"], state[b"done"]) == (b"COMPLETED", b"9"), job_id
    finally:
        await client.aclose()
