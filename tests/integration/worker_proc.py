"""A worker process for crash tests: ``python -m tests.integration.worker_proc URL NS JOB [TTL]``
(a fifth argument is the job's kind).

Runs one job under a heartbeat (interval ttl/6) that advances a counter forever, prints
``ready <pid>`` once the lease is held, and is meant to be SIGKILLed or SIGSTOPped by the test.
"""

from __future__ import annotations

import asyncio
import os
import sys

from jobpulse import heartbeat

from ..support import connect


async def main(url: str, ns: str, job_id: str, ttl: float, kind: str = "") -> None:
    client = await connect(url)  # a single Redis, or a cluster for a ``cluster:`` URL
    opts = {"namespace": ns, "ttl": ttl, "interval": ttl / 6, "kind": kind}
    async with heartbeat(client, job_id, **opts) as hb:
        print(f"ready {os.getpid()}", flush=True)
        while True:
            hb.progress.advance()
            await asyncio.sleep(0.01)


if __name__ == "__main__":
    ttl = float(sys.argv[4]) if len(sys.argv) > 4 else 1.0
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], ttl, *sys.argv[5:6]))
