"""Who keeps a queue's claim fresh while a sidecar job's heartbeat is entered: both shells,
:func:`pulse` and :func:`pulse_sync`, follow one decision (``plan_claim``), on real Redis and a
real helper process."""

from __future__ import annotations

import asyncio
import functools
import time

import redis as redis_sync
import redis.asyncio as aioredis

from jobpulse.integrations import PulseOptions
from jobpulse.integrations._common import HelperClaim, plan_claim, pulse, pulse_sync
from tests.support import eventually


def count(key: str, client: redis_sync.Redis) -> None:
    """The helper's refresh (module-level: it is pickled to the helper)."""
    client.incr(key)


def test_with_a_helper_claim_the_claim_is_refreshed_here_only_while_entering() -> None:
    claim = HelperClaim(broker=None, refresh=count, period=1.0, job_id="j")  # type: ignore[arg-type]
    plan = plan_claim("here", claim, sidecar=True)
    assert (plan.keeper, plan.entering, plan.running) == (claim, "here", None)


def test_without_a_helper_claim_the_claim_is_refreshed_here_while_the_body_runs() -> None:
    claim = HelperClaim(broker=None, refresh=count, period=1.0, job_id="j")  # type: ignore[arg-type]
    for sidecar, kept in ((False, claim), (True, None), (False, None)):
        plan = plan_claim("here", kept, sidecar=sidecar)
        assert (plan.keeper, plan.entering, plan.running) == (None, None, "here")


async def test_asyncio_pulse_refreshes_the_claim_while_the_helper_starts(
    redis_url: str, redis: aioredis.Redis, ns: str
) -> None:
    options = PulseOptions(interval=0.2, ttl=1.0, namespace=ns, sidecar=True)
    broker = redis_sync.Redis.from_url(redis_url)
    claim = HelperClaim.of(broker, functools.partial(count, f"{ns}:helper"), 0.2, f"{ns}-1")
    broker.close()
    here: list[int] = []

    async def refresh() -> None:
        here.append(1)

    async with pulse(options, redis, f"{ns}-1", "t", refresh, sidecar=True, claim=claim):
        entered = len(here)  # refreshed here while the helper started and took the lease
        await eventually(lambda: redis.get(f"{ns}:helper"))  # then the helper refreshes
        await asyncio.sleep(0.6)  # three periods: none refreshes here
        assert entered > 0
        assert len(here) == entered


async def test_sync_pulse_refreshes_the_claim_while_the_helper_starts(
    redis_url: str, redis: aioredis.Redis, ns: str
) -> None:
    options = PulseOptions(interval=0.2, ttl=1.0, namespace=ns, sidecar=True)
    broker = redis_sync.Redis.from_url(redis_url)
    claim = HelperClaim.of(broker, functools.partial(count, f"{ns}:helper"), 0.2, f"{ns}-1")
    here: list[int] = []

    def body() -> tuple[int, int]:
        with pulse_sync(options, broker, f"{ns}-1", "t", lambda: here.append(1), claim=claim):
            entered = len(here)
            while not broker.get(f"{ns}:helper"):  # then the helper refreshes
                time.sleep(0.02)
            time.sleep(0.6)  # three periods: none refreshes here
            return entered, len(here)

    try:
        entered, after = await asyncio.wait_for(asyncio.to_thread(body), 10)
        assert entered > 0
        assert after == entered
    finally:
        broker.close()
