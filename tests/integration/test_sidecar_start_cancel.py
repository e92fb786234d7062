"""A sidecar job whose start is cancelled (a queue's timeout, an anyio cancel scope) while the
helper takes the lease: the helper starts the job all the same, so the owner must end it. A first
version forgot it: the helper beat the job RUNNING for as long as the owner lived, holding its
lease (every redelivery then met ``JobBusy``)."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

import jobpulse
from jobpulse import JobState, JobStatus

from ..support import eventually


async def test_a_start_cancelled_while_the_helper_acquires_ends_the_job_cancelled(
    redis: aioredis.Redis, ns: str
) -> None:
    options = {"namespace": ns, "interval": 0.05, "ttl": 1.0, "sidecar": True}
    async with jobpulse.heartbeat(redis, "warm", **options):  # type: ignore[arg-type]
        pass  # the helper runs: the next start reaches it at once
    hb = jobpulse.heartbeat(redis, "c-1", **options)  # type: ignore[arg-type]
    entering = asyncio.ensure_future(hb.__aenter__())
    await asyncio.sleep(0)  # the start request is sent; the enter waits for the helper's answer
    entering.cancel()
    with pytest.raises(asyncio.CancelledError):
        await entering
    reader = jobpulse.StatusReader(redis, namespace=ns, cache_ttl=0)

    async def ended() -> JobStatus | None:
        status = await reader.get("c-1")
        return status if status.state.is_terminal else None

    final = await eventually(ended, within=5)
    assert final.state is JobState.CANCELLED
    assert jobpulse.current() is None
