"""A CPU-heavy job in a process pool, its live progress read back from Redis.

    python examples/process_pool_demo.py [--redis URL] [--items N]

Uses the Redis at ``--redis``, else ``REDIS_URL``, else ``redis://localhost:6379/0``
(``redis-server`` or ``docker run -p 6379:6379 redis:7`` starts one; ``jobpulse demo`` starts one
by itself).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import redis.asyncio as aioredis

from jobpulse import ProgressCell, heartbeat


def crunch(cell: ProgressCell, items: int) -> str:
    """The heavy part: runs in another process, reports progress through shared memory."""
    digest = b"jobpulse"
    for _ in range(items):
        cell.check()  # stops promptly if the job is cancelled or its lease is lost
        for _ in range(2000):
            digest = hashlib.sha256(digest).digest()
        cell.advance()
    return digest.hex()[:16]


async def main(url: str, items: int) -> None:
    client = aioredis.Redis.from_url(url, decode_responses=True)
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    try:
        async with heartbeat(client, "demo-job", total=items, interval=0.5, ttl=3.0) as hb:
            hb.set_stage("hashing")
            work = asyncio.get_running_loop().run_in_executor(pool, crunch, hb.progress, items)
            while not work.done():
                # What any client sees: one HMGET of the snapshot and the liveness TTL.
                done, total, rate, rss, stage = await client.hmget(
                    "jobpulse:{demo-job}:state", "done", "total", "rate", "rss_bytes", "stage"
                )
                alive = await client.pttl("jobpulse:{demo-job}:alive")
                print(
                    f"{stage:8} {done:>6}/{total} items  {rate or '-':>8} items/s  "
                    f"rss {int(rss or 0) / 2**20:6.1f} MiB  lease left {alive} ms",
                    flush=True,
                )
                await asyncio.wait({work}, timeout=0.5)
            print("result", await work)
        print("final status:", await client.hget("jobpulse:{demo-job}:state", "status"))
    finally:
        pool.shutdown()
        await client.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
    parser.add_argument("--items", type=int, default=2000)
    args = parser.parse_args()
    asyncio.run(main(args.redis, args.items))
