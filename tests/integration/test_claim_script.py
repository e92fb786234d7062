"""claim.lua and unindex.lua, as assembled by scripts.py, against a real Redis server."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from jobpulse._protocol.keys import JobKeys, KeySchema
from jobpulse._protocol.scripts import SCRIPTS, evalsha

MAXLEN, RETENTION_MS = 100, 60_000
AnyRedis = aioredis.Redis | RedisCluster


async def seed_running(
    redis: AnyRedis, keys: JobKeys, *, fence: int = 3, seq: int = 7, **extra: str
) -> None:
    """A RUNNING snapshot as a worker leaves it, with its fence counter, and no liveness."""
    await redis.hset(
        keys.state,
        mapping={
            "status": "RUNNING",
            "stage": "load",
            "done": "5",
            "seq": seq,
            "fence": fence,
            "attempt": "1",
            "worker": "w:1",
            "heartbeat_ms": "1000",
            "checkpoint": '{"offset":5}',
            **extra,
        },
    )
    await redis.set(keys.fence, fence)
    await redis.xadd(keys.events, {"kind": "start", "fence": fence})


async def claim(
    redis: AnyRedis,
    keys: JobKeys,
    error: str = "stale: test",
    *,
    token: str = "sweep-1",
    redeliver_ms: int = 60_000,
) -> list:
    args = [MAXLEN, RETENTION_MS, error, redeliver_ms, token]
    return await evalsha(redis, SCRIPTS.claim, keys.all(), args)


async def test_claim_of_a_stale_job_bumps_the_fence_writes_lost_and_returns_the_snapshot(
    redis: aioredis.Redis, ns: str
) -> None:
    keys = KeySchema(ns).job("stale")
    await seed_running(redis, keys, cancel="1")
    reply = await claim(redis, keys, "stale: claimed by t")
    assert reply[0] == 1
    assert reply[1] == 4  # fence 3 + 1
    snapshot = dict(zip(reply[3::2], reply[4::2], strict=True))
    assert snapshot[b"status"] == b"RUNNING"  # as it was before the claim
    assert snapshot[b"checkpoint"] == b'{"offset":5}'
    state = await redis.hgetall(keys.state)
    assert state[b"status"] == b"LOST"
    assert state[b"fence"] == b"4"
    assert state[b"seq"] == b"8"
    assert state[b"error"] == b"stale: claimed by t"
    assert state[b"finished_ms"] == str(reply[2]).encode()
    assert state[b"checkpoint"] == b'{"offset":5}'  # kept: the next attempt resumes from it
    assert b"cancel" not in state
    assert await redis.get(keys.fence) == b"4"
    last = (await redis.xrevrange(keys.events, count=1))[0][1]
    assert last[b"kind"] == b"stale"
    assert last[b"status"] == b"LOST"
    assert last[b"fence"] == b"4"
    for key in (keys.state, keys.events, keys.fence):
        assert 0 < await redis.pttl(key) <= RETENTION_MS


async def test_a_claim_is_answered_again_to_its_replay_and_after_its_redelivery_time(
    client: AnyRedis, ns: str
) -> None:
    keys = KeySchema(ns).job("twice")
    await seed_running(client, keys)
    first = await claim(client, keys, redeliver_ms=300)
    assert (await claim(client, keys, redeliver_ms=300))[:3] == first[:3]  # a replay
    code, left = await claim(client, keys, token="sweep-2", redeliver_ms=300)
    assert code == -1  # another sweeper, before the redelivery time: come back later
    assert 0 < left <= 300
    await asyncio.sleep(left / 1000 + 0.05)
    again = await claim(client, keys, token="sweep-2", redeliver_ms=300)
    assert again[:3] == first[:3] == [1, 4, first[2]]  # same fence, same claim time
    assert (await claim(client, keys, token="sweep-3"))[0] == -1  # due again 300 ms later
    snapshot = dict(zip(again[3::2], again[4::2], strict=True))
    assert snapshot[b"status"] == b"RUNNING"
    assert snapshot[b"attempt"] == b"1"
    assert snapshot[b"checkpoint"] == b'{"offset":5}'
    assert not {b"claim", b"claim_due_ms", b"claim_token"} & set(snapshot)
    assert await client.get(keys.fence) == b"4"  # bumped once
    kinds = [e[1][b"kind"] for e in await client.xrange(keys.events)]
    assert kinds.count(b"stale") == 1
    assert await client.hget(keys.state, "claim") == b"4"  # the unacknowledged-claim marker

    assert await evalsha(client, SCRIPTS.ack, keys.all(), [4]) == 1
    assert await evalsha(client, SCRIPTS.ack, keys.all(), [4]) == 1  # a replay: the same
    assert await client.hmget(keys.state, "claim", "claim_due_ms", "claim_token") == [None] * 3
    assert await claim(client, keys, token="sweep-2") == [0]  # acknowledged: not running
    assert await client.hget(keys.state, "status") == b"LOST"


async def test_an_ack_of_another_claim_changes_nothing(client: AnyRedis, ns: str) -> None:
    keys = KeySchema(ns).job("other")
    await seed_running(client, keys)
    assert (await claim(client, keys))[1] == 4
    assert await evalsha(client, SCRIPTS.ack, keys.all(), [3]) == 0
    assert await client.hget(keys.state, "claim") == b"4"


async def test_concurrent_claims_of_one_job_have_exactly_one_winner(
    redis_url: str, redis: aioredis.Redis, ns: str
) -> None:
    keys = KeySchema(ns).job("contended")
    await seed_running(redis, keys)
    clients = [aioredis.Redis.from_url(redis_url) for _ in range(8)]
    try:
        replies = await asyncio.gather(
            *(claim(c, keys, token=f"s{i}") for i, c in enumerate(clients) for _ in range(5))
        )
    finally:
        for c in clients:
            await c.aclose()
    # The winner's token sees its own claim 5 times (a replay answers it); the others wait.
    assert sorted(r[0] for r in replies) == [-1] * 35 + [1] * 5
    assert {r[1] for r in replies if r[0] == 1} == {4}
    kinds = [e[1][b"kind"] for e in await redis.xrange(keys.events)]
    assert kinds.count(b"stale") == 1
    assert await redis.get(keys.fence) == b"4"


async def test_alive_job_is_not_claimed_and_its_time_left_is_returned(
    redis: aioredis.Redis, ns: str
) -> None:
    keys = KeySchema(ns).job("alive")
    await seed_running(redis, keys)
    await redis.set(keys.alive, 3, px=4000)
    code, left = await claim(redis, keys)
    assert code == -1
    assert 0 < left <= 4000
    assert await redis.hget(keys.state, "status") == b"RUNNING"
    assert await redis.get(keys.fence) == b"3"


async def test_ended_or_missing_job_is_not_running(redis: aioredis.Redis, ns: str) -> None:
    schema = KeySchema(ns)
    done = schema.job("done")
    await seed_running(redis, done)
    await redis.hset(done.state, "status", "COMPLETED")
    assert await claim(redis, done) == [0]
    assert await redis.hget(done.state, "status") == b"COMPLETED"
    assert await claim(redis, schema.job("never-existed")) == [0]
    assert not await redis.exists(*schema.job("never-existed").all())


async def test_fence_counter_lost_with_the_data_still_moves_past_the_snapshot(
    redis: aioredis.Redis, ns: str
) -> None:
    keys = KeySchema(ns).job("no-counter")
    await seed_running(redis, keys, fence=9)
    await redis.delete(keys.fence)
    reply = await claim(redis, keys)
    assert reply[:2] == [1, 10]
    assert await redis.get(keys.fence) == b"10"


async def test_unindex_removes_only_entries_not_rescored_since_read(
    redis: aioredis.Redis, ns: str
) -> None:
    index = KeySchema(ns).index(0)
    await redis.zadd(index, {"a": 100, "b": 100, "c": 100})
    await redis.zadd(index, {"b": 5000})  # a new attempt of b started after the read
    removed = await evalsha(
        redis, SCRIPTS.unindex, (index,), ["a", "100.0", "b", "100.0", "gone", "100"]
    )
    assert removed == 1
    assert await redis.zrange(index, 0, -1, withscores=True) == [(b"c", 100.0), (b"b", 5000.0)]
