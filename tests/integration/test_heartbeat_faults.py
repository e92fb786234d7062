"""The worker core under crashes, restarts, script flushes, stale writes and CPU starvation."""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from jobpulse import LeaseLost, LeaseLostCause, heartbeat
from jobpulse._protocol import calls
from jobpulse._protocol.keys import AliveValue, KeySchema
from jobpulse._protocol.scripts import SCRIPTS
from jobpulse._provision import RedisServer
from jobpulse._worker.progress import NAME_PREFIX

from ..support import Monitor, eventually, spawn_worker, stop
from . import work

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def private(private_redis: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(private_redis.url)
    yield client
    await client.aclose()


async def test_sigkilled_worker_loses_liveness_while_snapshot_says_running(
    redis: aioredis.Redis, redis_url: str, ns: str
) -> None:
    keys = KeySchema(ns).job("doomed")
    proc = spawn_worker(redis_url, ns, "doomed", ttl=1.0)
    try:
        assert await redis.exists(keys.alive)
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)
        killed_at = time.monotonic()
        await eventually(lambda: _gone(redis, keys.alive), within=5)
        assert time.monotonic() - killed_at <= 1.0 + 0.5  # within ttl (plus polling slack)
        assert await redis.hget(keys.state, "status") == b"RUNNING"
    finally:
        stop(proc)


async def _gone(redis: aioredis.Redis, key: str) -> bool:
    return not await redis.exists(key)


