"""The worker under network and server faults: slow is never dead, and nothing is lost."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis.asyncio as aioredis
from redis.exceptions import OutOfMemoryError, ReadOnlyError

from jobpulse import (
    JobBusy,
    LeaseLost,
    LeaseLostCause,
    ProgressCell,
    StaleJob,
    StateNotWritten,
    heartbeat,
)
from jobpulse._protocol.keys import KeySchema
from jobpulse._provision import RedisServer, free_port
from jobpulse._recovery.sweeper import Sweeper

from ..support import eventually
from .conftest import Proxied

KEYS = KeySchema("jobpulse")


async def _verdict(direct: aioredis.Redis, job: str) -> tuple[bytes | None, int, int]:
    """(status, alive PTTL, seq) as a reader computes them, read around the proxy."""
    keys = KEYS.job(job)
    async with direct.pipeline(transaction=False) as p:
        p.hmget(keys.state, "status", "seq")
        p.pttl(keys.alive)
        (status, seq), pttl = await p.execute()
    return status, pttl, int(seq or 0)


async def test_200ms_latency_on_every_reply_no_lease_loss_no_stale(proxied: Proxied) -> None:
    proxied.proxy.latency = 0.2
    proxied.proxy.jitter = 0.05
    seqs: list[int] = []
    async with heartbeat(proxied.via_proxy, "laggy", interval=1.0, ttl=6.0) as hb:
        end = time.monotonic() + 4.5
        while time.monotonic() < end:
            hb.progress.advance()
            status, pttl, seq = await _verdict(proxied.direct, "laggy")
            assert status == b"RUNNING"
            assert pttl > 0, "STALE verdict while the worker was only slow"
            seqs.append(seq)
            await asyncio.sleep(0.1)
        assert not hb.progress.cancelled
    assert seqs == sorted(seqs)  # telemetry lags but arrives in order
    assert len(set(seqs)) >= 3
    status, _, _ = await _verdict(proxied.direct, "laggy")
    assert status == b"COMPLETED"


async def test_blackhole_shorter_than_ttl_the_job_goes_on(proxied: Proxied) -> None:
    keys = KEYS.job("hole")
    async with heartbeat(proxied.via_proxy, "hole", interval=0.2, ttl=3.0) as hb:
        before = int(await proxied.direct.hget(keys.state, "heartbeat_ms"))
        proxied.proxy.blackhole = True
        await asyncio.sleep(1.5)
        assert int(await proxied.direct.hget(keys.state, "heartbeat_ms")) - before < 500
        proxied.proxy.blackhole = False
        hb.progress.advance(3)
        await eventually(lambda: _done_is(proxied.direct, keys.state, 3), within=5)
        assert not hb.progress.cancelled
    assert await proxied.direct.hget(keys.state, "status") == b"COMPLETED"


async def test_connection_reset_mid_job_is_survived(proxied: Proxied) -> None:
    keys = KEYS.job("reset")
    async with heartbeat(proxied.via_proxy, "reset", interval=0.1, ttl=2.0) as hb:
        for n in range(1, 4):
            proxied.proxy.reset()
            hb.progress.advance()
            await eventually(lambda n=n: _done_is(proxied.direct, keys.state, n), within=5)  # type: ignore[misc]
    assert await proxied.direct.hget(keys.state, "status") == b"COMPLETED"


async def _done_is(client: aioredis.Redis, key: str, n: int) -> bool:
    return await client.hget(key, "done") == str(n).encode()


@pytest.fixture
def small_redis() -> RedisServer:
    with RedisServer(args=["--maxmemory", "4mb", "--maxmemory-policy", "noeviction"]) as server:
        yield server  # type: ignore[misc]


async def _fill(client: aioredis.Redis) -> None:
    """Write filler until Redis answers OOM, then keep it full.

    Right at the limit, ``used_memory`` moves by more than the margin between "full" and "not
    full" (client buffers, a pipeline's reply), so a later plain write could slip through and
    the refusals this test counts might never come. Halving ``maxmemory`` below what is used
    keeps every plain write refused until :func:`_free`.
    """
    blob = b"x" * 64 * 1024
    for i in range(10_000):
        try:
            await client.set(f"filler:{i}", blob)
        except OutOfMemoryError:
            used = int((await client.info("memory"))["used_memory"])
            await client.config_set("maxmemory", used // 2)
            return
    raise AssertionError("maxmemory was never reached")


async def _free(client: aioredis.Redis) -> None:
    keys = [k async for k in client.scan_iter(match="filler:*", count=1000)]
    await client.delete(*keys)
    await client.config_set("maxmemory", "4mb")


async def test_maxmemory_noeviction_the_work_goes_on_and_the_final_state_lands_once(
    small_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis full with ``noeviction``: plain writes answer OOM.

    Documented behaviour: Redis 7.0 lets flag-less scripts (every jobpulse script) write past
    ``maxmemory``, so beats and the final write go on; the running-index refresh (a plain ZADD)
    is refused and logged, rate-limited. Where a Redis refuses the beats too, they are retried
    like any Redis fault. Either way the computation goes on and its final state lands once.
    """
    client = aioredis.Redis.from_url(small_redis.url)
    keys = KEYS.job("oom")
    try:
        with caplog.at_level(logging.WARNING, logger="jobpulse"):
            async with heartbeat(
                client, "oom", interval=0.05, ttl=4.0, index_every=1, final_timeout=20
            ) as hb:
                await _fill(client)
                for _ in range(40):  # 2 s of work while Redis is full
                    hb.progress.advance()
                    await asyncio.sleep(0.05)
                assert not hb.progress.cancelled
            await _free(client)
        refused = [r for r in caplog.records if "OutOfMemoryError" in r.getMessage()]
        assert refused, "the refused writes were not reported"
        assert len(refused) <= 4  # rate-limited, not one line per beat
        state = await client.hgetall(keys.state)
        assert state[b"status"] == b"COMPLETED"
        assert state[b"done"] == b"40"
        ends = [e for _, e in await client.xrange(keys.events) if e[b"kind"] == b"end"]
        assert len(ends) == 1
    finally:
        await client.aclose()


