"""StatusReader.watch() and wait() against a real Redis: history then live, exact resume, one
shared XREAD connection, the reader's own STALE verdict, overflow resync, and wait()."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from jobpulse import Event, JobState, ProtocolError, StatusReader, heartbeat
from jobpulse._protocol.codec import parse_stream_id
from jobpulse._protocol.keys import KeySchema
from jobpulse._protocol.scripts import SCRIPTS, evalsha
from jobpulse._provision import LocalCluster, RedisServer

from ..support import eventually, url_of
from .test_reader import worker_process

AnyRedis = aioredis.Redis | RedisCluster


async def stream_ids(redis: AnyRedis, ns: str, job: str) -> list[str]:
    return [e[0].decode() for e in await redis.xrange(KeySchema(ns).events(job))]


async def collect(reader: StatusReader, job: str, last: str | None = None) -> list[Event]:
    return [e async for e in reader.watch(job, last_event_id=last)]


async def run_job(redis: AnyRedis, ns: str, job: str, steps: int = 5) -> None:
    async with heartbeat(redis, job, namespace=ns, interval=0.05, stream_every=1) as hb:
        for i in range(steps):
            hb.progress.advance()
            await hb.checkpoint(step=i)


async def test_history_then_live_then_end(client: AnyRedis, ns: str) -> None:
    async with StatusReader(client, namespace=ns) as reader:
        started = asyncio.Event()

        async def job() -> None:
            async with heartbeat(client, "j", namespace=ns, interval=0.05, stream_every=1) as hb:
                hb.set_stage("one")
                await hb.checkpoint(n=1)
                started.set()
                await asyncio.sleep(0.2)
                hb.progress.set(7)
                await hb.checkpoint(n=2)

        task = asyncio.create_task(job())
        await started.wait()
        events = await collect(reader, "j")  # joins mid-job: history, then live
        await task
    assert [e.id for e in events] == await stream_ids(client, ns, "j")
    assert events[0].kind == "start"
    assert events[-1].kind == "end"
    assert events[-1].status == "COMPLETED"
    assert events[-1].terminal
    checkpoints = [e.details for e in events if e.kind == "checkpoint"]
    assert checkpoints == [{"n": 1}, {"n": 2}]
    assert any(e.done == 7 for e in events)
    assert all(e.ts and e.fence for e in events)


async def test_watch_of_an_ended_job_replays_and_ends(client: AnyRedis, ns: str) -> None:
    await run_job(client, ns, "done")
    async with StatusReader(client, namespace=ns) as reader:
        events = await collect(reader, "done")
        assert [e.id for e in events] == await stream_ids(client, ns, "done")
        assert reader.statistics().watch.xreads == 0  # never needed the live loop


async def test_resume_exactly_after_an_event_id(client: AnyRedis, ns: str) -> None:
    async with StatusReader(client, namespace=ns) as reader:
        proceed = asyncio.Event()

        async def job() -> None:
            async with heartbeat(client, "r", namespace=ns, interval=0.05, stream_every=1) as hb:
                for i in range(4):
                    await hb.checkpoint(i=i)
                await proceed.wait()
                for i in range(4, 8):
                    await hb.checkpoint(i=i)

        task = asyncio.create_task(job())
        first: list[Event] = []
        async with reader.watch("r") as events:
            async for event in events:
                first.append(event)
                if len(first) == 3:
                    break
        proceed.set()
        rest = await collect(reader, "r", last=first[-1].id)  # resumes while the job runs
        await task
        ids = await stream_ids(client, ns, "r")
        assert [e.id for e in first + rest] == ids  # no gap, no duplicate
        for k in (0, len(ids) // 2, len(ids) - 2):  # and from any id once it ended
            assert [e.id for e in await collect(reader, "r", last=ids[k])] == ids[k + 1 :]
        # Resuming after the terminal entry: nothing is left, the liveness check ends the watch.
        (after_end,) = await collect(reader, "r", last=ids[-1])
        assert (after_end.kind, after_end.status, after_end.synthetic) == ("end", "COMPLETED", True)
        assert parse_stream_id(after_end.id) > parse_stream_id(ids[-1])
        assert after_end.ts is not None


async def test_watchers_of_many_jobs_share_one_xread_connection(
    private_redis: RedisServer,
) -> None:
    workers = aioredis.Redis.from_url(private_redis.url)
    client = aioredis.Redis.from_url(private_redis.url)
    jobs = [f"job-{i}" for i in range(50)]
    gate = asyncio.Event()
    try:
        async with StatusReader(client) as reader:

            async def job(job_id: str) -> None:
                async with heartbeat(workers, job_id, interval=0.2, ttl=5, stream_every=1) as hb:
                    await gate.wait()
                    for i in range(3):
                        hb.progress.advance()
                        await hb.checkpoint(i=i)

            running = [asyncio.create_task(job(j)) for j in jobs]
            await eventually(lambda: _all_started(workers, jobs), within=30)
            watchers = [asyncio.create_task(collect(reader, j)) for j in jobs for _ in range(10)]
            await eventually(lambda: _attached(reader, 500), within=30)

            async def xread_connections() -> list[str]:
                clients = await client.client_list()
                return [c["id"] for c in clients if c["cmd"] == "xread"]

            readers = await xread_connections()
            info = await client.info("clients")
            assert len(readers) == 1, readers
            assert info["blocked_clients"] <= 1
            assert reader.statistics().watch.streams == 50
            gate.set()
            await asyncio.gather(*running)
            results = await asyncio.gather(*watchers)
            assert len(await xread_connections()) == 1
        for i, events in enumerate(results):
            ids = await stream_ids(workers, "jobpulse", jobs[i // 10])
            assert [e.id for e in events] == ids
            assert events[-1].kind == "end"
    finally:
        await workers.aclose()
        await client.aclose()


async def test_on_a_cluster_one_xread_connection_per_master_follows_jobs_of_many_slots(
    redis_cluster: LocalCluster, ns: str
) -> None:
    """12 jobs in 12 slots: each master's loop follows its jobs' slots (polling, since XREAD
    cannot cross slots) on one connection of its own, and every watcher gets every event."""
    client = await RedisCluster.from_url(redis_cluster.url).initialize()
    schema = KeySchema(ns)
    jobs = [f"m{i}" for i in range(12)]
    assert len({client.keyslot(schema.events(j)) for j in jobs}) == 12
    gate = asyncio.Event()
    try:
        async with StatusReader(client, namespace=ns, watch_poll=0.05) as reader:

            async def job(job_id: str) -> None:
                async with heartbeat(client, job_id, namespace=ns, interval=0.1, ttl=5) as hb:
                    await gate.wait()
                    for i in range(3):
                        await hb.checkpoint(i=i)

            running = [asyncio.create_task(job(j)) for j in jobs]
            await eventually(lambda: _all_started(client, jobs, ns), within=30)
            watchers = [asyncio.create_task(collect(reader, j)) for j in jobs for _ in range(2)]
            await eventually(lambda: _attached(reader, 24), within=30)
            masters = {client.get_node_from_key(schema.events(j)).name for j in jobs}
            assert reader.statistics().watch.loops == len(masters) > 1
            for master in client.get_primaries():
                conns = await client.client_list(target_nodes=master)
                assert len([c for c in conns if c["cmd"] == "xread"]) <= 1, conns
            gate.set()
            await asyncio.gather(*running)
            results = await asyncio.wait_for(asyncio.gather(*watchers), 60)
        for i, events in enumerate(results):
            assert [e.id for e in events] == await stream_ids(client, ns, jobs[i // 2])
            checkpoints = [e.details for e in events if e.kind == "checkpoint"]
            assert checkpoints == [{"i": 0}, {"i": 1}, {"i": 2}]
    finally:
        for j in jobs:
            await client.delete(*schema.job(j).all())
        await client.aclose()


async def _all_started(client: AnyRedis, jobs: list[str], ns: str = "jobpulse") -> bool:
    schema = KeySchema(ns)
    return all(await asyncio.gather(*(client.exists(schema.alive(j)) for j in jobs)))


async def _attached(reader: StatusReader, n: int) -> bool:
    return reader.statistics().watch.watchers == n


async def test_a_new_stream_joins_a_blocked_xread_promptly(redis: aioredis.Redis, ns: str) -> None:
    # A 60 s block: without CLIENT UNBLOCK the new job's events would wait a minute.
    async with StatusReader(redis, namespace=ns, watch_block=60, liveness_interval=60) as reader:
        parked = asyncio.create_task(collect(reader, "never"))  # a job that never starts
        await eventually(lambda: _xreads(reader))  # the hub is blocked on that stream alone

        async def job() -> None:
            async with heartbeat(redis, "b", namespace=ns, interval=30, ttl=60) as hb:
                await eventually(lambda: _attached(reader, 2))
                await hb.checkpoint(live=True)

        running = asyncio.create_task(job())
        events = await asyncio.wait_for(collect(reader, "b"), 20)
        await running
        assert [e.kind for e in events] == ["start", "checkpoint", "end"]
        assert reader.statistics().watch.unblocks >= 1
        parked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await parked


async def _xreads(reader: StatusReader) -> bool:
    return reader.statistics().watch.xreads > 0


async def test_dead_worker_ends_the_watch_with_a_synthetic_stale_event(
    client: AnyRedis, ns: str
) -> None:
    async with (
        StatusReader(client, namespace=ns, liveness_interval=0.2) as reader,
        worker_process(url_of(client), ns, "dies", ttl=1.0) as pid,
    ):
        watching = asyncio.create_task(collect(reader, "dies"))
        waiting = asyncio.create_task(reader.wait("dies", timeout=60))
        await eventually(lambda: _attached(reader, 2))
        os.kill(pid, signal.SIGKILL)
        events = await asyncio.wait_for(watching, 60)
        status = await waiting
        # Resuming from the verdict's own id: no entry again, the verdict again (the job is
        # still STALE), with an id not below the first one.
        (again,) = await asyncio.wait_for(collect(reader, "dies", last=events[-1].id), 60)
    real = await stream_ids(client, ns, "dies")
    assert [e.id for e in events[:-1]] == real
    last = events[-1]
    assert (last.kind, last.status, last.synthetic, last.terminal) == ("stale", "STALE", True, True)
    # An id of its own, after every entry of the stream; a time of its own: the verdict's,
    # at least one ttl (1 s) after the worker's last entry, read from the server's clock.
    assert parse_stream_id(last.id) > parse_stream_id(real[-1])
    assert last.ts is not None
    assert events[-2].ts is not None
    assert last.ts >= events[-2].ts + 1.0
    assert (again.kind, again.synthetic) == ("stale", True)
    assert parse_stream_id(again.id) >= parse_stream_id(last.id)
    assert status.state is JobState.STALE


async def test_sweeper_claim_ends_the_watch_with_its_stale_entry(client: AnyRedis, ns: str) -> None:
    keys = KeySchema(ns).job("claimed")
    async with StatusReader(client, namespace=ns, liveness_interval=30) as reader:
        await client.hset(keys.state, mapping={"status": "RUNNING", "seq": 3, "fence": 1})
        await client.xadd(keys.events, {"kind": "start", "status": "RUNNING", "seq": 1})
        watching = asyncio.create_task(collect(reader, "claimed"))
        await eventually(lambda: _attached(reader, 1))
        reply = await evalsha(client, SCRIPTS.claim, keys.all(), [1000, 60_000, "stale"])
        assert int(reply[0]) == 1
        events = await asyncio.wait_for(watching, 30)
    assert [e.kind for e in events] == ["start", "stale"]
    assert events[-1].status == "LOST"
    assert not events[-1].synthetic


async def test_a_slow_watcher_resyncs_by_id_and_never_stalls_others(
    redis: aioredis.Redis, ns: str
) -> None:
    async with StatusReader(redis, namespace=ns, watch_queue=2) as reader:
        go = asyncio.Event()

        async def job() -> None:
            async with heartbeat(redis, "flood", namespace=ns, interval=0.05) as hb:
                await go.wait()
                for i in range(40):
                    await hb.checkpoint(i=i)

        task = asyncio.create_task(job())
        await eventually(lambda: redis.exists(KeySchema(ns).alive("flood")))
        slow = reader.watch("flood")
        first = await anext(slow)  # attached; then it stops reading while the job floods
        fast = asyncio.create_task(collect(reader, "flood"))
        go.set()
        await task
        fast_events = await asyncio.wait_for(fast, 30)
        slow_events = [first] + [e async for e in slow]
        ids = await stream_ids(redis, ns, "flood")
        assert [e.id for e in fast_events] == ids
        assert [e.id for e in slow_events] == ids
        assert reader.statistics().watch.overflows >= 1


async def test_wait_returns_the_final_status(client: AnyRedis, ns: str) -> None:
    async with StatusReader(client, namespace=ns) as reader:
        gate = asyncio.Event()

        async def job() -> None:
            async with heartbeat(client, "w", namespace=ns, interval=0.05, total=3) as hb:
                await gate.wait()
                hb.progress.set(3)

        # Before the job exists (UNKNOWN): wait() polls, then follows the stream.
        waiting = asyncio.create_task(reader.wait("w", timeout=60))
        task = asyncio.create_task(job())
        await eventually(lambda: client.exists(KeySchema(ns).alive("w")))
        with pytest.raises(TimeoutError, match="'w'"):
            await reader.wait("w", timeout=0.2)
        gate.set()
        await task
        status = await waiting
        assert status.state is JobState.COMPLETED
        assert status.done == 3
        # an ended job returns at once
        assert (await reader.wait("w", timeout=5)).state is JobState.COMPLETED


async def test_closing_the_reader_ends_open_watches(client: AnyRedis, ns: str) -> None:
    async with heartbeat(client, "open", namespace=ns, interval=0.05):
        reader = StatusReader(client, namespace=ns)
        watching = asyncio.create_task(collect(reader, "open"))
        await eventually(lambda: _attached(reader, 1))
        await reader.aclose()
        with pytest.raises(RuntimeError, match="closed"):
            await asyncio.wait_for(watching, 10)
        with pytest.raises(RuntimeError, match="closed"):
            await collect(reader, "open")


@pytest.mark.parametrize("decode", [False, True])
async def test_watch_with_and_without_decode_responses(
    redis_url: str, ns: str, decode: bool
) -> None:
    client = aioredis.Redis.from_url(redis_url, decode_responses=decode)
    try:
        async with StatusReader(client, namespace=ns) as reader:
            watching = asyncio.create_task(collect(reader, "dec"))
            await run_job(client, ns, "dec", steps=3)
            events = await asyncio.wait_for(watching, 30)
        assert [e.kind for e in events][-1] == "end"
        assert [e.details for e in events if e.kind == "checkpoint"] == [
            {"step": 0},
            {"step": 1},
            {"step": 2},
        ]
    finally:
        await client.delete(*KeySchema(ns).job("dec").all())
        await client.aclose()


async def test_corrupt_stream_gives_protocol_error(redis: aioredis.Redis, ns: str) -> None:
    keys = KeySchema(ns).job("junk")
    async with StatusReader(redis, namespace=ns) as reader:
        await redis.xadd(keys.events, {"kind": "start", "seq": "1"})
        await redis.xadd(keys.events, {"kind": "beat", "done": "many"})
        watch = reader.watch("junk")
        assert (await anext(watch)).kind == "start"
        with pytest.raises(ProtocolError, match="done"):
            await anext(watch)
        await redis.delete(keys.events)
        await redis.set(keys.events, "not a stream")
        with pytest.raises(ProtocolError, match="not a stream"):
            await collect(reader, "junk")
    with pytest.raises(ValueError, match="last_event_id"):
        reader.watch("junk", last_event_id="yesterday")


async def test_many_watchers_of_one_job_share_one_decoded_event_per_entry(
    redis: aioredis.Redis, ns: str
) -> None:
    events_key = KeySchema(ns).events("fan")
    await redis.xadd(events_key, {"kind": "start", "status": "RUNNING", "fence": 1})
    async with StatusReader(redis, namespace=ns) as reader:
        tasks = [asyncio.create_task(collect(reader, "fan")) for _ in range(200)]
        await eventually(lambda: _watchers(reader, 200))
        for i in range(30):  # live entries, after every watcher attached
            await redis.xadd(events_key, {"kind": "beat", "seq": i, "fence": 1})
        await redis.xadd(events_key, {"kind": "end", "status": "COMPLETED", "fence": 1})
        seen = await asyncio.wait_for(asyncio.gather(*tasks), 30)
    ids = await stream_ids(redis, ns, "fan")
    for events in seen:
        assert [e.id for e in events] == ids  # every entry, once, in order
    for i in range(1, len(ids)):  # each live entry was decoded once for all 200 watchers
        assert len({id(events[i]) for events in seen}) == 1


async def _watchers(reader: StatusReader, n: int) -> bool:
    return reader.statistics().watch.watchers == n
