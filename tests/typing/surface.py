"""User-style code for the worker, reader, sweeper and sync APIs, checked by ``mypy --strict``.

Lines marked ``# type: ignore[...]`` are mistakes mypy must catch: under ``--strict``
(``warn_unused_ignores``) an ignore that is not needed is itself an error, so each one proves
the mistake is refused.
"""

from __future__ import annotations

import asyncio
import threading
from typing import assert_type

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

import jobpulse
from jobpulse import (
    AsyncSidecarHeartbeat,
    CacheStatistics,
    Event,
    HeartbeatStatistics,
    JobHeartbeat,
    JobState,
    JobStatus,
    OnStale,
    ReaderStatistics,
    StaleJob,
    SweeperStatistics,
)
from jobpulse.sync import SidecarHeartbeat, SyncHeartbeat
from jobpulse.sync import StatusReader as SyncReader


async def worker(client: aioredis.Redis, cluster: RedisCluster) -> HeartbeatStatistics:
    async with jobpulse.heartbeat(client, "a", total=10, interval=0.5, ttl=3.0, kind="etl") as hb:
        hb.progress.advance()
        hb.check()
        stats = hb.statistics()
    async with jobpulse.heartbeat(cluster, "b", meta={"k": 1}, final_timeout=5.0):
        pass
    return stats


def typos_are_refused(client: aioredis.Redis, sync: redis.Redis) -> None:
    # (the factories are overloaded on sidecar=: mypy reports no overload matching)
    jobpulse.heartbeat(client, "x", totl=10)  # type: ignore[call-overload]
    jobpulse.heartbeat(client, "x", interval="fast")  # type: ignore[call-overload]
    jobpulse.heartbeat(sync, "x")  # type: ignore[call-overload]
    jobpulse.sync.heartbeat(sync, "x", ttl="long")  # type: ignore[call-overload]
    jobpulse.sync.heartbeat(client, "x")  # type: ignore[call-overload]
    jobpulse.sync.request_cancel(sync, "x", reasn="typo")  # type: ignore[call-arg]
    jobpulse.sync.request_cancel(client, "x")  # type: ignore[arg-type]


async def reader(client: aioredis.Redis) -> list[Event]:
    async with jobpulse.StatusReader(client, cache_ttl=0.25) as r:
        status: JobStatus = await r.get("a", fields=["done", "total"])
        done: int | None = status.done
        assert done is None or done >= 0
        final = await r.wait("a", timeout=10.0)
        assert final.state in (JobState.COMPLETED, JobState.FAILED)
        stats: ReaderStatistics = r.statistics()
        cache: CacheStatistics = stats.cache
        assert cache.hits >= 0
        return [event async for event in r.watch("a")]


async def sweeper(client: aioredis.Redis) -> SweeperStatistics:
    def log_it(job: StaleJob) -> None:
        print(job.job_id, job.attempt, job.checkpoint)

    on_stale: OnStale = log_it
    s = jobpulse.Sweeper(client)
    async with asyncio.timeout(5):
        for job in await s.sweep():
            on_stale(job)
    return s.statistics()


def sync_worker(client: redis.Redis) -> int:
    with jobpulse.sync.heartbeat(client, "s", total=100, kind="report") as hb:
        sync_hb: SyncHeartbeat | SidecarHeartbeat = hb  # the sidecar's proxy by default
        for _ in range(100):
            hb.check()
            hb.progress.advance()
        written: bool = hb.checkpoint(offset=100)
        print(written)
        hb.set_stage("upload")
        return sync_hb.fence + hb.attempt


def sync_operator(client: redis.Redis) -> bool:
    asked: bool = jobpulse.sync.request_cancel(client, "s", namespace="jobpulse", reason="stop")
    return asked


def sync_reader(client: redis.Redis) -> JobState:
    r = SyncReader(client)
    for event in r.watch("s"):
        print(event.kind)
    done = threading.Event()
    done.set()
    return r.wait("s", timeout=30.0).state


async def the_sidecar_argument_narrows_the_type(
    client: aioredis.Redis, sync: redis.Redis, flag: bool
) -> None:
    """``sidecar=`` given as a literal (or left to its default) gives the one class it returns;
    a ``bool`` only known at run time gives the union."""
    assert_type(jobpulse.heartbeat(client, "a"), JobHeartbeat)
    assert_type(jobpulse.heartbeat(client, "a", sidecar=False), JobHeartbeat)
    assert_type(jobpulse.heartbeat(client, "a", sidecar=True, ttl=5.0), AsyncSidecarHeartbeat)
    assert_type(jobpulse.heartbeat(client, "a", sidecar=flag), JobHeartbeat | AsyncSidecarHeartbeat)
    async with jobpulse.heartbeat(client, "a", sidecar=True) as hb:
        assert_type(hb, AsyncSidecarHeartbeat)
        pid: int | None = hb.helper_pid
        print(pid)
    assert_type(jobpulse.sync.heartbeat(sync, "s"), SidecarHeartbeat)
    assert_type(jobpulse.sync.heartbeat(sync, "s", sidecar=True), SidecarHeartbeat)
    assert_type(jobpulse.sync.heartbeat(sync, "s", sidecar=False, total=3), SyncHeartbeat)
    assert_type(jobpulse.sync.heartbeat(sync, "s", sidecar=flag), SyncHeartbeat | SidecarHeartbeat)
    with jobpulse.sync.heartbeat(sync, "s", sidecar=False) as shb:
        assert_type(shb, SyncHeartbeat)
