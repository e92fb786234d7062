"""The lease folded into ``alive`` (issue 28, item 1): one key, ``<token>:<fence>:<seq>:<cancel>``
of the owner, the snapshot's seq and its cancel flag, ``PX ttl``; its absence while RUNNING still
means STALE. The beat's regular path reads seq and cancel there, so it costs three
``redis.call``s per job (counted by the server's own ``INFO commandstats``)."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from jobpulse._protocol import calls
from jobpulse._protocol.keys import AliveValue, JobKeys, KeySchema, alive_value
from jobpulse._provision import RedisServer

AnyRedis = aioredis.Redis | RedisCluster


def test_alive_value_is_token_fence_seq_cancel_and_parses_back() -> None:
    assert alive_value("ab12", 1796096775961107, 9) == "ab12:1796096775961107:9:0"
    assert alive_value("ab12", 7, 9, cancel=True) == "ab12:7:9:1"
    parsed = AliveValue.parse(b"ab12:1796096775961107:9:1")
    assert parsed == AliveValue("ab12", 1796096775961107, 9, True)
    assert AliveValue.parse("ab12:7:9:0:later:fields") == AliveValue("ab12", 7, 9, False)
    for bad in ("7", "ab12:7", ":7:9:0", "ab12:x:9:0", "ab12:7:9", "ab12:7:9:2"):
        with pytest.raises(ValueError, match="not a jobpulse alive value"):
            AliveValue.parse(bad)


@pytest.mark.parametrize("token", ["", "a:b"])
def test_a_token_that_would_not_split_back_is_refused_before_any_call(token: str) -> None:
    with pytest.raises(ValueError, match="owner token"):
        calls.acquire(("s", "e", "a", "f"), token=token, ttl_ms=1000, maxlen=10, worker="w")


async def test_alive_holds_the_owner_and_its_fence_until_the_end(client: AnyRedis, ns: str) -> None:
    keys = KeySchema(ns).job("fold")
    acquire = calls.acquire(keys.all(), token="tok", ttl_ms=60_000, maxlen=100, worker="w")
    started = await calls.run(client, acquire)
    assert started.code is calls.AcquireCode.STARTED
    assert await client.get(keys.alive) == f"tok:{started.fence}:{started.seq}:0".encode()
    assert 0 < await client.pttl(keys.alive) <= 60_000
    assert await client.exists(f"{ns}:{{fold}}:lease") == 0  # no separate lease key

    again = await calls.run(client, acquire)  # a replay answers the attempt it started
    assert (again.code, again.fence) == (calls.AcquireCode.STARTED, started.fence)
    other = calls.acquire(keys.all(), token="other", ttl_ms=60_000, maxlen=100, worker="w")
    assert (await calls.run(client, other)).code is calls.AcquireCode.BUSY

    beat = calls.beat_segment(
        token="tok", fence=started.fence, ttl_ms=30_000, seq=started.seq + 1, fields={"done": "1"}
    )
    assert (await calls.run(client, calls.beat(keys.all(), beat))).code is calls.BeatCode.WRITTEN
    alive = AliveValue.parse(await client.get(keys.alive))
    assert alive == AliveValue("tok", started.fence, started.seq + 1, False)
    assert 0 < await client.pttl(keys.alive) <= 30_000  # renewed with the beat's ttl

    finish = calls.finish(
        keys.all(),
        token="tok",
        fence=started.fence,
        ttl_ms=30_000,
        seq=started.seq + 2,
        status="COMPLETED",
        error="",
        maxlen=100,
        retention_ms=60_000,
        dynamic=["1", "", "", "", "", "", "", "0"],
    )
    assert await calls.run(client, finish) is calls.FinishCode.WRITTEN
    assert await client.exists(keys.alive) == 0  # released


async def _calls_per_beat(client: aioredis.Redis, ns: str, beats: int) -> dict[str, float]:
    keys = KeySchema(ns).job("counted")
    acquire = calls.acquire(keys.all(), token="tok", ttl_ms=60_000, maxlen=100, worker="w")
    started = await calls.run(client, acquire)
    # the first beat sends every field; the regular ones after it only what changed
    await client.config_resetstat()
    for n in range(1, beats + 1):
        segment = calls.beat_segment(
            token="tok",
            fence=started.fence,
            ttl_ms=60_000,
            seq=started.seq + n,
            fields={"done": str(n), "rate": f"{n}.5"},
        )
        reply = await calls.run(client, calls.beat(keys.all(), segment))
        assert reply.code is calls.BeatCode.WRITTEN
    stats = await client.info("commandstats")
    counted = {
        name.removeprefix("cmdstat_"): value["calls"] / beats
        for name, value in stats.items()
        if not name.startswith(
            ("cmdstat_evalsha", "cmdstat_info", "cmdstat_config", "cmdstat_script")
        )
    }
    return counted


async def test_a_regular_beat_makes_the_calls_its_header_counts(
    private_redis: RedisServer,
) -> None:
    client = aioredis.Redis.from_url(private_redis.url)
    try:
        counted = await _calls_per_beat(client, "cnt", 20)
    finally:
        await client.aclose()
    # TIME once per call, then per job: GETEX alive (its seq read there), HSET, SET alive
    assert counted == {"time": 1.0, "getex": 1.0, "hset": 1.0, "set": 1.0}


async def _started(client: AnyRedis, keys: JobKeys) -> tuple[int, int]:
    acquire = calls.acquire(keys.all(), token="tok", ttl_ms=60_000, maxlen=100, worker="w")
    reply = await calls.run(client, acquire)
    assert reply.code is calls.AcquireCode.STARTED
    return reply.fence, reply.seq


def _beat(fence: int, seq: int, done: str, **extra: str) -> list[object]:
    fields = {"done": done, **extra}
    return calls.beat_segment(token="tok", fence=fence, ttl_ms=60_000, seq=seq, fields=fields)


async def test_a_cancel_is_seen_through_alive_on_the_regular_path(
    client: AnyRedis, ns: str
) -> None:
    keys = KeySchema(ns).job("cancelled")
    fence, seq = await _started(client, keys)
    first = await calls.run(client, calls.beat(keys.all(), _beat(fence, seq + 1, "1")))
    assert (first.code, first.cancel) == (calls.BeatCode.WRITTEN, False)
    ttl = await client.pttl(keys.alive)
    assert await calls.run(client, calls.cancel(keys.all(), 100, "")) is calls.CancelCode.REQUESTED
    assert AliveValue.parse(await client.get(keys.alive)).cancel  # marked, the TTL kept
    assert 0 < await client.pttl(keys.alive) <= ttl
    again = await calls.run(client, calls.cancel(keys.all(), 100, ""))  # a replay
    assert again is calls.CancelCode.ALREADY_REQUESTED
    beat = await calls.run(client, calls.beat(keys.all(), _beat(fence, seq + 2, "2")))
    assert (beat.code, beat.cancel) == (calls.BeatCode.WRITTEN, True)
    assert await client.get(keys.alive) == f"tok:{fence}:{seq + 2}:1".encode()  # kept on


async def test_a_regular_beat_moves_progress_ms_only_when_done_moved(
    client: AnyRedis, ns: str
) -> None:
    """A ``done`` sent on the regular path is one that moved (the worker sends only changed
    fields); one sent unknown (``done_moved=None``: the worker does not know the stored value)
    moves ``progress_ms`` only if it differs from the stored one; one sent unchanged
    (``done_moved=False``, a beat with an entry) leaves it."""
    keys = KeySchema(ns).job("progress")
    fence, seq = await _started(client, keys)
    start = int(await client.hget(keys.state, "progress_ms"))
    same = calls.encode_beat(("tok", fence, 60_000), seq + 1, seq, [0], ["0"], done_moved=None)
    assert (await calls.run(client, calls.beat(keys.all(), same))).code is calls.BeatCode.WRITTEN
    assert int(await client.hget(keys.state, "progress_ms")) == start  # done 0 as stored
    await asyncio.sleep(0.01)
    moved = calls.encode_beat(("tok", fence, 60_000), seq + 2, seq + 1, [0], ["5"])
    assert (await calls.run(client, calls.beat(keys.all(), moved))).code is calls.BeatCode.WRITTEN
    moved_at = int(await client.hget(keys.state, "progress_ms"))
    assert moved_at > start
    await asyncio.sleep(0.01)
    still = calls.encode_beat(
        ("tok", fence, 60_000), seq + 3, seq + 2, [0], ["5"], done_moved=False
    )
    assert (await calls.run(client, calls.beat(keys.all(), still))).code is calls.BeatCode.WRITTEN
    assert int(await client.hget(keys.state, "progress_ms")) == moved_at


async def test_a_rollback_with_alive_restored_older_answers_resend_and_so_does_its_replay(
    client: AnyRedis, ns: str
) -> None:
    """A restart from an older RDB restores ``alive`` and the snapshot as of one moment (one
    script writes both): the seq alive carries is below ``landed``, so the regular path answers
    3, writing nothing of the beat, and its replay answers 3 again."""
    keys = KeySchema(ns).job("older")
    fence, seq = await _started(client, keys)
    assert (await calls.run(client, calls.beat(keys.all(), _beat(fence, seq + 1, "1")))).code == 1
    state, alive = await client.dump(keys.state), await client.dump(keys.alive)
    assert (await calls.run(client, calls.beat(keys.all(), _beat(fence, seq + 2, "2")))).code == 1
    await client.restore(keys.state, 0, state, replace=True)
    await client.restore(keys.alive, 60_000, alive, replace=True)
    before = await client.hgetall(keys.state)

    behind = calls.beat(keys.all(), _beat(fence, seq + 3, "3"))  # landed: seq + 2
    first, again = await calls.run(client, behind), await calls.run(client, behind)
    assert first.code is again.code is calls.BeatCode.RESEND_STATIC
    assert await client.hgetall(keys.state) == before  # status and fence were already there
    assert await client.get(keys.alive) == f"tok:{fence}:{seq + 1}:0".encode()


async def test_a_snapshot_lost_alone_while_alive_lives_is_undone_and_answered_resend(
    client: AnyRedis, ns: str
) -> None:
    """The snapshot deleted or evicted alone, ``alive`` still ours: the regular path cannot see
    it before its HSET, so it reads the HSET's count of added fields (``seq`` is added only into
    a lost snapshot), undoes the beat and answers 3, as for a restart that lost both; the replay
    answers 3 again; the worker's next beat (every field, ``landed`` 0) repairs the snapshot."""
    keys = KeySchema(ns).job("lost-alone")
    fence, seq = await _started(client, keys)
    intact = calls.beat_segment(  # a first checkpoint into an intact snapshot adds one field
        token="tok",
        fence=fence,
        ttl_ms=60_000,
        seq=seq + 1,
        fields={"done": "1"},
        pairs=["checkpoint", '{"row": 1}'],
    )
    assert (await calls.run(client, calls.beat(keys.all(), intact))).code is calls.BeatCode.WRITTEN
    await client.delete(keys.state)

    checkpoint = calls.beat_segment(
        token="tok",
        fence=fence,
        ttl_ms=60_000,
        seq=seq + 2,
        fields={"done": "2"},
        pairs=["checkpoint", '{"row": 2}'],
    )
    after = calls.beat(keys.all(), checkpoint)
    first, again = await calls.run(client, after), await calls.run(client, after)
    assert first.code is again.code is calls.BeatCode.RESEND_STATIC
    restored = {b"status": b"RUNNING", b"fence": str(fence).encode()}
    assert await client.hgetall(keys.state) == restored  # nothing of the beat
    assert await client.get(keys.alive) == f"tok:{fence}:{seq + 1}:0".encode()  # seq kept

    full = calls.beat_segment(
        token="tok", fence=fence, ttl_ms=60_000, seq=seq + 2, landed=0, fields={"done": "2"}
    )
    assert (await calls.run(client, calls.beat(keys.all(), full))).code is calls.BeatCode.WRITTEN
    state = await client.hgetall(keys.state)
    assert (state[b"seq"], state[b"done"]) == (str(seq + 2).encode(), b"2")


