"""When the process that owns ``async with heartbeat(...)`` dies, its executor children stop:
``cell.check()`` raises in a ProcessPoolExecutor child within about ttl of the owner's death."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from ..support import ROOT, eventually, stop

TTL = 2.0


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
async def test_pool_child_stops_once_the_owner_is_killed(
    redis: aioredis.Redis, redis_url: str, ns: str, tmp_path: Path, method: str, sig: int
) -> None:
    marker = tmp_path / "stopped"
    owner, children = _spawn_owner(redis_url, ns, method, marker)
    try:
        owner.send_signal(sig)
        owner.wait(5)
        killed_at = time.monotonic()
        await eventually(lambda: _exists(marker), within=TTL + 5)
        stopped_at, _ = marker.read_text().split()
        # The child's loop ended (it wrote the marker after check() raised), within about ttl
        # (the watch polls every 0.25 s). The idle pool process itself is the pool's to reap.
        assert float(stopped_at) - killed_at < TTL
    finally:
        stop(owner)
        for child in children:  # the idle (or, before the fix, still computing) pool process
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


def _spawn_owner(
    url: str, ns: str, method: str, marker: Path
) -> tuple[subprocess.Popen[str], list[int]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.owner_proc", url, ns, "orphan", str(TTL),
         method, str(marker)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert line[:1] == ["ready"], line
    return proc, [int(pid) for pid in line[2:]]


async def _exists(path: Path) -> bool:
    return path.exists()
