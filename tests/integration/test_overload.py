"""Overload degrades the beat rate, never the leases (issue 29 item 4): a burst of jobs
started at once on one client, in a separate worker process, observed from this process."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest
import redis.asyncio as aioredis

from jobpulse._protocol.keys import KeySchema


@pytest.mark.xdist_group("cpu")  # burns a core for up to a minute (README)
@pytest.mark.parametrize("count", [10_000, 20_000])
async def test_a_burst_started_at_once_loses_no_lease(
    redis: aioredis.Redis, redis_url: str, ns: str, count: int
) -> None:
    """``count`` ``async with heartbeat()`` tasks created in one step on one client (default
    interval 1 s, ttl 6 s: holding them needs count/6 renewals a second, well within one
    process): every job keeps its lease through the burst and past one ttl more, and ends
    COMPLETED, as this process reads it."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.integration.burst_proc",
        redis_url,
        ns,
        str(count),
        "7",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        out, _ = await proc.communicate()
    finally:
        if proc.returncode is None:  # the test timed out: leave no worker behind
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0
    lines = dict(line.split(" ", 1) for line in out.decode().splitlines())
    print(lines["stats"], lines["phases"])  # shown when the test fails
    assert json.loads(lines["outcomes"]) == {"ok": count}
    schema = KeySchema(ns)
    statuses: dict[bytes | None, int] = {}
    for first in range(0, count, 1000):
        pipe = redis.pipeline(transaction=False)
        for i in range(first, min(first + 1000, count)):
            pipe.hget(schema.state(f"burst-{i}"), "status")
        for status in await pipe.execute():
            statuses[status] = statuses.get(status, 0) + 1
    assert statuses == {b"COMPLETED": count}
