"""The sweeper against a real Redis and real worker processes (SIGKILL, SIGSTOP/SIGCONT)."""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import os
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from jobpulse import InvalidJobId, StaleJob, Sweeper, heartbeat
from jobpulse._protocol.keys import KeySchema
from jobpulse._provision import RedisServer

from ..support import eventually, url_of
from . import sweep_worker

ROOT = Path(__file__).resolve().parents[2]
Proc = asyncio.subprocess.Process
AnyRedis = aioredis.Redis | RedisCluster


@pytest.fixture
async def spawn() -> AsyncIterator[Any]:
    """Start ``sweep_worker`` processes; every one still alive at the end is killed."""
    procs: list[Proc] = []

    async def start(mode: str, **args: Any) -> tuple[Proc, dict[str, Any]]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.integration.sweep_worker",
            mode,
            json.dumps(args),
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
        )
        procs.append(proc)
        return proc, await read_line(proc)

    yield start
    for proc in procs:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
            proc.send_signal(signal.SIGCONT)
            await proc.wait()


async def read_line(proc: Proc, within: float = 60.0) -> dict[str, Any]:
    assert proc.stdout is not None
    async with asyncio.timeout(within):
        line = await proc.stdout.readline()
    assert line, f"worker {proc.pid} exited without answering"
    result: dict[str, Any] = json.loads(line)
    return result


async def kill(*procs: Proc) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGKILL)
    for proc in procs:
        await proc.wait()


async def seed_stale(
    client: AnyRedis, ns: str, job_id: str, fence: int = 1, shards: int = 1
) -> None:
    """A RUNNING job with no liveness and an index deadline in the past, as a dead worker
    leaves it (written directly: these tests are about the sweeper's loop, not the worker)."""
    schema = KeySchema(ns, shards)
    keys = schema.job(job_id)
    seconds, _ = await client.time()
    await client.hset(
        keys.state,
        mapping={"status": "RUNNING", "seq": 3, "fence": fence, "attempt": 1},
    )
    await client.set(keys.fence, fence)
    await client.zadd(schema.index_for(job_id), {job_id: (seconds - 10) * 1000})


# -- exactly once ----------------------------------------------------------------------------------


async def test_20_sweepers_in_4_processes_claim_each_of_200_killed_jobs_exactly_once(
    redis_url: str, redis: aioredis.Redis, ns: str, spawn: Any
) -> None:
    ids = [f"job-{i}" for i in range(200)]
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(4, mp_context=ctx) as pool:
        # Sweepers first: they wait for the go signal, so all 20 hit the jobs as they go stale.
        futures = [
            asyncio.wrap_future(pool.submit(sweep_worker.sweep_process, redis_url, ns, 5, 80.0))
            for _ in range(4)
        ]
        try:
            workers = []
            for part in range(4):
                args = {"url": redis_url, "ns": ns, "interval": 0.25, "ttl": 1.5}
                proc, ready = await spawn("hold", ids=ids[part::4], **args)
                assert ready["ready"]
                workers.append(proc)
            assert await redis.zcard(KeySchema(ns).index(0)) == 200
            await kill(*workers)
            await eventually(lambda: _equals(redis.get(f"{ns}:test:ready"), b"4"), within=60)
            await redis.set(f"{ns}:test:go", 1)
            results = await asyncio.gather(*futures)
        finally:
            await redis.set(f"{ns}:test:abort", 1)  # after a failure, no sweeper waits on
            await asyncio.gather(*futures, return_exceptions=True)

    assert len({pid for pid, _ in results}) == 4  # four distinct sweeper processes
    claims = Counter(job_id for _, claimed in results for job_id in claimed)
    assert claims == Counter(ids)  # every job once, none twice, nothing else
    schema = KeySchema(ns)
    pipe = redis.pipeline()
    for job_id in ids:
        pipe.hmget(schema.state(job_id), "status", "fence")
        pipe.xrange(schema.events(job_id))
    replies = await pipe.execute()
    for status_fence, events in zip(replies[::2], replies[1::2], strict=True):
        started = int(events[0][1][b"fence"])  # the dead attempt's fence, bumped once:
        assert status_fence == [b"LOST", str(started + 1).encode()]
        assert [e[1][b"kind"] for e in events].count(b"stale") == 1
    assert await redis.zcard(schema.index(0)) == 0