async def test_a_cancel_outlives_a_snapshot_lost_alone(client: AnyRedis, ns: str) -> None:
    """A cancel marks the snapshot and ``alive``; the snapshot lost alone (deleted, evicted),
    alive's flag still says so: the undone beat restores ``cancel`` with status and fence, and
    the full resend that repairs the snapshot keeps the flag in both (a reader and a second
    cancel still see the request)."""
    keys = KeySchema(ns).job("cancel-lost-alone")
    fence, seq = await _started(client, keys)
    assert (await calls.run(client, calls.beat(keys.all(), _beat(fence, seq + 1, "1")))).code == 1
    assert await calls.run(client, calls.cancel(keys.all(), 100, "")) is calls.CancelCode.REQUESTED
    await client.delete(keys.state)

    after = calls.beat(keys.all(), _beat(fence, seq + 2, "2"))
    first, again = await calls.run(client, after), await calls.run(client, after)
    assert (first.code, first.cancel) == (calls.BeatCode.RESEND_STATIC, True)
    assert (again.code, again.cancel) == (calls.BeatCode.RESEND_STATIC, True)
    assert await client.hget(keys.state, "cancel") == b"1"

    full = calls.beat_segment(
        token="tok", fence=fence, ttl_ms=60_000, seq=seq + 2, landed=0, fields={"done": "2"}
    )
    reply = await calls.run(client, calls.beat(keys.all(), full))
    assert (reply.code, reply.cancel) == (calls.BeatCode.WRITTEN, True)
    assert await client.hget(keys.state, "cancel") == b"1"
    assert await client.get(keys.alive) == f"tok:{fence}:{seq + 2}:1".encode()
    again_cancel = await calls.run(client, calls.cancel(keys.all(), 100, ""))
    assert again_cancel is calls.CancelCode.ALREADY_REQUESTED