async def test_final_state_that_cannot_be_written_is_reported_never_dropped(
    proxied: Proxied,
) -> None:
    with pytest.raises(StateNotWritten, match="COMPLETED"):
        async with heartbeat(proxied.via_proxy, "unwritten", ttl=30, final_timeout=1.0):
            proxied.proxy.blackhole = True
    proxied.proxy.blackhole = False
    with pytest.raises(ValueError, match="boom") as info:
        async with heartbeat(proxied.via_proxy, "unwritten-2", ttl=30, final_timeout=1.0):
            proxied.proxy.blackhole = True
            raise ValueError("boom")
    assert any("not written" in note for note in info.value.__notes__)
    proxied.proxy.blackhole = False
    assert await proxied.direct.hget(KEYS.state("unwritten"), "status") == b"RUNNING"


async def test_readonly_after_a_failover_is_a_redis_fault_the_job_goes_on(
    private_redis: RedisServer,
) -> None:
    """A failover that demotes our master to a replica: every write answers READONLY.

    Documented behaviour: READONLY is handled like Redis being unreachable — beats retry, the job
    goes on while it lasts less than ttl, and once the server is a master again the next beat
    renews the lease and the job ends COMPLETED. (Here the server replicates a master that does
    not exist, so its data is left as it was.)
    """
    client = aioredis.Redis.from_url(private_redis.url)
    keys = KEYS.job("ro")
    try:
        async with heartbeat(client, "ro", interval=0.1, ttl=4.0) as hb:
            await client.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
            await eventually(lambda: _readonly(client), within=10)
            await asyncio.sleep(0.5)
            assert hb.statistics().beats_failed >= 1
            await client.execute_command("REPLICAOF", "NO", "ONE")
            hb.progress.advance(2)
            await eventually(lambda: _done_is(client, keys.state, 2), within=5)
            assert not hb.progress.cancelled
        assert await client.hget(keys.state, "status") == b"COMPLETED"
    finally:
        await client.aclose()


