"""StatusReader.get() against a real Redis: one round trip, small replies, the STALE verdict,
the single-flight cache, the (fence, seq) guard and corrupt snapshots."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from jobpulse import InvalidJobId, JobState, JobStatus, ProtocolError, StatusReader, heartbeat
from jobpulse._protocol.keys import KeySchema
from jobpulse._provision import RedisServer

from ..support import eventually, url_of

WORKER = Path(__file__).with_name("reader_worker.py")
AnyRedis = aioredis.Redis | RedisCluster


async def command_calls(client: aioredis.Redis) -> dict[str, int]:
    stats = await client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


async def output_bytes(client: aioredis.Redis) -> int:
    return int((await client.info("stats"))["total_net_output_bytes"])


@contextlib.asynccontextmanager
async def worker_process(url: str, ns: str, job: str, ttl: float) -> AsyncIterator[int]:
    """A real worker process holding ``job``'s heartbeat; yields its pid once it is visible."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), url, ns, job, str(ttl), str(ttl / 5),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line.strip() == b"ready", line
        yield proc.pid
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def test_get_reads_a_live_job(client: AnyRedis, ns: str) -> None:
    reader = StatusReader(client, namespace=ns)
    async with heartbeat(
        client, "live", namespace=ns, total=40, meta={"k": 1}, interval=0.05
    ) as hb:
        hb.set_stage("load")
        hb.progress.set(10)

        async def advanced() -> bool:
            s = await reader.get("live")
            return s.done == 10 and s.stage == "load"

        await eventually(advanced)
        s = await reader.get("live")
    assert s.state is JobState.RUNNING
    assert (s.total, s.percent, s.meta, s.attempt, s.fence) == (40, 25.0, {"k": 1}, 1, hb.fence)
    assert s.heartbeat_age is not None
    assert 0 <= s.heartbeat_age < 5
    assert s.worker
    assert s.started_ms
    assert s.cancel_requested is False
    final = await StatusReader(client, namespace=ns, cache_ttl=0).get("live")
    assert final.state is JobState.COMPLETED
    assert final.finished_ms is not None


@pytest.mark.parametrize("decode", [False, True])
async def test_get_works_with_and_without_decode_responses(
    redis_url: str, ns: str, decode: bool
) -> None:
    client = aioredis.Redis.from_url(redis_url, decode_responses=decode)
    try:
        async with heartbeat(client, "d", namespace=ns, total=5, meta=["ü"]):
            s = await StatusReader(client, namespace=ns).get("d")
        assert s.state is JobState.RUNNING
        assert s.meta == ["ü"]
        assert s.total == 5
        assert (await StatusReader(client, namespace=ns).get("nope")).state is JobState.UNKNOWN
    finally:
        await client.delete(*KeySchema(ns).job("d").all())
        await client.aclose()


async def test_alive_but_not_advancing_shows_a_growing_progress_age(
    client: AnyRedis, ns: str
) -> None:
    reader = StatusReader(client, namespace=ns, cache_ttl=0)
    async with heartbeat(client, "idle", namespace=ns, interval=0.05, ttl=1.0) as hb:
        hb.progress.set(3)
        first = await eventually(lambda: _when(reader, "idle", lambda s: s.done == 3))

        async def older() -> bool:
            s = await reader.get("idle")
            assert s.progress_age is not None
            assert s.heartbeat_age is not None
            assert first.progress_age is not None
            return s.progress_age > first.progress_age + 0.3 and s.heartbeat_age < 0.6

        await eventually(older)
        assert (await reader.get("idle")).state is JobState.RUNNING


async def test_both_readers_see_a_worker_process_alive_but_not_advancing(
    redis: aioredis.Redis, redis_url: str, ns: str
) -> None:
    """A real worker process that reached its total and holds: its beats go on (heartbeat_ms
    moves) while progress_ms stands, and the async and sync readers, from this other process,
    both say so with the same progress_ms and a progress_age measured on the server's clock."""
    import redis as sync_redis

    from jobpulse.sync import StatusReader as SyncStatusReader

    from ..cli.support import ROOT, env

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.cli.job_proc", redis_url, ns, "held", "2", "0", "hold",
        stdout=asyncio.subprocess.PIPE, cwd=ROOT, env=env(),
    )  # fmt: skip
    sync_client = sync_redis.Redis.from_url(redis_url)
    reader = StatusReader(redis, namespace=ns, cache_ttl=0)
    try:
        assert proc.stdout is not None
        assert (await asyncio.wait_for(proc.stdout.readline(), 30)).startswith(b"ready")
        first = await eventually(lambda: _when(reader, "held", lambda s: s.done == 2))
        assert isinstance(first, JobStatus)

        async def beat_again() -> bool:
            s = await reader.get("held")
            return s.heartbeat_ms is not None and s.heartbeat_ms > (first.heartbeat_ms or 0)

        await eventually(beat_again)
        now = await reader.get("held")
        then = SyncStatusReader(sync_client, namespace=ns, cache_ttl=0).get("held")
        for st in (now, then):
            assert st.state is JobState.RUNNING
            assert st.progress_ms == first.progress_ms  # done has not moved since
            assert st.progress_ms is not None
            assert st.server_ms is not None
            assert st.progress_age == (st.server_ms - st.progress_ms) / 1000
        assert now.heartbeat_ms is not None
        assert first.heartbeat_ms is not None
        assert now.heartbeat_ms > first.heartbeat_ms  # while the beats went on
    finally:
        sync_client.close()
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def _when(reader: StatusReader, job: str, pred: object) -> object:
    s = await reader.get(job)
    return s if pred(s) else None  # type: ignore[operator]


