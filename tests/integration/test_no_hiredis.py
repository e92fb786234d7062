"""An install without hiredis: ``wire.pack`` is the Python packer, and jobs still beat and
read through it. A real process whose imports of ``hiredis`` fail (an import blocker on
``sys.meta_path``, as if the package were not installed; redis-py then uses its own Python
parser and packer too) runs three jobs under one ticker (a tick packs the beats of several
jobs in one write), advances their progress, forces a beat (a checkpoint), reads them with
``StatusReader.get()`` and completes them; this process, with hiredis, then reads the final
snapshots it left."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import redis

from jobpulse import JobState
from jobpulse.sync import StatusReader

CHILD = textwrap.dedent(
    """
    import asyncio, importlib.abc, json, sys

    class NoHiredis(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "hiredis" or name.startswith("hiredis."):
                raise ImportError(f"No module named {name!r} (blocked by the test)")
            return None

    sys.meta_path.insert(0, NoHiredis())

    import redis.asyncio as aioredis
    import redis.utils
    from jobpulse import StatusReader, heartbeat
    from jobpulse._protocol import wire

    async def job(client, job_id, items):
        async with heartbeat(client, job_id, interval=0.02, ttl=2.0, namespace=NS) as hb:
            for _ in range(items):
                hb.progress.advance()
                await asyncio.sleep(0.01)
            await hb.checkpoint(items=items)  # a beat, written when this returns
            reader = StatusReader(client, namespace=NS, cache_ttl=0)
            status = await reader.get(job_id)
            return status.state.value, status.done, status.seq

    async def main():
        client = aioredis.Redis.from_url(URL)
        results = await asyncio.gather(*(job(client, f"j{i}", 20 + i) for i in range(3)))
        await client.aclose()
        print(json.dumps({
            "hiredis": redis.utils.HIREDIS_AVAILABLE,
            "hiredis_pack": wire.HIREDIS_PACK,
            "python_packer": wire.pack is wire.pack_python,
            "jobs": results,
        }))

    asyncio.run(main())
    """
)


def test_jobs_beat_and_read_without_hiredis(redis_url: str, ns: str) -> None:
    code = f"URL = {redis_url!r}\nNS = {ns!r}\n" + CHILD
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["hiredis"] is False
    assert out["hiredis_pack"] is False
    assert out["python_packer"] is True
    for i, (state, done, seq) in enumerate(out["jobs"]):
        assert state == "RUNNING"
        assert done == 20 + i  # written by the checkpoint's beat, read back
        assert seq > 1  # beats after the acquire
    client = redis.Redis.from_url(redis_url)
    try:
        reader = StatusReader(client, namespace=ns, cache_ttl=0)
        for i in range(3):
            status = reader.get(f"j{i}")
            assert status.state is JobState.COMPLETED
            assert status.done == 20 + i
    finally:
        client.close()
