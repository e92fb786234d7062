"""A regular beat sends only the keys its path touches (issue 28, item 1): state and alive, plus
events when it carries a stream entry. A beat that needs the fence (alive missing: a re-take)
answers ``RESEND_KEYS`` before any write, and the worker sends it again at once, same seq, with
every key. On a cluster every key a script touches is declared: the short beat never reaches
the fence or the stream."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from jobpulse import heartbeat
from jobpulse._protocol import calls
from jobpulse._protocol.keys import AliveValue, JobKeys, KeySchema
from jobpulse.sync import heartbeat as sync_heartbeat

AnyRedis = aioredis.Redis | RedisCluster


async def _started(client: AnyRedis, keys: JobKeys) -> tuple[int, int]:
    acquire = calls.acquire(keys.all(), token="tok", ttl_ms=60_000, maxlen=100, worker="w")
    reply = await calls.run(client, acquire)
    assert reply.code is calls.AcquireCode.STARTED
    return reply.fence, reply.seq


def _short(fence: int, seq: int, fields: dict[str, Any], **kw: Any) -> list[Any]:
    """A beat as the worker sends it on the regular path: only state and alive (and events)."""
    present = [i for i, name in enumerate(calls.BEAT_FIELDS) if name in fields]
    values = [fields[calls.BEAT_FIELDS[i]] for i in present]
    return calls.encode_beat(
        ("tok", fence, 60_000), seq, seq - 1, present, values, every_key=False, **kw
    )


async def _everything(client: AnyRedis, keys: JobKeys) -> tuple[Any, ...]:
    return (
        await client.hgetall(keys.state),
        await client.xlen(keys.events),
        await client.get(keys.alive),
        await client.get(keys.fence),
    )


def test_a_short_beat_names_two_keys_or_three_with_an_entry() -> None:
    keys = KeySchema("ns").job("j")
    regular = _short(1, 2, {"done": "1"})
    entry = _short(1, 2, {"done": "1", "total": "", "stage": ""}, event=("beat", "", 100))
    full = calls.beat_segment(token="tok", fence=1, ttl_ms=60_000, seq=2, fields={"done": "1"})
    assert calls.beat_keys(keys.beat(), regular) == (keys.state, keys.alive)
    assert calls.beat_keys(keys.beat(), entry) == (keys.state, keys.alive, keys.events)
    assert calls.beat_keys(keys.beat(), full) == (keys.state, keys.alive, keys.events, keys.fence)
    command = calls.beat_command([((keys.state, keys.alive), regular)])
    assert command[2:5] == [2, keys.state, keys.alive]


async def test_a_regular_beat_and_a_checkpoint_beat_write_with_their_own_keys(
    client: AnyRedis, ns: str
) -> None:
    keys = KeySchema(ns).job("short")
    fence, seq = await _started(client, keys)
    regular = await calls.run(client, calls.beat(keys.all(), _short(fence, seq + 1, {"done": "3"})))
    assert regular.code is calls.BeatCode.WRITTEN
    checkpoint = _short(
        fence,
        seq + 2,
        {"done": "4", "total": "", "stage": "load"},
        event=("checkpoint", '{"at":4}', 100),
        pairs=["checkpoint", '{"at":4}'],
    )
    written = await calls.run(client, calls.beat(keys.all(), checkpoint))
    assert written.code is calls.BeatCode.WRITTEN
    state = await client.hgetall(keys.state)
    assert (state[b"done"], state[b"seq"], state[b"checkpoint"]) == (
        b"4",
        b"%d" % (seq + 2),
        b'{"at":4}',
    )
    last = (await client.xrevrange(keys.events, count=1))[0][1]
    assert (last[b"kind"], last[b"details"], last[b"seq"]) == (
        b"checkpoint",
        b'{"at":4}',
        b"%d" % (seq + 2),
    )
    assert AliveValue.parse(await client.get(keys.alive)) == AliveValue(
        "tok", fence, seq + 2, False
    )


async def test_a_short_beat_without_alive_answers_resend_keys_before_any_write(
    client: AnyRedis, ns: str
) -> None:
    keys = KeySchema(ns).job("resend")
    fence, seq = await _started(client, keys)
    await client.delete(keys.alive, keys.fence)  # expired, and the counter lost with it
    before = await _everything(client, keys)
    short = calls.beat(keys.all(), _short(fence, seq + 1, {"done": "7"}))
    first = await calls.run(client, short)
    again = await calls.run(client, short)  # a replay answers the same, writing nothing
    assert first == again == calls.BeatReply(calls.BeatCode.RESEND_KEYS, False, 0, 0)
    assert await _everything(client, keys) == before

    # the same beat (same seq) with every key re-takes the lease and restores the fence
    full = calls.encode_beat(("tok", fence, 60_000), seq + 1, seq, [0], ["7"])
    retaken = await calls.run(client, calls.beat(keys.all(), full))
    assert retaken.code is calls.BeatCode.RETAKEN
    assert await client.get(keys.fence) == b"%d" % fence
    assert await client.hmget(keys.state, "status", "fence", "done", "seq") == [
        b"RUNNING",
        b"%d" % fence,
        b"7",
        b"%d" % (seq + 1),
    ]
    assert AliveValue.parse(await client.get(keys.alive)) == AliveValue(
        "tok", fence, seq + 1, False
    )
    # a replay of either, now that alive is ours again: the beat landed, nothing is written twice
    assert (await calls.run(client, short)).code is calls.BeatCode.WRITTEN
    assert (await calls.run(client, calls.beat(keys.all(), full))).code is calls.BeatCode.WRITTEN
    assert await client.hget(keys.state, "seq") == b"%d" % (seq + 1)


async def test_a_short_beat_of_another_owner_is_refused_without_the_fence(
    client: AnyRedis, ns: str
) -> None:
    keys = KeySchema(ns).job("other")
    fence, seq = await _started(client, keys)
    await client.set(keys.alive, f"thief:{fence + 1}:{seq}:0")
    reply = await calls.run(client, calls.beat(keys.all(), _short(fence, seq + 1, {"done": "1"})))
    assert reply.code is calls.BeatCode.TAKEN_OVER


async def test_a_batch_of_mixed_jobs_answers_each_with_its_own_keys(
    redis: aioredis.Redis, ns: str
) -> None:
    schema = KeySchema(ns)
    regular, entry, lost, full = (schema.job(n) for n in ("regular", "entry", "lost", "full"))
    started = {k.state: await _started(redis, k) for k in (regular, entry, lost, full)}
    await redis.delete(lost.alive)
    fence = {k.state: started[k.state][0] for k in (regular, entry, lost, full)}
    seq = {k.state: started[k.state][1] + 1 for k in (regular, entry, lost, full)}
    batch = [
        (regular.all(), _short(fence[regular.state], seq[regular.state], {"done": "1"})),
        (
            entry.all(),
            _short(
                fence[entry.state],
                seq[entry.state],
                {"done": "2", "total": "", "stage": ""},
                event=("stage", "", 100),
            ),
        ),
        (lost.all(), _short(fence[lost.state], seq[lost.state], {"done": "3"})),
        (
            full.all(),
            calls.beat_segment(
                token="tok", fence=fence[full.state], ttl_ms=60_000, seq=seq[full.state],
                fields={"done": "4"},
            ),
        ),
    ]  # fmt: skip
    call = calls.beats(batch)
    assert len(call.keys) == 2 + 3 + 2 + 4
    replies = await calls.run(redis, call)
    codes = [r.code for r in replies if isinstance(r, calls.BeatReply)]
    assert codes == [
        calls.BeatCode.WRITTEN,
        calls.BeatCode.WRITTEN,
        calls.BeatCode.RESEND_KEYS,
        calls.BeatCode.WRITTEN,
    ]
    assert [await redis.hget(k.state, "done") for k in (regular, entry, lost, full)] == [
        b"1",
        b"2",
        b"0",  # the acquire's: the refused beat wrote nothing
        b"4",
    ]
    assert (await redis.xrevrange(entry.events, count=1))[0][1][b"kind"] == b"stage"


async def test_a_worker_re_takes_an_expired_lease_through_the_resend(
    client: AnyRedis, ns: str
) -> None:
    keys = KeySchema(ns).job("retake")
    async with heartbeat(client, "retake", namespace=ns, interval=0.05, ttl=2.0) as hb:
        token = AliveValue.parse(await client.get(keys.alive)).token
        await client.delete(keys.fence)  # lost with alive: only a beat with every key restores it
        await client.pexpire(keys.alive, 1)
        await asyncio.wait_for(_fence_back(client, keys), 5.0)
        assert await client.get(keys.fence) == b"%d" % hb.fence
        assert await client.hmget(keys.state, "status", "fence") == [b"RUNNING", b"%d" % hb.fence]
        alive = AliveValue.parse(await client.get(keys.alive))
        assert (alive.token, alive.fence) == (token, hb.fence)
    assert await client.hget(keys.state, "status") == b"COMPLETED"


async def _fence_back(client: AnyRedis, keys: JobKeys) -> None:
    while await client.get(keys.fence) is None:
        await asyncio.sleep(0.02)


def test_the_thread_ticker_re_takes_an_expired_lease_through_the_resend(
    sync_client: redis.Redis, ns: str
) -> None:
    keys = KeySchema(ns).job("sync-retake")
    with sync_heartbeat(sync_client, "sync-retake", namespace=ns, interval=0.05, ttl=2.0) as hb:
        token = AliveValue.parse(sync_client.get(keys.alive)).token
        sync_client.delete(keys.fence)
        sync_client.pexpire(keys.alive, 1)
        deadline = time.monotonic() + 5.0
        while sync_client.get(keys.fence) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sync_client.get(keys.fence) == b"%d" % hb.fence
        assert sync_client.hmget(keys.state, "status", "fence") == [b"RUNNING", b"%d" % hb.fence]
        alive = AliveValue.parse(sync_client.get(keys.alive))
        assert (alive.token, alive.fence) == (token, hb.fence)
    assert sync_client.hget(keys.state, "status") == b"COMPLETED"


async def test_the_sidecar_helper_re_takes_an_expired_lease_through_the_resend(
    redis: aioredis.Redis, ns: str
) -> None:
    keys = KeySchema(ns).job("side-retake")
    async with heartbeat(
        redis, "side-retake", namespace=ns, interval=0.05, ttl=2.0, sidecar=True
    ) as hb:
        token = AliveValue.parse(await redis.get(keys.alive)).token
        await redis.delete(keys.fence)
        await redis.pexpire(keys.alive, 1)
        await asyncio.wait_for(_fence_back(redis, keys), 5.0)
        assert await redis.get(keys.fence) == b"%d" % hb.fence
        assert await redis.hmget(keys.state, "status", "fence") == [b"RUNNING", b"%d" % hb.fence]
        alive = AliveValue.parse(await redis.get(keys.alive))
        assert (alive.token, alive.fence) == (token, hb.fence)
    assert await redis.hget(keys.state, "status") == b"COMPLETED"