async def test_concurrent_sweepers_claim_each_of_20_killed_jobs_exactly_once_on_3_shards(
    client: AnyRedis, ns: str, spawn: Any
) -> None:
    """The same guarantee on a single Redis and on a cluster, where the 3 index shards and the
    jobs' slots spread over the masters: a real worker process is SIGKILLed (no final write),
    then 5 sweepers race for its 20 stale jobs."""
    ids = [f"k{i}" for i in range(20)]
    schema = KeySchema(ns, 3)
    args = {"url": url_of(client), "ns": ns, "interval": 0.2, "ttl": 1.0, "index_shards": 3}
    proc, ready = await spawn("hold", ids=ids, **args)
    assert ready["ready"]
    counts = [await client.zcard(shard) for shard in schema.indexes()]
    assert sum(counts) == 20
    assert sum(1 for n in counts if n) >= 2  # the jobs spread over the shards
    await kill(proc)
    sweepers = [
        Sweeper(client, namespace=ns, index_shards=3, batch=4, redeliver_after=3.0)
        for _ in range(5)
    ]
    claimed: list[str] = []

    async def sweep_until_empty(sweeper: Sweeper) -> None:
        while True:
            for job in await sweeper.sweep():
                claimed.append(job.job_id)
                await sweeper.ack(job)  # handled: a later sweep drops its index entry
            if not any([await client.zcard(shard) for shard in schema.indexes()]):
                return
            await asyncio.sleep(0.01)

    async with asyncio.timeout(60):
        await asyncio.gather(*(sweep_until_empty(s) for s in sweepers))
    assert Counter(claimed) == Counter(ids)  # every job once, none twice
    for job_id in ids:
        keys = schema.job(job_id)
        events = await client.xrange(keys.events)
        started = int(events[0][1][b"fence"])  # the dead attempt's fence, bumped once:
        assert await client.hmget(keys.state, "status", "fence") == [
            b"LOST",
            str(started + 1).encode(),
        ]
        kinds = [e[1][b"kind"] for e in events]
        assert kinds.count(b"stale") == 1


async def _equals(value: Any, expected: object) -> bool:
    return bool(await value == expected)


async def test_one_sweep_drains_more_stale_jobs_than_a_batch(client: AnyRedis, ns: str) -> None:
    for i in range(70):
        await seed_stale(client, ns, f"s{i}", shards=3)
    sweeper = Sweeper(client, namespace=ns, batch=16, index_shards=3)
    claimed = await sweeper.sweep()
    assert sorted(job.job_id for job in claimed) == sorted(f"s{i}" for i in range(70))
    assert await sweeper.sweep() == []
    stats = sweeper.statistics()
    assert stats.claimed == 70
    assert stats.sweeps == 2


# -- a frozen worker comes back --------------------------------------------------------------------


async def test_frozen_worker_is_claimed_restarted_elsewhere_and_fenced_out_when_thawed(
    client: AnyRedis, ns: str, spawn: Any
) -> None:
    keys = KeySchema(ns).job("frozen")
    args = {"url": url_of(client), "ns": ns, "job_id": "frozen", "interval": 0.2, "ttl": 1.0}
    old, ready = await spawn("frozen", **args)
    old.send_signal(signal.SIGSTOP)
    sweeper = Sweeper(client, namespace=ns)
    found: list[StaleJob] = []

    async def claimed() -> bool:
        found.extend(await sweeper.sweep())
        return bool(found)

    await eventually(claimed, within=30)
    [stale] = found
    assert stale.job_id == "frozen"
    assert stale.attempt == 1
    assert stale.fence == ready["fence"] + 1
    assert stale.worker == "old"
    assert stale.stale_for >= 1.0 * 0.9  # no heartbeat for about a ttl (server clock)
    assert isinstance(stale.checkpoint, dict)
    assert await client.hget(keys.state, "status") == b"LOST"

    async with heartbeat(client, "frozen", namespace=ns, interval=0.2, ttl=1.0, worker="new") as hb:
        assert hb.attempt == 2
        assert hb.fence == stale.fence + 1
        assert hb.resume_from == stale.checkpoint
        old.send_signal(signal.SIGCONT)
        outcome = await read_line(old)
        assert outcome["outcome"] == "LeaseLost"
        assert await asyncio.wait_for(old.wait(), 30) == 0
        state = await client.hgetall(keys.state)
        assert state[b"status"] == b"RUNNING"
        assert state[b"worker"] == b"new"
        assert int(state[b"fence"]) == hb.fence
        assert int(state[b"attempt"]) == 2
        assert int(state[b"seq"]) <= hb.statistics().seq  # no seq from the old worker
        await hb.checkpoint(step="new")

    state = await client.hgetall(keys.state)
    assert state[b"status"] == b"COMPLETED"
    assert state[b"worker"] == b"new"
    assert int(state[b"fence"]) == hb.fence
    events = [e[1] for e in await client.xrange(keys.events)]
    kinds = [e[b"kind"] for e in events]
    assert kinds.count(b"stale") == 1
    after = events[kinds.index(b"stale") + 1 :]
    assert after[0][b"kind"] == b"start"
    assert {int(e[b"fence"]) for e in after} == {hb.fence}  # no write of the old worker landed
    assert await sweeper.sweep() == []