async def test_thousand_concurrent_gets_are_one_round_trip(private_redis: RedisServer) -> None:
    client = aioredis.Redis.from_url(private_redis.url)
    try:
        # A long interval: no beat (whose Lua also runs HMGET) lands while we count.
        async with heartbeat(client, "hot", interval=30, ttl=60, total=10):
            reader = StatusReader(client, cache_ttl=30)
            await client.config_resetstat()
            results = await asyncio.gather(*(reader.get("hot") for _ in range(1000)))
            calls = await command_calls(client)
        assert {r.state for r in results} == {JobState.RUNNING}
        assert (calls.get("hmget"), calls.get("pttl"), calls.get("time")) == (1, 1, 1)
        stats = reader.statistics().cache
        assert stats.fetches == 1
        assert stats.misses + stats.hits == 1000
    finally:
        await client.aclose()


async def test_a_fields_subset_does_not_transfer_a_large_meta(private_redis: RedisServer) -> None:
    client = aioredis.Redis.from_url(private_redis.url)
    try:
        async with heartbeat(client, "big", interval=30, ttl=60, meta={"blob": "x" * 20_000}):
            reader = StatusReader(client, cache_ttl=0)

            async def delta(get: object) -> int:
                before = await output_bytes(client)
                if get is not None:
                    await get  # type: ignore[misc]
                return await output_bytes(client) - before

            baseline = await delta(None)  # what INFO's own reply adds
            small = await delta(reader.get("big", fields=("done",)))
            full = await delta(reader.get("big"))
        assert small - baseline < 1000, (small, baseline)
        assert full - baseline > 20_000, (full, baseline)
        s = await reader.get("big", fields=("done", "status"))
        assert s.meta is None
        assert s.done == 0
    finally:
        await client.aclose()


async def test_sigkilled_worker_is_stale_within_ttl_plus_cache_ttl(
    client: AnyRedis, ns: str
) -> None:
    ttl, cache_ttl = 1.0, 0.5
    reader = StatusReader(client, namespace=ns, cache_ttl=cache_ttl)
    async with worker_process(url_of(client), ns, "victim", ttl) as pid:
        assert (await reader.get("victim")).state is JobState.RUNNING
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)

        async def stale() -> bool:
            return (await reader.get("victim")).state is JobState.STALE

        await eventually(stale, within=30)
        elapsed = time.monotonic() - killed
    # The bound is ttl + cache_ttl; the extra second absorbs a loaded machine's scheduling.
    assert elapsed < ttl + cache_ttl + 1.0, elapsed
    s = await reader.get("victim")
    assert s.heartbeat_age is not None
    assert s.heartbeat_age >= ttl * 0.8
    assert s.stage == "working"


@pytest.mark.parametrize("cache_ttl", [0.0, 0.002])
async def test_seq_never_goes_backwards_under_racing_writers(
    redis_url: str, redis: aioredis.Redis, ns: str, cache_ttl: float
) -> None:
    keys = KeySchema(ns).job("race")
    await redis.hset(keys.state, mapping={"status": "RUNNING", "seq": 0, "fence": 1})
    await redis.set(keys.alive, 1, px=60_000)
    writers = [aioredis.Redis.from_url(redis_url) for _ in range(4)]
    reader_client = aioredis.Redis.from_url(redis_url, max_connections=64)
    reader = StatusReader(reader_client, namespace=ns, cache_ttl=cache_ttl)
    returned: list[tuple[int, int]] = []
    stop = asyncio.Event()

    async def write(client: aioredis.Redis, n: int) -> None:
        for i in range(n):
            await client.hincrby(keys.state, "seq", 1)
            if i == n // 2:
                await client.hset(keys.state, mapping={"fence": 2, "seq": 0})  # a new attempt

    async def poll() -> None:
        while not stop.is_set():
            s = await reader.get("race", fields=("done",))
            returned.append((s.fence or 0, s.seq or 0))

    try:
        pollers = [asyncio.create_task(poll()) for _ in range(40)]
        await asyncio.gather(*(write(w, 300) for w in writers))
        stop.set()
        await asyncio.gather(*pollers)
    finally:
        for c in (*writers, reader_client):
            await c.aclose()
    assert len(returned) > 100
    assert all(a <= b for a, b in itertools.pairwise(returned)), "went backwards"
    assert returned[-1][0] == 2