async def _readonly(client: aioredis.Redis) -> bool:
    try:
        await client.set("probe", "1")
    except ReadOnlyError:
        return True
    return False


async def test_two_workers_racing_for_one_job_never_both_hold_it(
    redis: aioredis.Redis, redis_url: str, ns: str
) -> None:
    other = aioredis.Redis.from_url(redis_url)
    holders = 0
    max_holders = 0

    async def attempt(client: aioredis.Redis, job: str) -> bool:
        nonlocal holders, max_holders
        try:
            async with heartbeat(client, job, namespace=ns, interval=5, ttl=10):
                holders += 1
                max_holders = max(max_holders, holders)
                await asyncio.sleep(0)
                holders -= 1
                return True
        except JobBusy:
            return False

    try:
        for i in range(1000):
            job = f"race-{i % 10}"
            won = await asyncio.gather(attempt(redis, job), attempt(other, job))
            assert sum(won) >= 1, f"round {i}: nobody got the job"
            assert max_holders == 1
    finally:
        await other.aclose()


async def test_an_unexpected_error_in_the_heartbeat_surfaces_at_exit(
    redis: aioredis.Redis, ns: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A broken clock (an injected seam) crashes the ticker: logged, the job stopped, raised."""
    calls = 0

    def clock() -> float:
        nonlocal calls
        calls += 1
        if calls > 30:
            raise RuntimeError("clock broke")
        return time.monotonic()

    with pytest.raises(RuntimeError, match="clock broke"):
        async with heartbeat(redis, "crash", namespace=ns, interval=0.02, clock=clock) as hb:
            await asyncio.sleep(10)  # cancelled by the crash
    assert hb.progress.cancelled
    assert any("ticker crashed" in r.getMessage() for r in caplog.records)


async def test_blackhole_longer_than_ttl_the_work_stops_before_any_sweeper_can_claim(
    proxied: Proxied,
) -> None:
    """Cut off for longer than ttl: the executor function sees ``cancelled`` first, then (and
    only then) a sweeper — looking through the undisturbed connection — claims the job; the
    job is recorded exactly once, as LOST, by the sweeper. The two moments compared are the
    work's stop and the claim itself (``claimed_at_ms``, the Redis server's clock, which on
    this one host is the wall clock the work reads), not when ``sweep()`` returned."""
    keys = KEYS.job("cut")
    seen_cancelled: list[float] = []
    claims: list[StaleJob] = []

    def work(cell: ProgressCell) -> None:
        while not cell.cancelled:
            cell.advance()
            time.sleep(0.001)
        seen_cancelled.append(time.time() * 1000)

    sweeper = Sweeper(proxied.direct)

    async def sweep_until_claimed() -> None:
        while not claims:
            claims.extend(await sweeper.sweep())
            await asyncio.sleep(0.01)

    with ThreadPoolExecutor(1) as pool:
        with pytest.raises(LeaseLost) as info:
            async with heartbeat(
                proxied.via_proxy, "cut", interval=0.1, ttl=1.0, index_every=1, final_timeout=2
            ) as hb:
                running = asyncio.get_running_loop().run_in_executor(pool, work, hb.progress)
                sweeping = asyncio.ensure_future(sweep_until_claimed())
                proxied.proxy.blackhole = True
                await running
        await asyncio.wait_for(sweeping, 30)
    assert info.value.cause is LeaseLostCause.EXPIRED
    assert [job.job_id for job in claims] == ["cut"]  # claimed once, by the sweeper
    assert seen_cancelled[0] < claims[0].claimed_at_ms  # the work stopped before the claim
    state = await proxied.direct.hgetall(keys.state)
    assert state[b"status"] == b"LOST"
    kinds = [e[b"kind"] for _, e in await proxied.direct.xrange(keys.events)]
    assert kinds.count(b"stale") == 1
    assert b"end" not in kinds  # the cut-off worker never recorded a second terminal state
