"""User-style code, checked by ``mypy --strict`` (not collected by pytest)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ProcessPoolExecutor

import redis.asyncio as aioredis

import jobpulse
from jobpulse import AsyncSidecarHeartbeat, JobHeartbeat, ProgressCell, heartbeat, request_cancel


def crunch(cell: ProgressCell, n: int) -> int:
    for _ in range(n):
        cell.check()
        cell.advance()
    return n


async def run_job(client: aioredis.Redis, pool: ProcessPoolExecutor) -> int:
    hb: JobHeartbeat | AsyncSidecarHeartbeat  # in-loop beats by default; sidecar=True: a proxy
    async with heartbeat(client, "report-1", total=1000, meta={"user": 7}) as hb:
        hb.set_stage("crunch")
        result = await asyncio.get_running_loop().run_in_executor(pool, crunch, hb.progress, 1000)
        await hb.checkpoint(offset=result)
        fence: int = hb.fence
        attempt: int = hb.attempt
        held: bool = hb.lease_held
        return result + fence + attempt + held


async def cancel(client: aioredis.Redis) -> bool:
    try:
        return await request_cancel(client, "report-1", namespace="jobpulse")
    except jobpulse.InvalidJobId:
        return False


def stage_of_current_job() -> str | None:
    hb: (
        JobHeartbeat
        | jobpulse.sync.SyncHeartbeat
        | AsyncSidecarHeartbeat
        | jobpulse.sync.SidecarHeartbeat
        | None
    ) = jobpulse.current()
    if hb is None:
        return None
    hb.set_stage("load")
    kind: str = hb.kind
    return kind


async def sweep_and_ack(client: aioredis.Redis) -> list[tuple[str, int]]:
    sweeper = jobpulse.Sweeper(client, redeliver_after=30.0)
    handled: list[tuple[str, int]] = []
    for job in await sweeper.sweep():
        handled.append((job.job_id, job.attempt))  # idempotency key of a claim
        acknowledged: bool = await sweeper.ack(job)
        assert acknowledged
    return handled


def on_a_server_without_time_in_scripts(client: aioredis.Redis) -> float | None:
    clock: jobpulse.ScriptClock = jobpulse.script_time(client, mode="auto", time_command="MYTIME")
    return clock.bound
