"""A worker process for the CLI tests.

``python -m tests.cli.job_proc URL NS JOB TOTAL STEP OUTCOME [KIND]`` runs one job (of KIND)
of TOTAL items under a heartbeat (interval 0.2 s, ttl 1 s), one item every STEP seconds,
prints ``ready <pid>`` once the lease is held, and then ends as OUTCOME says: ``complete``
(COMPLETED), ``fail`` (FAILED: RuntimeError) or ``hold`` (stays RUNNING at TOTAL until killed
or cancelled).
"""

from __future__ import annotations

import asyncio
import os
import sys

import redis.asyncio as aioredis

from jobpulse import heartbeat


async def main(
    url: str, ns: str, job_id: str, total: int, step: float, outcome: str, kind: str
) -> None:
    client = aioredis.Redis.from_url(url)
    try:
        async with heartbeat(
            client, job_id, namespace=ns, total=total, interval=0.2, ttl=1.0, kind=kind
        ) as hb:
            hb.set_stage("counting")
            print(f"ready {os.getpid()}", flush=True)
            for _ in range(total):
                hb.progress.advance()
                await asyncio.sleep(step)
            if outcome == "fail":
                raise RuntimeError("boom")
            if outcome == "hold":
                await asyncio.Event().wait()
    finally:
        await client.aclose()


if __name__ == "__main__":
    url, ns, job, total, step, outcome = sys.argv[1:7]
    kind = sys.argv[7] if len(sys.argv) > 7 else ""
    try:
        asyncio.run(main(url, ns, job, int(total), float(step), outcome, kind))
    except BaseException as exc:  # the outcome is in Redis; exit quietly
        print(f"ended {type(exc).__name__}", flush=True)
