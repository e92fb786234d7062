"""The worker's scenarios, run for every shell from one body each: the asyncio shell
(``jobpulse.heartbeat``), the thread shell (``jobpulse.sync.heartbeat(..., sidecar=False)``)
and the sync shell beaten by the sidecar helper (``jobpulse.sync.heartbeat``'s default).

A scenario's body is a plain function of the heartbeat, run in a thread for either shell (the
asyncio shell awaits it through ``run_in_executor``; the thread shell runs it inside its
``with`` block), so the same lines exercise the same state machine behind both shells.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

import jobpulse
import jobpulse.sync
from jobpulse import JobCancelled, JobState, LeaseLost, LeaseLostCause, Sweeper, request_cancel
from jobpulse._protocol.keys import KeySchema
from jobpulse._protocol.scripts import SCRIPTS
from jobpulse._provision import RedisServer

from ..integration import work
from ..support import Monitor, eventually, spawn_ready, stop
from .conftest import Proxied

SHELLS = ["asyncio", "thread", "sidecar"]
Body = Callable[[Any], Any]


async def run_job(shell: str, url: str, job_id: str, body: Body, **options: Any) -> Any:
    """Run ``body(hb)`` as the job ``job_id`` under ``shell``; return what it returned."""
    if shell == "asyncio":
        client = aioredis.Redis.from_url(url)
        try:
            async with jobpulse.heartbeat(client, job_id, **options) as hb:
                return await asyncio.get_running_loop().run_in_executor(None, body, hb)
        finally:
            await client.aclose()

    def run() -> Any:
        # a blocking pipeline is bounded by the socket timeout (docs/sync.md): half the ttl
        client = redis.Redis.from_url(url, socket_timeout=options.get("ttl", 6.0) / 2)
        try:
            sidecar = shell == "sidecar"
            with jobpulse.sync.heartbeat(client, job_id, sidecar=sidecar, **options) as hb:
                return body(hb)
        finally:
            client.close()

    return await asyncio.to_thread(run)


def until_told(started: threading.Event, go: threading.Event) -> Body:
    """A body that says it started and returns once told to."""

    def body(hb: Any) -> None:
        started.set()
        while not go.wait(0.01):
            pass

    return body


def until_stopped(started: threading.Event) -> Body:
    """A body that works until its heartbeat says stop, then raises ``JobCancelled``."""

    def body(hb: Any) -> None:
        started.set()
        while not hb.cancelled:
            hb.progress.advance()
            time.sleep(0.01)
        hb.check()

    return body


async def _field(client: aioredis.Redis, key: str, name: str, value: bytes) -> bool:
    return bool(await client.hget(key, name) == value)


@pytest.fixture
async def direct(private_redis: RedisServer) -> Any:
    client = aioredis.Redis.from_url(private_redis.url)
    yield client
    await client.aclose()


@pytest.mark.parametrize("shell", SHELLS)
async def test_spawn_pool_job_ends_completed_with_every_item(
    shell: str, private_redis: RedisServer, direct: aioredis.Redis
) -> None:
    keys = KeySchema("jobpulse").job("pool")
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))

    def body(hb: Any) -> int:
        hb.set_stage("hashing")
        return int(pool.submit(work.hash_items, hb.progress, 300, 0.001).result())

    try:
        assert await run_job(shell, private_redis.url, "pool", body, interval=0.05, ttl=1.0) > 0
    finally:
        pool.shutdown()
    state = await direct.hgetall(keys.state)
    assert state[b"status"] == b"COMPLETED"
    assert state[b"done"] == b"300"
    assert state[b"stage"] == b"hashing"
    assert not await direct.exists(keys.alive)


@pytest.mark.parametrize("shell", SHELLS)
async def test_one_beat_is_one_command(
    shell: str, private_redis: RedisServer, direct: aioredis.Redis
) -> None:
    for script in (SCRIPTS.enroll, SCRIPTS.acquire, SCRIPTS.beat, SCRIPTS.finish, SCRIPTS.unindex):
        await direct.script_load(script.text)
    stats: list[Any] = []

    def body(hb: Any) -> None:
        while hb.statistics().beats_sent < 40:
            time.sleep(0.01)
        stats.append(hb)

    async with Monitor(private_redis.port) as mon:
        # ttl 2 s: a socket timeout (ttl / 2) under load would make redis-py send a beat again
        await run_job(shell, private_redis.url, "one", body, interval=0.05, ttl=2.0)
        unindex = SCRIPTS.unindex.sha
        # both unindexes (the kind entry, then the running entry: the same script) have been
        # seen, so every command of the job is in the monitor's lines before they are counted
        await eventually(lambda: _true(sum(unindex in ln for ln in mon.lines) >= 2), within=10)
    sent = stats[0].statistics().beats_sent
    names = mon.commands()
    # one EVALSHA per beat, plus enroll, acquire, the final write and the two unindexes
    assert names.count("evalsha") == sent + 5, (names.count("evalsha"), sent)
    others = [n for n in names if n not in ("evalsha", "zadd", "hello", "client")]
    assert others == ["zscore"], others  # the index score, read once before the final write
    assert names.count("zadd") <= 3 * (sent // 10 + 1) + 2


async def _true(value: bool) -> bool:
    return value


@pytest.mark.parametrize("shell", SHELLS)
async def test_stolen_lease_stops_the_job_with_lease_lost(
    shell: str, private_redis: RedisServer, direct: aioredis.Redis
) -> None:
    keys = KeySchema("jobpulse").job("stolen")
    started = threading.Event()
    job = asyncio.create_task(
        run_job(shell, private_redis.url, "stolen", until_stopped(started), interval=0.05, ttl=1.0)
    )
    await asyncio.to_thread(started.wait, 10)
    await direct.set(keys.alive, "someone-else:1", px=5000)
    with pytest.raises(LeaseLost) as lost:
        await job
    assert lost.value.cause is LeaseLostCause.TAKEN_OVER
    assert await direct.hget(keys.state, "status") == b"RUNNING"  # the fenced-out writes nothing


@pytest.mark.parametrize("shell", SHELLS)
async def test_remote_cancel_ends_the_job_cancelled(
    shell: str, private_redis: RedisServer, direct: aioredis.Redis
) -> None:
    keys = KeySchema("jobpulse").job("stop")
    started = threading.Event()
    job = asyncio.create_task(
        run_job(shell, private_redis.url, "stop", until_stopped(started), interval=0.05, ttl=1.0)
    )
    await asyncio.to_thread(started.wait, 10)
    assert await request_cancel(direct, "stop") is True
    with pytest.raises(JobCancelled):
        await job
    assert await direct.hget(keys.state, "status") == b"CANCELLED"


@pytest.mark.parametrize("shell", SHELLS)
async def test_sigkilled_worker_goes_stale_then_is_claimed(
    shell: str, private_redis: RedisServer, direct: aioredis.Redis
) -> None:
    proc = spawn_ready(
        "tests.integration.shell_proc", shell, private_redis.url, "jobpulse", "doomed", "1.0"
    )
    reader = jobpulse.StatusReader(direct, cache_ttl=0.0)
    try:
        assert (await reader.get("doomed")).state is JobState.RUNNING
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)

        async def stale() -> bool:
            return (await reader.get("doomed")).state is JobState.STALE

        await eventually(stale, within=5)
        sweeper = Sweeper(direct)

        async def claim() -> list[str]:  # once the index entry's deadline has passed
            return [job.job_id for job in await sweeper.sweep()]

        assert await eventually(claim, within=10) == ["doomed"]
        assert (await reader.get("doomed")).state is JobState.LOST
    finally:
        stop(proc)
        await reader.aclose()


@pytest.mark.parametrize("shell", SHELLS)
async def test_restart_with_data_loss_the_worker_restores_its_job(
    shell: str, private_redis: RedisServer, direct: aioredis.Redis
) -> None:
    keys = KeySchema("jobpulse").job("survivor")
    halfway, restarted = threading.Event(), threading.Event()

    def body(hb: Any) -> None:
        hb.progress.advance(5)
        halfway.set()
        restarted.wait(20)
        hb.progress.advance(5)
        while hb.progress.done != 10 or not hb.statistics().beats_written:
            time.sleep(0.01)
        time.sleep(0.5)

    job = asyncio.create_task(
        run_job(shell, private_redis.url, "survivor", body, interval=0.05, ttl=3.0, meta={"k": 1})
    )
    await asyncio.to_thread(halfway.wait, 10)
    await eventually(lambda: _field(direct, keys.state, "done", b"5"), within=10)
    seq_before = int(await direct.hget(keys.state, "seq"))
    private_redis.restart()  # SIGKILL, no persistence: every key is gone
    await direct.connection_pool.disconnect()  # the test's own pooled connection died with it
    restarted.set()
    await eventually(lambda: _field(direct, keys.state, "done", b"10"), within=10)
    await eventually(lambda: _field(direct, keys.state, "meta", b'{"k":1}'), within=10)
    assert int(await direct.hget(keys.state, "seq")) > seq_before  # seq went on
    await job
    state = await direct.hgetall(keys.state)
    assert state[b"status"] == b"COMPLETED"
    assert state[b"done"] == b"10"
    assert state[b"attempt"] == b"1"


@pytest.mark.parametrize("shell", SHELLS)
async def test_outage_shorter_than_ttl_the_job_goes_on(shell: str, proxied: Proxied) -> None:
    keys = KeySchema("jobpulse").job("hole")
    started, go = threading.Event(), threading.Event()
    job = asyncio.create_task(
        run_job(shell, proxied.proxy.url, "hole", until_told(started, go), interval=0.2, ttl=3.0)
    )
    await asyncio.to_thread(started.wait, 10)
    before = int(await proxied.direct.hget(keys.state, "seq"))
    proxied.proxy.blackhole = True
    await asyncio.sleep(1.0)
    proxied.proxy.blackhole = False

    async def moved() -> bool:
        return int(await proxied.direct.hget(keys.state, "seq")) > before + 2

    await eventually(moved, within=5)
    assert await proxied.direct.pttl(keys.alive) > 0
    go.set()
    await job
    assert await proxied.direct.hget(keys.state, "status") == b"COMPLETED"


async def test_a_thread_shell_job_with_a_checkpoint_pending_at_its_lease_expiry_ends_lease_lost(
    proxied: Proxied,
) -> None:
    """Found by the nemesis run (seed 1): a thread-shell job whose lease expired while its
    checkpoint waited to be sent left the beat thread no beat and no deadline to wait for, and it
    crashed in ``Condition.wait(inf)``: OverflowError out of ``with`` instead of
    ``LeaseLost(EXPIRED)``, and the thread gone for every later job of the client."""

    def body(hb: Any) -> None:
        started.set()
        for k in range(1, 1000):  # as a nemesis worker does
            time.sleep(0.1)
            hb.check()
            if k % 5 == 0:
                hb.checkpoint(n=k)

    started = threading.Event()
    job = asyncio.create_task(run_job("thread", proxied.proxy.url, "gone", body, interval=0.5,
                                      ttl=3.0))  # fmt: skip
    await asyncio.to_thread(started.wait, 10)
    proxied.proxy.blackhole = True
    with pytest.raises(LeaseLost) as lost:
        await job
    proxied.proxy.blackhole = False
    assert lost.value.cause is LeaseLostCause.EXPIRED


@pytest.mark.parametrize("shell", SHELLS)
async def test_a_final_write_whose_reply_was_lost_lands_once(shell: str, proxied: Proxied) -> None:
    """Replay safety: the final write's reply is cut; the retry is answered as written."""
    keys = KeySchema("jobpulse").job("replay")
    await proxied.direct.script_load(SCRIPTS.finish.text)
    started, go = threading.Event(), threading.Event()
    job = asyncio.create_task(
        run_job(shell, proxied.proxy.url, "replay", until_told(started, go), interval=0.2, ttl=3.0)
    )
    await asyncio.to_thread(started.wait, 10)
    cut = proxied.proxy.drop_reply_once(SCRIPTS.finish.sha.encode())
    go.set()
    await job
    assert cut.is_set()
    entries = await proxied.direct.xrange(keys.events)
    assert [fields[b"kind"] for _, fields in entries].count(b"end") == 1
    assert await proxied.direct.hget(keys.state, "status") == b"COMPLETED"
