"""The lease folded into ``alive`` (issue 28, item 1): one key, ``<token>:<fence>`` of the owner,
``PX ttl``; its absence while RUNNING still means STALE; and what a regular beat costs in
``redis.call``s, counted by the server's own ``INFO commandstats``."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from jobpulse._protocol import calls
from jobpulse._protocol.keys import AliveValue, KeySchema, alive_value
from jobpulse._provision import RedisServer

AnyRedis = aioredis.Redis | RedisCluster


def test_alive_value_is_token_colon_fence_and_parses_back() -> None:
    assert alive_value("ab12", 1796096775961107) == "ab12:1796096775961107"
    assert AliveValue.parse(b"ab12:1796096775961107") == AliveValue("ab12", 1796096775961107)
    assert AliveValue.parse("ab12:7:later:fields") == AliveValue("ab12", 7)
    for bad in ("7", "ab12", ":7", "ab12:x"):
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
    assert await client.get(keys.alive) == f"tok:{started.fence}".encode()
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
    assert AliveValue.parse(await client.get(keys.alive)) == AliveValue("tok", started.fence)
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
    # TIME once per call, then per job: GET + PEXPIRE alive, HMGET, HSET
    assert counted == {"time": 1.0, "get": 1.0, "pexpire": 1.0, "hmget": 1.0, "hset": 1.0}
