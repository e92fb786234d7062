"""The worker core against a real Redis: snapshot, beats, lease, cancel, executors."""

from __future__ import annotations

import asyncio
import multiprocessing
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from jobpulse import JobBusy, JobCancelled, LeaseLost, LeaseLostCause, heartbeat, request_cancel
from jobpulse._protocol.codec import SNAPSHOT_FIELDS
from jobpulse._protocol.keys import KeySchema

from . import work

AnyRedis = aioredis.Redis | RedisCluster


@pytest.mark.parametrize("method", ["spawn", "fork"])
async def test_process_pool_job_is_visible_to_a_plain_client(
    client: AnyRedis, ns: str, method: str
) -> None:
    keys = KeySchema(ns).job("job-1")
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context(method))
    seen: list[int] = []
    try:
        async with heartbeat(
            client, "job-1", namespace=ns, interval=0.05, ttl=1.0, total=300
        ) as hb:
            hb.set_stage("hashing")
            fut = asyncio.get_running_loop().run_in_executor(
                pool, work.hash_items, hb.progress, 300, 0.002
            )
            while not fut.done():
                done = await client.hget(keys.state, "done")
                seen.append(int(done))
                await asyncio.sleep(0.05)
            await fut
            running = await client.hgetall(keys.state)
    finally:
        pool.shutdown()
    assert {f.encode() for f in SNAPSHOT_FIELDS} <= set(running)
    assert running[b"status"] == b"RUNNING"
    assert running[b"stage"] == b"hashing"
    assert len(set(seen)) > 3, seen  # done grew while the job ran
    assert seen == sorted(seen)
    final = await client.hgetall(keys.state)
    assert final[b"status"] == b"COMPLETED"
    assert final[b"done"] == b"300"
    assert int(final[b"finished_ms"]) >= int(final[b"started_ms"])
    assert int(await client.ttl(keys.state)) > 0  # retention TTL set
    assert not await client.exists(keys.alive)


async def test_thread_pool_advances_are_counted_exactly(client: AnyRedis, ns: str) -> None:
    async with heartbeat(client, "threads", namespace=ns, interval=0.05, ttl=1.0) as hb:
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(4) as pool:
            await asyncio.gather(
                *(loop.run_in_executor(pool, work.hash_items, hb.progress, 5000) for _ in range(4))
            )
    assert await client.hget(KeySchema(ns).state("threads"), "done") == b"20000"


async def test_second_worker_gets_job_busy(client: AnyRedis, ns: str) -> None:
    async with heartbeat(client, "busy", namespace=ns) as hb:
        with pytest.raises(JobBusy):
            async with heartbeat(client, "busy", namespace=ns):
                pass
        fence = await client.get(KeySchema(ns).job("busy").fence)
        assert int(fence) == hb.fence  # the refused attempt did not bump the fence


async def test_stolen_lease_raises_lease_lost_and_later_writes_never_land(
    client: AnyRedis, ns: str
) -> None:
    keys = KeySchema(ns).job("stolen")
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(1) as pool:
        with pytest.raises(LeaseLost) as info:
            async with heartbeat(client, "stolen", namespace=ns, interval=0.05, ttl=0.5) as hb:
                fut = loop.run_in_executor(pool, work.until_cancelled, hb.progress, 10)
                await client.set(keys.alive, "someone-else:1", px=5000)
                await client.hset(keys.state, "stage", "theirs")
                seq_at_steal = int(await client.hget(keys.state, "seq"))
                await asyncio.sleep(5)  # cancelled by the heartbeat long before this ends
        assert info.value.cause is LeaseLostCause.TAKEN_OVER
        assert await fut == "cancelled"
    state = await client.hgetall(keys.state)
    assert state[b"status"] == b"RUNNING"  # the fenced-out worker wrote no final state
    assert state[b"stage"] == b"theirs"
    assert int(state[b"seq"]) == seq_at_steal
    assert await client.get(keys.alive) == b"someone-else:1"


async def test_remote_cancel_ends_cancelled_and_the_function_sees_it(
    client: AnyRedis, ns: str
) -> None:
    keys = KeySchema(ns).job("cancel-me")
    with ThreadPoolExecutor(1) as pool:
        with pytest.raises(JobCancelled):
            async with heartbeat(client, "cancel-me", namespace=ns, interval=0.05) as hb:
                fut = pool.submit(work.until_cancelled, hb.progress, 10)
                assert await request_cancel(client, "cancel-me", namespace=ns)
                await asyncio.wrap_future(fut)
                pytest.fail("the body should have been cancelled")
        assert await asyncio.to_thread(fut.result, 5) == "cancelled"
    assert await client.hget(keys.state, "status") == b"CANCELLED"
    kinds = [e[1][b"kind"] for e in await client.xrange(keys.events)]
    assert kinds[0] == b"start"
    assert b"cancel" in kinds
    assert kinds[-1] == b"end"
    assert not await request_cancel(client, "cancel-me", namespace=ns)  # ended: nothing to cancel


async def test_exception_writes_failed_with_type_and_message(client: AnyRedis, ns: str) -> None:
    with pytest.raises(ZeroDivisionError):
        async with heartbeat(client, "boom", namespace=ns):
            1 / 0  # noqa: B018
    state = await client.hgetall(KeySchema(ns).state("boom"))
    assert state[b"status"] == b"FAILED"
    assert state[b"error"] == b"ZeroDivisionError: division by zero"


async def test_outer_cancellation_writes_cancelled_and_propagates(
    client: AnyRedis, ns: str
) -> None:
    started = asyncio.Event()

    async def job() -> None:
        async with heartbeat(client, "outer", namespace=ns):
            started.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(job())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await client.hget(KeySchema(ns).state("outer"), "status") == b"CANCELLED"


async def test_checkpoint_is_recorded_and_beats_keep_seq_order(client: AnyRedis, ns: str) -> None:
    keys = KeySchema(ns).job("cp")
    async with heartbeat(client, "cp", namespace=ns, interval=0.05, stream_every=2) as hb:
        hb.set_stage("load")
        await hb.checkpoint(offset=10)
        await asyncio.sleep(0.3)
        hb.set_stage("save")
        await hb.checkpoint(offset=20)
    entries = await client.xrange(keys.events)
    kinds = [e[1][b"kind"] for e in entries]
    assert kinds[0] == b"start"
    assert kinds[-1] == b"end"
    assert kinds.count(b"checkpoint") == 2
    assert b"beat" in kinds
    cps = [e[1] for e in entries if e[1][b"kind"] == b"checkpoint"]
    assert cps[0][b"details"] == b'{"offset":10}'
    assert cps[1][b"stage"] == b"save"
    seqs = [int(e[1][b"seq"]) for e in entries]
    assert seqs == sorted(seqs)


async def test_a_thousand_jobs_entering_and_leaving_at_once_on_one_client(
    client: AnyRedis, ns: str
) -> None:
    """More concurrent jobs than redis-py's pool has connections (100 by default)."""
    release = asyncio.Event()

    async def job(i: int) -> int:
        async with heartbeat(client, f"many-{i}", namespace=ns, interval=0.2, ttl=30) as hb:
            hb.progress.advance(i)
            await release.wait()
        return i

    tasks = [asyncio.create_task(job(i)) for i in range(1000)]
    await asyncio.sleep(1.0)
    release.set()
    assert sorted(await asyncio.gather(*tasks)) == list(range(1000))
    done = await asyncio.gather(
        *(client.hget(KeySchema(ns).state(f"many-{i}"), "status") for i in range(0, 1000, 97))
    )
    assert set(done) == {b"COMPLETED"}
