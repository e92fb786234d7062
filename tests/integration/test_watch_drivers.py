"""Both readers' ``watch()`` follow one set of rules (``_reader/follow.py``): the asyncio
:class:`StatusReader` and ``jobpulse.sync.StatusReader`` yield the same events, ending the same
way, for the same stream and snapshot, on a single Redis and on a Redis Cluster.

Each case writes a job's snapshot and stream as the scripts leave them, then watches it with
both readers; a case where the drivers disagree fails."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from jobpulse import Event, StatusReader
from jobpulse._protocol.codec import parse_stream_id
from jobpulse._protocol.keys import KeySchema
from jobpulse._provision import RedisServer
from jobpulse.sync import StatusReader as SyncStatusReader

from ..support import eventually, url_of

AnyRedis = aioredis.Redis | RedisCluster
RESUME = "resume point"
Seen = tuple[str, str, str | None, bool]


@pytest.fixture
def sync_client(client: AnyRedis) -> Iterator[Any]:
    """A blocking client of the server (or cluster) ``client`` reaches."""
    url = url_of(client)
    if url.startswith("cluster:"):
        c: Any = redis.cluster.RedisCluster.from_url(url.removeprefix("cluster:"))
    else:
        c = redis.Redis.from_url(url)
    try:
        yield c
    finally:
        c.close()


def _entry(kind: str, status: str, fence: int, seq: int) -> dict[str, Any]:
    return {"kind": kind, "status": status, "seq": seq, "fence": fence, "ts_ms": 1_700_000_000_000}


async def _write(client: AnyRedis, ns: str, job: str, status: str, kinds: list[str]) -> list[str]:
    """The job's snapshot says ``status`` (no liveness key); its stream holds ``kinds``, a
    ``start`` opening each attempt (fence 1, 2, ...). Returns the entry ids."""
    keys = KeySchema(ns).job(job)
    await client.hset(keys.state, mapping={"status": status, "seq": 9, "fence": 1})
    fence, ids = 0, []
    for seq, kind in enumerate(kinds, 1):
        fence += kind == "start"
        entry_status = {"end": status, "stale": "LOST"}.get(kind, "RUNNING")
        raw = await client.xadd(keys.events, _entry(kind, entry_status, fence, seq))
        ids.append(raw.decode() if isinstance(raw, bytes) else raw)
    return ids


async def _both(
    client: AnyRedis, sync_client: Any, ns: str, job: str, last: str | None = None
) -> tuple[list[Seen], list[Seen]]:
    """What each reader's ``watch()`` yields, as (id, kind, status, synthetic)."""

    def seen(events: list[Event]) -> list[Seen]:
        """The events; a synthetic one's id (a resume point of its own, from the server's
        clock at the verdict: each driver reads it at another moment) is checked to be at
        least the id it follows (``last`` or the last real entry's), then shown as ``RESUME``."""
        out: list[Seen] = []
        before = last or "0-0"
        for e in events:
            if e.synthetic:
                assert parse_stream_id(e.id) >= parse_stream_id(before), (e.id, before)
                assert e.ts is not None
                out.append((RESUME, e.kind, e.status, True))
            else:
                out.append((e.id, e.kind, e.status, False))
                before = e.id
        return out

    async with StatusReader(client, namespace=ns, liveness_interval=0.1) as reader:
        from_async = [e async for e in reader.watch(job, last_event_id=last)]
    sync_reader = SyncStatusReader(sync_client, namespace=ns, watch_block=0.1)
    from_sync = await asyncio.to_thread(lambda: list(sync_reader.watch(job, last_event_id=last)))
    return seen(from_async), seen(from_sync)


async def test_an_ended_job_whose_end_entry_was_trimmed_ends_with_a_synthetic_end(
    client: AnyRedis, sync_client: Any, ns: str
) -> None:
    ids = await _write(client, ns, "trimmed", "COMPLETED", ["start", "checkpoint"])
    from_async, from_sync = await _both(client, sync_client, ns, "trimmed")
    expected = [
        (ids[0], "start", "RUNNING", False),
        (ids[1], "checkpoint", "RUNNING", False),
        (RESUME, "end", "COMPLETED", True),
    ]
    assert from_async == expected
    assert from_sync == expected


async def test_resuming_after_the_end_entry_ends_with_a_synthetic_end(
    client: AnyRedis, sync_client: Any, ns: str
) -> None:
    ids = await _write(client, ns, "over", "FAILED", ["start", "end"])
    from_async, from_sync = await _both(client, sync_client, ns, "over", last=ids[-1])
    assert from_async == from_sync == [(RESUME, "end", "FAILED", True)]


async def test_a_dead_worker_nobody_claimed_ends_with_a_synthetic_stale(
    client: AnyRedis, sync_client: Any, ns: str
) -> None:
    ids = await _write(client, ns, "dead", "RUNNING", ["start", "beat"])
    from_async, from_sync = await _both(client, sync_client, ns, "dead")
    expected = [
        (ids[0], "start", "RUNNING", False),
        (ids[1], "beat", "RUNNING", False),
        (RESUME, "stale", "STALE", True),
    ]
    assert from_async == expected
    assert from_sync == expected


async def test_an_earlier_attempts_end_does_not_end_the_watch(
    client: AnyRedis, sync_client: Any, ns: str
) -> None:
    kinds = ["start", "stale", "start", "checkpoint", "end"]
    ids = await _write(client, ns, "again", "COMPLETED", kinds)
    from_async, from_sync = await _both(client, sync_client, ns, "again")
    assert [(e[0], e[1], e[3]) for e in from_async] == [
        (i, k, False) for i, k in zip(ids, kinds, strict=True)
    ]
    assert from_sync == from_async


async def _pttls(client: aioredis.Redis) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_pttl", {}).get("calls", 0))


async def test_a_job_not_started_yet_is_waited_for(private_redis: RedisServer) -> None:
    """Both watches of a job with no snapshot and no stream go on past their first liveness
    check (the server counts its PTTL) until the job starts and ends."""
    client = aioredis.Redis.from_url(private_redis.url)
    sync_client = redis.Redis.from_url(private_redis.url)
    ns = "later"
    try:
        sync_reader = SyncStatusReader(sync_client, namespace=ns, watch_block=0.05)
        from_sync = asyncio.create_task(asyncio.to_thread(lambda: list(sync_reader.watch("j"))))
        await eventually(lambda: _pttls(client))  # the sync watch checked liveness: UNKNOWN
        async with StatusReader(client, namespace=ns, liveness_interval=0.05) as reader:
            from_async = asyncio.create_task(_collect(reader, "j"))

            async def checked() -> bool:
                return reader.statistics().watch.liveness_checks >= 2

            await eventually(checked)  # the asyncio one checked too, after its first
            ids = await _write(client, ns, "j", "COMPLETED", ["start", "end"])
            got = await asyncio.wait_for(from_async, 30)
        events = await asyncio.wait_for(from_sync, 30)
    finally:
        sync_client.close()
        await client.aclose()

    def seen(events: list[Event]) -> list[tuple[str, str, bool]]:
        return [(e.id, e.kind, e.synthetic) for e in events]

    assert seen(got) == [(ids[0], "start", False), (ids[1], "end", False)]
    assert seen(events) == seen(got)


async def _collect(reader: StatusReader, job: str) -> list[Event]:
    return [e async for e in reader.watch(job)]
