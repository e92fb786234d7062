"""Overload degrades the beat rate, never the leases (issue 29 item 4): a burst of jobs
started at once on one client, in a separate worker process, observed from this process."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis

from jobpulse._protocol.keys import KeySchema


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Worker processes killed at teardown, before the namespace is cleaned, also when the
    test timed out (pytest-timeout interrupts the event loop, not the test's coroutine)."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.mark.xdist_group("cpu")  # burns a core for up to a minute (README)
@pytest.mark.parametrize(
    "count",
    [
        10_000,
        # 20,000 needs the machine to itself: beside the other xdist worker's tests, full garbage
        # collections of the ramp-up (0.3-1.9 s each, every ~5 s) stall the loop for longer than a
        # lease's slack (docs/worker.md, "Overload"). CI runs it alone (JOBPULSE_ALONE=1).
        pytest.param(20_000, marks=pytest.mark.alone),
    ],
)
async def test_a_burst_started_at_once_loses_no_lease(
    redis: aioredis.Redis,
    redis_url: str,
    ns: str,
    count: int,
    workers: list[subprocess.Popen[bytes]],
) -> None:
    """``count`` ``async with heartbeat()`` tasks created in one step on one client (default
    interval 1 s, ttl 6 s: holding them needs count/6 renewals a second, well within one
    process): every job keeps its lease through the burst and past one ttl more, and ends
    COMPLETED, as this process reads it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.burst_proc", redis_url, ns, str(count), "7"],
        stdout=subprocess.PIPE,
    )
    workers.append(proc)
    out, _ = await asyncio.to_thread(proc.communicate)
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