# -- live jobs are never claimed -------------------------------------------------------------------


@pytest.mark.xdist_group("cpu")  # burners never overlap on parallel workers (README)
async def test_live_jobs_on_cpu_saturated_workers_are_never_claimed(
    redis_url: str, redis: aioredis.Redis, ns: str, spawn: Any
) -> None:
    burners = [
        await asyncio.create_subprocess_exec(sys.executable, "-c", "while True: pass")
        for _ in range(os.cpu_count() or 2)
    ]
    claims: list[StaleJob] = []
    sweepers = [Sweeper(redis, namespace=ns, batch=8) for _ in range(3)]
    try:
        async with (
            sweepers[0].run(period=0.05, on_stale=claims.append),
            sweepers[1].run(period=0.05, on_stale=claims.append),
            sweepers[2].run(period=0.05, on_stale=claims.append),
        ):
            ids = [f"live-{i}" for i in range(50)]
            opts = {"url": redis_url, "ns": ns, "interval": 0.2, "ttl": 2.0, "run": 8.0}
            workers = [(await spawn("live", ids=ids[p::2], **opts))[0] for p in range(2)]
            outcomes: dict[str, str] = {}
            for proc in workers:
                outcomes.update((await read_line(proc, within=90))["outcomes"])
    finally:
        await kill(*burners)
    assert claims == []
    assert outcomes == dict.fromkeys(ids, "COMPLETED")
    schema = KeySchema(ns)
    for job_id in ids:
        state = await redis.hmget(schema.state(job_id), "status", "attempt", "fence")
        (_, start), *_ = await redis.xrange(schema.events(job_id), count=1)
        assert state == [b"COMPLETED", b"1", start[b"fence"]]  # never claimed: fence unmoved
    assert all(s.statistics().sweeps >= 10 for s in sweepers)
    assert await redis.zcard(schema.index(0)) == 0  # ended jobs left the index


# -- restart resumes from the last checkpoint ------------------------------------------------------


async def test_restarted_job_reads_the_details_of_its_last_checkpoint(
    client: AnyRedis, ns: str, spawn: Any
) -> None:
    args = {"url": url_of(client), "ns": ns, "interval": 0.2, "ttl": 1.0}
    proc, _ = await spawn("hold", ids=["report"], **args)
    await kill(proc)
    sweeper = Sweeper(client, namespace=ns)
    [stale] = await eventually(sweeper.sweep, within=30)
    assert stale.checkpoint == {"job": "report", "phase": "b"}
    assert stale.stage == "work"
    assert stale.snapshot["done"] == "3"

    async with heartbeat(client, "report", namespace=ns, interval=0.2, ttl=1.0) as hb:
        assert hb.attempt == 2
        assert hb.resume_from == {"job": "report", "phase": "b"}
        assert hb.fence == stale.fence + 1
    keys = KeySchema(ns).job("report")
    kinds = [e[1][b"kind"] for e in await client.xrange(keys.events)]
    assert kinds[0] == b"start"
    assert kinds[kinds.index(b"stale") + 1] == b"start"  # the history of attempt 1 is kept
    assert kinds[-1] == b"end"
    assert await client.hget(keys.state, "status") == b"COMPLETED"


# -- index hygiene ---------------------------------------------------------------------------------