async def test_one_beat_is_one_top_level_command(private_redis: RedisServer) -> None:
    """MONITOR tags commands run by a script with ``lua``: every other line is a round trip."""
    client = aioredis.Redis.from_url(private_redis.url)
    for script in (SCRIPTS.enroll, SCRIPTS.acquire, SCRIPTS.beat, SCRIPTS.finish, SCRIPTS.unindex):
        await client.script_load(script.text)
    try:
        async with Monitor(private_redis.port) as mon:
            async with heartbeat(client, "one-rt", interval=0.02, ttl=0.5, index_every=10) as hb:
                await eventually(lambda: _beats(hb, 60), within=20)
            stats = hb.statistics()
            # the two conditional unindexes after the final write (the per-kind index's, then
            # the running index's) are the last top-level commands
            unindex = SCRIPTS.unindex.sha
            await eventually(
                lambda: _true(sum(unindex in line for line in mon.lines) == 2), within=10
            )
    finally:
        await client.aclose()
    names = mon.commands()
    # one EVALSHA per beat, plus the index entry and the acquire, the final write and the two
    # unindexes (the per-kind index's, then the running index's)
    assert names.count("evalsha") == stats.beats_sent + 5, (names.count("evalsha"), stats)
    # (a connection opened meanwhile says HELLO / CLIENT SETINFO once: not per beat)
    others = [n for n in names if n not in ("evalsha", "zadd", "hello", "client")]
    assert others == ["zscore"], others  # the index score, read once before the final write
    # the running-index refresh: one ZADD per 10 beats, each with the per-kind index's and the
    # kinds' ZADD in the same pipeline (plus those two once after the acquire)
    assert names.count("zadd") <= 3 * (stats.beats_sent // 10 + 1) + 2


async def _true(value: bool) -> bool:
    return value


async def _beats(hb: object, n: int) -> bool:
    return hb.statistics().beats_sent >= n  # type: ignore[attr-defined, no-any-return]


async def test_snapshot_write_with_an_older_seq_is_refused(redis: aioredis.Redis, ns: str) -> None:
    keys = KeySchema(ns).job("seq")
    async with heartbeat(redis, "seq", namespace=ns, interval=30, ttl=60) as hb:
        token = hb._token
        seq = int(await redis.hget(keys.state, "seq"))

        def at(n: int) -> calls.Call[calls.BeatReply]:
            return calls.beat(
                keys.all(),
                calls.beat_segment(
                    token=token,
                    fence=hb.fence,
                    ttl_ms=5000,
                    seq=n,
                    fields={"done": "999", "stage": "late"},
                ),
            )

        stale = await calls.run(redis, at(seq - 1))
        assert stale.code is calls.BeatCode.SEQ_BEHIND  # seq older: nothing written
        assert stale.snapshot_seq == seq
        assert await redis.hget(keys.state, "stage") != b"late"
        same = await calls.run(redis, at(seq))
        assert same.code is calls.BeatCode.WRITTEN  # the same seq is taken for a replay of a
        assert await redis.hget(keys.state, "stage") != b"late"  # written beat: nothing written
        fresh = await calls.run(redis, at(seq + 1))
        assert fresh.code is calls.BeatCode.WRITTEN
        assert await redis.hget(keys.state, "stage") == b"late"
        hb._seq = seq + 1


async def test_restart_with_data_loss_mid_job_still_ends_completed(
    private_redis: RedisServer, private: aioredis.Redis
) -> None:
    keys = KeySchema("jobpulse").job("survivor")
    async with heartbeat(private, "survivor", interval=0.05, ttl=2.0, meta={"k": 1}) as hb:
        hb.progress.advance(5)
        await eventually(lambda: _field(private, keys.state, "done", b"5"))
        seq_before = int(await private.hget(keys.state, "seq"))
        private_redis.restart()  # SIGKILL, no persistence: every key is gone
        hb.progress.advance(5)
        await eventually(lambda: _field(private, keys.state, "done", b"10"), within=10)
        await eventually(lambda: _field(private, keys.state, "meta", b'{"k":1}'), within=10)
        alive = AliveValue.parse(await private.get(keys.alive))
        assert (alive.token, alive.fence) == (hb._token, hb.fence)
        assert int(await private.hget(keys.state, "seq")) > seq_before  # seq went on
        assert int(await private.hget(keys.state, "fence")) == hb.fence
    state = await private.hgetall(keys.state)
    assert state[b"status"] == b"COMPLETED"
    assert state[b"done"] == b"10"
    assert state[b"attempt"] == b"1"


_SNAPSHOT = ("done", "total", "stage", "rate", "eta_s", "rss_bytes", "cpu_s", "loop_lag_ms")
_SNAPSHOT += ("status", "seq", "fence", "attempt", "worker", "started_ms", "heartbeat_ms")
_SNAPSHOT += ("progress_ms", "meta", "kind")


async def test_data_loss_with_stable_progress_resends_every_field(
    private_redis: RedisServer, private: aioredis.Redis
) -> None:
    """Beats send only the fields that changed: after a restart that lost the data while
    progress stands still, the beat that finds the snapshot empty makes the next one resend
    every field (dynamic and static), so HMGET reads the whole snapshot again."""
    keys = KeySchema("jobpulse").job("still")
    async with heartbeat(
        private, "still", interval=0.05, ttl=2.0, total=10, meta={"k": 1}, kind="etl"
    ) as hb:
        hb.set_stage("work")
        hb.progress.advance(5)
        await eventually(lambda: _field(private, keys.state, "stage", b"work"))
        await eventually(lambda: _field(private, keys.state, "done", b"5"))
        private_redis.restart()  # SIGKILL, no persistence: every key is gone
        await eventually(lambda: _field(private, keys.state, "meta", b'{"k":1}'), within=10)
        await hb.checkpoint(step=1)  # a beat after the resend has been answered
        values = await private.hmget(keys.state, list(_SNAPSHOT))
        snap = dict(zip(_SNAPSHOT, values, strict=True))
        assert [name for name, value in snap.items() if value is None] == []
        assert (snap["done"], snap["total"], snap["stage"]) == (b"5", b"10", b"work")
        assert (snap["status"], snap["kind"], snap["attempt"]) == (b"RUNNING", b"etl", b"1")
        assert int(snap["fence"]) == hb.fence


async def test_every_snapshot_field_reads_with_hmget_while_progress_stands_still(
    redis: aioredis.Redis, ns: str
) -> None:
    """Changed-only beats keep the snapshot whole: after many beats with no progress every
    field of the contract's snapshot is present, plain decimal/UTF-8, and heartbeat_ms and
    seq move on every beat."""
    keys = KeySchema(ns).job("flat")
    async with heartbeat(
        redis, "flat", namespace=ns, interval=0.02, ttl=2.0, total=7, kind="etl"
    ) as hb:
        hb.set_stage("s")
        hb.progress.set(3)
        await eventually(lambda: _field(redis, keys.state, "done", b"3"))
        first = await redis.hmget(keys.state, ["seq", "heartbeat_ms", "progress_ms"])
        target = hb.statistics().beats_sent + 10
        await eventually(lambda: _beats(hb, target))
        values = await redis.hmget(keys.state, list(_SNAPSHOT))
        snap = {k: v.decode() for k, v in zip(_SNAPSHOT, values, strict=True) if v is not None}
        assert sorted(set(_SNAPSHOT) - set(snap)) == []
        assert (snap["done"], snap["total"], snap["stage"]) == ("3", "7", "s")
        assert int(snap["seq"]) > int(first[0])
        assert int(snap["heartbeat_ms"]) > int(first[1])
        assert snap["progress_ms"] == first[2].decode()  # done did not move since
        for name in ("rate", "eta_s", "rss_bytes", "cpu_s", "loop_lag_ms"):
            assert snap[name] == "" or float(snap[name]) >= 0, name


async def test_script_flush_mid_job_reloads_transparently(
    private_redis: RedisServer, private: aioredis.Redis
) -> None:
    keys = KeySchema("jobpulse").job("flushed")
    async with heartbeat(private, "flushed", interval=0.05, ttl=2.0) as hb:
        await private.script_flush()
        hb.progress.advance(3)
        await eventually(lambda: _field(private, keys.state, "done", b"3"))
        await private.script_flush()
    assert await private.hget(keys.state, "status") == b"COMPLETED"


async def _field(client: aioredis.Redis, key: str, field: str, value: bytes) -> bool:
    try:
        return await client.hget(key, field) == value  # type: ignore[no-any-return]
    except (OSError, RedisError):
        return False


@pytest.fixture
def burn_both_cores() -> Iterator[None]:
    procs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 2)
    ]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.xdist_group("cpu")  # burners never overlap on parallel workers (README)
