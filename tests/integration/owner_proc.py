"""An owner process for owner-death tests:
``python -m tests.integration.owner_proc URL NS JOB TTL METHOD MARKER``.

Holds a job's heartbeat and runs ``work.check_until_stopped`` in a ProcessPoolExecutor child
(``METHOD``: fork or spawn); prints ``ready <pid> <child pid>`` once the child advances the
cell, then waits to be killed by the test.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor

import redis.asyncio as aioredis

from jobpulse import heartbeat

from . import work


async def main(url: str, ns: str, job_id: str, ttl: float, method: str, marker: str) -> None:
    client = aioredis.Redis.from_url(url)
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context(method))
    async with heartbeat(client, job_id, namespace=ns, ttl=ttl, interval=ttl / 6) as hb:
        running = asyncio.get_running_loop().run_in_executor(
            pool, work.check_until_stopped, hb.progress, marker
        )
        while hb.progress.done == 0:
            await asyncio.sleep(0.01)
        children = " ".join(str(pid) for pid in pool._processes)
        print(f"ready {os.getpid()} {children}", flush=True)
        await running


if __name__ == "__main__":
    a = sys.argv
    asyncio.run(main(a[1], a[2], a[3], float(a[4]), a[5], a[6]))
