"""ProgressCell counts exactly in process and thread pools, however many tasks a job submits
(more tasks than the cell has lanes, one after another and at once), fork and spawn."""

from __future__ import annotations

import asyncio
import multiprocessing
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor

import pytest
import redis.asyncio as aioredis

from jobpulse import heartbeat
from jobpulse._protocol.keys import KeySchema
from jobpulse._worker.progress import LANES

from . import work

CHUNKS = 2 * LANES + 36  # well past the lanes, so lanes are handed out again


def _pool(kind: str) -> Executor:
    if kind == "thread":
        return ThreadPoolExecutor(4)
    return ProcessPoolExecutor(4, mp_context=multiprocessing.get_context(kind))


@pytest.mark.parametrize("kind", ["fork", "spawn", "thread"])
@pytest.mark.parametrize("fn", [work.set_chunk, work.advance_chunk])
async def test_sequential_chunks_count_every_item(
    redis: aioredis.Redis, ns: str, kind: str, fn: object
) -> None:
    keys = KeySchema(ns).job("chunks")
    with _pool(kind) as pool:
        async with heartbeat(redis, "chunks", namespace=ns, interval=0.05, ttl=2.0) as hb:
            loop = asyncio.get_running_loop()
            for _ in range(CHUNKS):
                # Threads share one object: a task that uses set() takes a lane of its own.
                cell = hb.progress.lane() if kind == "thread" else hb.progress
                await loop.run_in_executor(pool, fn, cell, 10)  # type: ignore[arg-type]
                del cell
            assert hb.progress.done == CHUNKS * 10
    assert await redis.hget(keys.state, "done") == str(CHUNKS * 10).encode()


@pytest.mark.parametrize("kind", ["fork", "spawn"])
async def test_concurrent_chunks_count_every_item(
    redis: aioredis.Redis, ns: str, kind: str
) -> None:
    keys = KeySchema(ns).job("at-once")
    with _pool(kind) as pool:
        async with heartbeat(redis, "at-once", namespace=ns, interval=0.05, ttl=2.0) as hb:
            loop = asyncio.get_running_loop()
            await asyncio.gather(
                *(
                    loop.run_in_executor(pool, work.advance_chunk, hb.progress, 500)
                    for _ in range(CHUNKS)
                )
            )
            hb.progress.advance(7)  # the heartbeat's own lane is nobody else's
            assert hb.progress.done == CHUNKS * 500 + 7
    assert await redis.hget(keys.state, "done") == str(CHUNKS * 500 + 7).encode()