@pytest.mark.usefixtures("burn_both_cores")
async def test_beats_keep_their_interval_while_both_cores_burn(
    redis: aioredis.Redis, ns: str
) -> None:
    keys = KeySchema(ns).job("starved")
    stamps: list[int] = []
    async with heartbeat(redis, "starved", namespace=ns, interval=0.2, ttl=2.0):
        end = time.monotonic() + 3
        while time.monotonic() < end:
            stamps.append(int(await redis.hget(keys.state, "heartbeat_ms")))
            await asyncio.sleep(0.05)
    beats = sorted(set(stamps))
    gaps = [b - a for a, b in itertools.pairwise(beats)]
    assert len(beats) >= 8, beats  # ~15 expected at 5 Hz over 3 s
    assert max(gaps) < 1000, gaps  # loosely: never near the 2 s ttl


async def test_no_shared_memory_left_even_when_a_pool_process_was_killed(
    redis: aioredis.Redis, ns: str
) -> None:
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    try:
        with pytest.raises(Exception, match="terminated abruptly"):
            async with heartbeat(redis, "killed-pool", namespace=ns, interval=0.05) as hb:
                name = hb.progress.name
                assert Path("/dev/shm", name).exists()
                await asyncio.get_running_loop().run_in_executor(pool, work.kill_self, hb.progress)
    finally:
        pool.shutdown()
    assert name.startswith(NAME_PREFIX)
    assert not Path("/dev/shm", name).exists()
    assert await redis.hget(KeySchema(ns).state("killed-pool"), "status") == b"FAILED"


async def test_redis_frozen_shorter_than_ttl_the_job_goes_on(
    private_redis: RedisServer, private: aioredis.Redis
) -> None:
    keys = KeySchema("jobpulse").job("hiccup")
    async with heartbeat(private, "hiccup", interval=0.1, ttl=3.0) as hb:
        assert private_redis.proc is not None
        private_redis.proc.send_signal(signal.SIGSTOP)  # blackhole: connections open, no bytes
        await asyncio.sleep(1.0)
        private_redis.proc.send_signal(signal.SIGCONT)
        hb.progress.advance(7)
        await eventually(lambda: _field(private, keys.state, "done", b"7"), within=5)
        assert not hb.progress.cancelled
        assert hb.statistics().beats_failed >= 1
    assert await private.hget(keys.state, "status") == b"COMPLETED"


async def test_redis_frozen_longer_than_ttl_stops_the_job_and_records_lost(
    private_redis: RedisServer, private: aioredis.Redis
) -> None:
    keys = KeySchema("jobpulse").job("cut-off")
    assert private_redis.proc is not None
    redis_proc = private_redis.proc
    with pytest.raises(LeaseLost) as info:
        async with heartbeat(private, "cut-off", interval=0.2, ttl=1.0, final_timeout=20) as hb:
            redis_proc.send_signal(signal.SIGSTOP)
            frozen_at = time.monotonic()
            try:
                await asyncio.sleep(30)  # cancelled by the local-ttl stop
            finally:
                stopped_after = time.monotonic() - frozen_at
                assert hb.progress.cancelled
                # Redis is back as the body stops: the LOST write (best effort, tried for one
                # interval, see test_bounds.py for Redis staying away) lands.
                redis_proc.send_signal(signal.SIGCONT)
    assert info.value.cause is LeaseLostCause.EXPIRED
    assert stopped_after < 1.0 + 0.5  # the lease deadline, not redis-py's retry schedule
    state = await private.hgetall(keys.state)
    assert state[b"status"] == b"LOST"
    assert b"expired" in state[b"error"]
    assert not await private.exists(keys.alive)


async def test_a_retried_final_write_is_idempotent(redis: aioredis.Redis, ns: str) -> None:
    """The final write's reply may be lost; its retry must answer "already ended", never
    "fenced out" (which would turn a COMPLETED job into a LeaseLost for the caller)."""
    keys = KeySchema(ns).job("twice")
    async with heartbeat(redis, "twice", namespace=ns, interval=30, ttl=60) as hb:
        token, fence = hb._token, hb.fence
    await redis.script_load(SCRIPTS.finish.text)
    values = ["1", "", "", "", "", "", "", ""]
    again = await redis.evalsha(
        SCRIPTS.finish.sha, 4, *keys.all(), token, fence, 5000, 999, "COMPLETED", "", 100,
        60_000, "", *values,
    )  # fmt: skip
    assert again[0] == 0
    kinds = [e[b"kind"] for _, e in await redis.xrange(keys.events)]
    assert kinds.count(b"end") == 1
