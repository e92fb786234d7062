"""A worker process of either shell, for crash tests:
``python -m tests.integration.shell_proc SHELL URL NS JOB TTL`` (SHELL: asyncio, thread, or
sidecar: the sync shell beaten by the sidecar helper).

Runs one job (interval ttl/6) advancing a counter forever, prints ``ready <pid>`` once the lease
is held, and is meant to be SIGKILLed by the test.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import redis
import redis.asyncio as aioredis

import jobpulse
import jobpulse.sync


async def run_async(url: str, ns: str, job_id: str, ttl: float) -> None:
    client = aioredis.Redis.from_url(url)
    async with jobpulse.heartbeat(client, job_id, namespace=ns, ttl=ttl, interval=ttl / 6) as hb:
        print(f"ready {os.getpid()}", flush=True)
        while True:
            hb.progress.advance()
            await asyncio.sleep(0.01)


def run_thread(url: str, ns: str, job_id: str, ttl: float, sidecar: bool) -> None:
    client = redis.Redis.from_url(url, socket_timeout=ttl / 2)
    with jobpulse.sync.heartbeat(
        client, job_id, namespace=ns, ttl=ttl, interval=ttl / 6, sidecar=sidecar
    ) as hb:
        print(f"ready {os.getpid()}", flush=True)
        while True:
            hb.progress.advance()
            time.sleep(0.01)


if __name__ == "__main__":
    shell, url, ns, job_id, ttl = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
    if shell == "asyncio":
        asyncio.run(run_async(url, ns, job_id, float(ttl)))
    else:
        run_thread(url, ns, job_id, float(ttl), sidecar=shell == "sidecar")
