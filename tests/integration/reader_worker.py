"""A worker process for the reader tests: holds a heartbeat until it is killed.

Usage: ``python tests/integration/reader_worker.py REDIS_URL NAMESPACE JOB_ID TTL INTERVAL``
(``cluster:redis://...`` for a Redis Cluster).
Prints ``ready`` once the job is visible, then advances forever.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from jobpulse import heartbeat


async def connect(url: str) -> Any:
    """As ``tests.support.connect`` (this script runs by path, outside the package)."""
    if url.startswith("cluster:"):
        return await RedisCluster.from_url(url.removeprefix("cluster:")).initialize()
    return aioredis.Redis.from_url(url)


async def main(url: str, namespace: str, job_id: str, ttl: float, interval: float) -> None:
    client = await connect(url)
    async with heartbeat(
        client, job_id, namespace=namespace, ttl=ttl, interval=interval, stream_every=1
    ) as hb:
        hb.set_stage("working")
        await hb.checkpoint(step=1)
        print("ready", flush=True)
        while True:
            hb.progress.advance()
            await asyncio.sleep(0.02)


if __name__ == "__main__":
    url, ns, job, ttl, interval = sys.argv[1:6]
    asyncio.run(main(url, ns, job, float(ttl), float(interval)))
