"""A late worker is not a lost one (CONTRACT 2c), in both shells, with real processes.

A worker process is frozen (SIGSTOP) past its lease, as a C call holding the GIL or a blocked
event loop freezes its beats; this test process observes it through Redis. Nobody claims it: when
it wakes, its next beat takes the lease back (``beat.lua`` answers "re-taken"), the job goes on and
ends COMPLETED. A sweeper claims it meanwhile: it stays claimed, and the worker stops with
``LeaseLost(fenced_out)``, writing nothing.

Before: the thread shell's beat thread crashed on waking (``OverflowError``: an infinite
``Condition.wait`` timeout once its only lease was marked expired) and the job was recorded
FAILED; the asyncio shell raised ``LeaseLost(expired)`` and recorded LOST though nobody had
claimed the job.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

import jobpulse
from jobpulse import JobState, Sweeper
from jobpulse._protocol.keys import KeySchema
from jobpulse._provision import RedisServer

from ..support import eventually, spawn_ready, stop

SHELLS = ["asyncio", "thread"]
TTL = 1.0


@pytest.fixture
async def direct(private_redis: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(private_redis.url)
    yield client
    await client.aclose()


@pytest.fixture
async def reader(direct: aioredis.Redis) -> AsyncIterator[jobpulse.StatusReader]:
    status = jobpulse.StatusReader(direct, cache_ttl=0.0)
    yield status
    await status.aclose()


def _spawn(shell: str, server: RedisServer) -> subprocess.Popen[str]:
    """A worker process of ``shell`` running the job "late" (late_proc.py), its lease held."""
    args = (shell, server.url, "jobpulse", "late", str(TTL))
    return spawn_ready("tests.integration.late_proc", *args, stdin=True)


async def _state_is(reader: jobpulse.StatusReader, job_id: str, state: JobState) -> bool:
    return (await reader.get(job_id)).state is state


async def _freeze_until_stale(proc: subprocess.Popen[str], reader: jobpulse.StatusReader) -> None:
    """SIGSTOP the worker and wait (observing from here) until its liveness key is gone."""
    proc.send_signal(signal.SIGSTOP)
    await eventually(lambda: _state_is(reader, "late", JobState.STALE), within=10)


def _finish(proc: subprocess.Popen[str]) -> str:
    """Tell the worker to end its job; return the outcome line it prints."""
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    line = proc.stdout.readline().strip()
    assert proc.wait(10) == 0
    return line


@pytest.mark.parametrize("shell", SHELLS)
async def test_a_frozen_worker_nobody_claimed_takes_its_lease_back(
    shell: str, private_redis: RedisServer, direct: aioredis.Redis, reader: jobpulse.StatusReader
) -> None:
    keys = KeySchema("jobpulse").job("late")
    proc = _spawn(shell, private_redis)
    try:
        before = await reader.get("late")
        await _freeze_until_stale(proc, reader)
        await asyncio.sleep(2 * TTL)  # frozen for three leases in all
        proc.send_signal(signal.SIGCONT)
        await eventually(lambda: _state_is(reader, "late", JobState.RUNNING), within=10)
        done = (await reader.get("late")).done

        async def advancing() -> bool:  # beats go on, with the body's progress
            return (await reader.get("late")).done > done

        await eventually(advancing, within=10)
        assert _finish(proc) == "outcome ok"
    finally:
        stop(proc)
    after = await reader.get("late")
    assert after.state is JobState.COMPLETED
    assert (after.attempt, after.fence) == (before.attempt, before.fence)
    kinds = [e[b"kind"] for _, e in await direct.xrange(keys.events)]
    assert kinds.count(b"end") == 1
    assert b"stale" not in kinds


@pytest.mark.parametrize("shell", SHELLS)
async def test_a_frozen_worker_whose_job_was_claimed_stays_lost(
    shell: str, private_redis: RedisServer, direct: aioredis.Redis, reader: jobpulse.StatusReader
) -> None:
    keys = KeySchema("jobpulse").job("late")
    proc = _spawn(shell, private_redis)
    try:
        await _freeze_until_stale(proc, reader)
        sweeper = Sweeper(direct)

        async def claim() -> list[str]:  # once the index entry's deadline has passed
            return [job.job_id for job in await sweeper.sweep()]

        assert await eventually(claim, within=10) == ["late"]
        claimed = await direct.hgetall(keys.state)
        proc.send_signal(signal.SIGCONT)
        assert proc.stdout is not None
        line = await asyncio.to_thread(proc.stdout.readline)  # the worker stops by itself
        assert line.strip() == "outcome LeaseLost FENCED_OUT"
        assert proc.wait(10) == 0
        state = await direct.hgetall(keys.state)
        kinds = [e[b"kind"] for _, e in await direct.xrange(keys.events)]
    finally:
        stop(proc)
    assert state[b"status"] == b"LOST"
    assert state[b"fence"] == claimed[b"fence"]  # the claim stands: the late worker wrote nothing
    assert state[b"seq"] == claimed[b"seq"]
    assert b"end" not in kinds