async def test_a_full_resend_keeps_alive_s_cancel_flag_when_the_snapshot_lost_it(
    client: AnyRedis, ns: str
) -> None:
    """A full resend (``landed`` 0: the slow path) into a snapshot lost alone after a cancel:
    alive's flag is the request's only record, so the beat answers it and writes it back."""
    keys = KeySchema(ns).job("cancel-resend")
    fence, seq = await _started(client, keys)
    assert await calls.run(client, calls.cancel(keys.all(), 100, "")) is calls.CancelCode.REQUESTED
    await client.delete(keys.state)
    full = calls.beat_segment(
        token="tok", fence=fence, ttl_ms=60_000, seq=seq + 1, landed=0, fields={"done": "1"}
    )
    reply = await calls.run(client, calls.beat(keys.all(), full))
    assert (reply.code, reply.cancel) == (calls.BeatCode.WRITTEN, True)
    assert await client.hget(keys.state, "cancel") == b"1"
    assert await client.get(keys.alive) == f"tok:{fence}:{seq + 1}:1".encode()


async def test_a_cancel_leaves_an_older_version_s_alive_value_alone(
    client: AnyRedis, ns: str
) -> None:
    """The upgrade note: before the fold ``alive`` held the fence alone; a new ``cancel.lua``
    marks the Hash (which that older worker reads) and leaves such a value and its TTL as
    they are."""
    keys = KeySchema(ns).job("older-alive")
    await client.hset(keys.state, mapping={"status": "RUNNING", "fence": "1796096775961107"})
    await client.set(keys.alive, "1796096775961107", px=60_000)
    assert await calls.run(client, calls.cancel(keys.all(), 100, "")) is calls.CancelCode.REQUESTED
    assert await client.hget(keys.state, "cancel") == b"1"
    assert await client.get(keys.alive) == b"1796096775961107"
    assert 0 < await client.pttl(keys.alive) <= 60_000
