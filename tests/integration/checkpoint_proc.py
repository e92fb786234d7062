"""A worker process for the rollback test: ``python -m tests.integration.checkpoint_proc URL NS
JOB TTL``.

Runs one job under a heartbeat (interval ttl/6): checkpoints ``{"row": 10}`` and prints
``ready <pid>``; on a line on stdin checkpoints ``{"row": 500}`` and prints ``checkpointed``
once ``checkpoint()`` returned; then advances a counter until the test SIGKILLs it.
"""

from __future__ import annotations

import asyncio
import os
import sys

from jobpulse import heartbeat

from ..support import connect


async def main(url: str, ns: str, job_id: str, ttl: float) -> None:
    client = await connect(url)  # a single Redis, or a cluster for a ``cluster:`` URL
    async with heartbeat(client, job_id, namespace=ns, ttl=ttl, interval=ttl / 6) as hb:
        await hb.checkpoint(row=10)
        print(f"ready {os.getpid()}", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        await hb.checkpoint(row=500)
        print("checkpointed", flush=True)
        while True:
            hb.progress.advance()
            await asyncio.sleep(0.01)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])))
