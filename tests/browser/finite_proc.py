"""A worker process for the dashboard tests: ``python -m tests.browser.finite_proc URL NS JOB N``.

Takes the job's lease (``total=N``), prints ``ready <pid>``, waits for a line on stdin, then
advances N items at about 10 per second, one stream entry per beat, and completes.
"""

from __future__ import annotations

import asyncio
import os
import sys

import redis.asyncio as aioredis

from jobpulse import heartbeat


async def main(url: str, ns: str, job_id: str, n: int) -> None:
    client = aioredis.Redis.from_url(url)
    try:
        async with heartbeat(
            client, job_id, namespace=ns, total=n, interval=0.1, ttl=2.0, stream_every=1,
            meta={"kind": "browser-test"},
        ) as hb:  # fmt: skip
            hb.set_stage("waiting")
            print(f"ready {os.getpid()}", flush=True)
            await asyncio.to_thread(sys.stdin.readline)
            hb.set_stage("crunching")
            for _ in range(n):
                hb.progress.advance()
                await asyncio.sleep(0.1)
            hb.set_stage("done")
    finally:
        await client.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