async def test_an_older_snapshot_is_never_returned(client: AnyRedis, ns: str) -> None:
    keys = KeySchema(ns).job("lag")
    reader = StatusReader(client, namespace=ns, cache_ttl=0)
    await client.hset(keys.state, mapping={"status": "RUNNING", "seq": 10, "fence": 2, "done": 9})
    assert (await reader.get("lag")).seq == 10
    # What a lagging replica (or a late reply) would show: an older seq of the same fence.
    await client.hset(keys.state, mapping={"seq": 4, "done": 3})
    s = await reader.get("lag")
    assert (s.fence, s.seq, s.done) == (2, 10, 9)
    await client.hset(keys.state, mapping={"fence": 3, "seq": 1, "done": 0})  # a newer attempt
    assert (await reader.get("lag")).fence == 3
    await client.delete(keys.state)  # the snapshot is gone: the guard starts over
    assert (await reader.get("lag")).state is JobState.UNKNOWN
    await client.hset(keys.state, mapping={"status": "RUNNING", "seq": 1, "fence": 1})
    assert (await reader.get("lag")).seq == 1


@pytest.mark.parametrize(
    ("mapping", "expected"),
    [
        ({"status": "BOGUS", "seq": 1}, ProtocolError),
        ({"status": "RUNNING", "done": "lots"}, ProtocolError),
        ({"status": "RUNNING", "seq": "1.5"}, ProtocolError),
        ({"status": "COMPLETED", "rate": "fast"}, ProtocolError),
        ({"status": "RUNNING", "meta": "{oops"}, ProtocolError),
        ({"done": 5, "owner": "someone else"}, JobState.UNKNOWN),
        ({"status": "RUNNING"}, JobState.STALE),  # minimal, no liveness key
    ],
)
@pytest.mark.parametrize("decode", [False, True])
async def test_corrupt_or_foreign_hash_gives_unknown_or_protocol_error(
    redis_url: str,
    ns: str,
    mapping: dict[str, object],
    expected: object,
    decode: bool,
) -> None:
    client = aioredis.Redis.from_url(redis_url, decode_responses=decode)
    keys = KeySchema(ns).job("bad")
    try:
        await client.hset(keys.state, mapping=mapping)  # type: ignore[arg-type]
        reader = StatusReader(client, namespace=ns)
        if expected is ProtocolError:
            with pytest.raises(ProtocolError):
                await reader.get("bad")
        else:
            assert (await reader.get("bad")).state is expected
    finally:
        await client.delete(keys.state)
        await client.aclose()


@pytest.mark.parametrize("decode", [False, True])
async def test_wrong_type_and_non_utf8_give_protocol_error(
    redis_url: str, ns: str, decode: bool
) -> None:
    client = aioredis.Redis.from_url(redis_url, decode_responses=decode)
    raw = aioredis.Redis.from_url(redis_url)
    keys = KeySchema(ns).job("odd")
    reader = StatusReader(client, namespace=ns, cache_ttl=0)
    try:
        await raw.set(keys.state, "a string")
        with pytest.raises(ProtocolError, match="not a hash"):
            await reader.get("odd")
        await raw.delete(keys.state)
        await raw.hset(keys.state, mapping={"status": "RUNNING", "stage": b"\xff\xfe"})
        with pytest.raises(ProtocolError, match="UTF-8"):
            await reader.get("odd")
        assert (await reader.get("odd", fields=("done",))).state is JobState.STALE
    finally:
        await raw.delete(keys.state)
        await client.aclose()
        await raw.aclose()


async def test_invalid_arguments_fail_before_redis(redis: aioredis.Redis, ns: str) -> None:
    reader = StatusReader(redis, namespace=ns)
    with pytest.raises(InvalidJobId):
        await reader.get("has space")
    with pytest.raises(ValueError, match="fields"):
        await reader.get("ok", fields=("done", "nope"))
    with pytest.raises(ValueError, match="cache_ttl"):
        StatusReader(redis, cache_ttl=-1)
    with pytest.raises(ValueError, match="max_entries"):
        StatusReader(redis, max_entries=0)
    with pytest.raises(InvalidJobId):
        StatusReader(redis, namespace="bad ns")


async def test_running_lists_running_and_stale_jobs_from_the_index(
    redis: aioredis.Redis, ns: str
) -> None:
    reader = StatusReader(redis, namespace=ns, cache_ttl=0)
    try:
        async with heartbeat(redis, "run-a", namespace=ns, interval=0.05):
            async with heartbeat(redis, "run-b", namespace=ns, interval=0.05):
                pass  # ended: its index entry is dropped
            await redis.zadd(KeySchema(ns).index(0), {"not a job id": 1, "ghost": 1})
            ids, truncated = await reader.running_ids()
            assert ids == ["ghost", "run-a"]
            assert not truncated
            assert [s.job_id for s in await reader.running()] == ["run-a"]
            assert (await reader.running_ids(limit=1)) == (["ghost"], True)
            with pytest.raises(ValueError, match="limit"):
                await reader.running_ids(limit=0)
    finally:
        await reader.aclose()