async def test_ended_expired_and_foreign_entries_leave_the_index_alive_ones_move_on(
    redis: aioredis.Redis, ns: str
) -> None:
    schema = KeySchema(ns)
    index = schema.index(0)
    seconds, _ = await redis.time()
    past = (seconds - 10) * 1000
    await seed_stale(redis, ns, "ended")
    await redis.hset(schema.state("ended"), "status", "COMPLETED")
    await seed_stale(redis, ns, "alive")
    await redis.set(schema.alive("alive"), 1, px=5000)
    await redis.zadd(index, {"expired": past, "not a job id": past})
    sweeper = Sweeper(redis, namespace=ns)
    assert await sweeper.sweep() == []
    entries = dict(await redis.zrange(index, 0, -1, withscores=True))
    assert list(entries) == [b"alive"]
    assert entries[b"alive"] > (seconds + 3) * 1000  # re-scored to when it could go stale
    stats = sweeper.statistics()
    assert (stats.alive, stats.dropped, stats.claimed) == (1, 2, 0)


async def test_a_finished_worker_removes_its_index_entry(client: AnyRedis, ns: str) -> None:
    index = KeySchema(ns).index(0)
    async with heartbeat(client, "short", namespace=ns, interval=0.05, ttl=0.5):
        assert await client.zscore(index, "short") is not None
    assert await client.zscore(index, "short") is None


# -- the loop --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_run_delivers_jobs_and_survives_a_failing_callback(
    redis: aioredis.Redis, ns: str, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    delivered: list[str] = []

    def record(job: StaleJob) -> None:
        delivered.append(job.job_id)
        if job.job_id == "bad":
            raise RuntimeError("callback bug")

    async def record_async(job: StaleJob) -> None:
        await asyncio.sleep(0)
        record(job)

    callback = record if kind == "sync" else record_async
    await seed_stale(redis, ns, "bad")
    sweeper = Sweeper(redis, namespace=ns)
    with caplog.at_level(logging.ERROR, logger="jobpulse"):
        async with sweeper.run(period=0.05, on_stale=callback) as running:
            assert running is sweeper
            await eventually(lambda: _truthy("bad" in delivered))
            await seed_stale(redis, ns, "good")  # the loop goes on after the exception
            await eventually(lambda: _truthy("good" in delivered))
    assert sorted(delivered) == ["bad", "good"]
    assert any("on_stale failed for job bad" in r.getMessage() for r in caplog.records)


async def _truthy(value: bool) -> bool:
    return value


async def test_run_logs_redis_faults_and_goes_on(
    private_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = aioredis.Redis.from_url(private_redis.url, socket_timeout=1.0)
    delivered: list[str] = []
    try:
        sweeper = Sweeper(client, namespace="t")
        with caplog.at_level(logging.WARNING, logger="jobpulse"):
            async with sweeper.run(period=0.05, on_stale=lambda j: delivered.append(j.job_id)):
                private_redis.stop()
                await eventually(lambda: _truthy(sweeper.statistics().errors >= 3))
                private_redis.start()
                await seed_stale(client, "t", "after-restart")
                await eventually(lambda: _truthy(delivered == ["after-restart"]))
        assert any("sweep failed, retrying" in r.getMessage() for r in caplog.records)
    finally:
        await client.aclose()


async def test_leaving_run_stops_the_loop(redis: aioredis.Redis, ns: str) -> None:
    sweeper = Sweeper(redis, namespace=ns)
    async with sweeper.run(period=0.01):
        await eventually(lambda: _truthy(sweeper.statistics().sweeps >= 3))
    sweeps = sweeper.statistics().sweeps
    await asyncio.sleep(0.1)
    assert sweeper.statistics().sweeps == sweeps
    with pytest.raises(ZeroDivisionError):  # the block's own exception keeps its type
        async with sweeper.run(period=0.01):
            1 / 0  # noqa: B018


async def test_arguments_are_checked_and_named(redis: aioredis.Redis) -> None:
    with pytest.raises(ValueError, match="batch"):
        Sweeper(redis, batch=0)
    with pytest.raises(ValueError, match="retention"):
        Sweeper(redis, retention=-1)
    with pytest.raises(TypeError, match="maxlen"):
        Sweeper(redis, maxlen=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="index_shards"):
        Sweeper(redis, index_shards=0)
    with pytest.raises(InvalidJobId):
        Sweeper(redis, namespace="bad namespace")
    sweeper = Sweeper(redis)
    with pytest.raises(ValueError, match="period"):
        sweeper.run(period=0)
    with pytest.raises(ValueError, match="jitter"):
        sweeper.run(jitter=1.0)
    with pytest.raises(ValueError, match="timeout"):
        sweeper.run(timeout=float("nan"))
    with pytest.raises(TypeError, match="on_stale"):
        sweeper.run(on_stale=3)  # type: ignore[arg-type]
