"""A worker process of either shell that a test freezes (SIGSTOP) past its lease:
``python -m tests.integration.late_proc SHELL URL NS JOB TTL`` (SHELL: asyncio or thread).

Runs one job (interval ttl/6) advancing a counter, prints ``ready <pid>`` once the lease is
held, and ends the job when a line arrives on stdin (or when the heartbeat says stop). Then it
prints what leaving the ``with`` block raised: ``outcome ok``, or ``outcome <Type> <cause name>``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from typing import Any

import redis
import redis.asyncio as aioredis

import jobpulse
import jobpulse.sync
from jobpulse import LeaseLost


def told() -> threading.Event:
    event = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), event.set()), daemon=True).start()
    return event


async def run_async(url: str, ns: str, job_id: str, ttl: float, go: threading.Event) -> None:
    client = aioredis.Redis.from_url(url)
    async with jobpulse.heartbeat(client, job_id, namespace=ns, ttl=ttl, interval=ttl / 6) as hb:
        print(f"ready {os.getpid()}", flush=True)
        while not go.is_set():
            hb.progress.advance()
            await asyncio.sleep(0.01)


def run_thread(url: str, ns: str, job_id: str, ttl: float, go: threading.Event) -> None:
    client = redis.Redis.from_url(url, socket_timeout=ttl / 2)
    # The thread shell itself (sidecar=False): its beats stop with the process it is frozen in.
    with jobpulse.sync.heartbeat(
        client, job_id, namespace=ns, ttl=ttl, interval=ttl / 6, sidecar=False
    ) as hb:
        print(f"ready {os.getpid()}", flush=True)
        while not go.is_set() and not hb.cancelled:
            hb.progress.advance()
            time.sleep(0.01)


def outcome(exc: BaseException) -> str:
    cause: Any = exc.cause.name if isinstance(exc, LeaseLost) else ""
    return f"outcome {type(exc).__name__} {cause}".rstrip()


if __name__ == "__main__":
    shell, url, ns, job_id, ttl = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
    go = told()
    try:
        if shell == "asyncio":
            asyncio.run(run_async(url, ns, job_id, float(ttl), go))
        else:
            run_thread(url, ns, job_id, float(ttl), go)
    except Exception as exc:
        print(outcome(exc), flush=True)
    else:
        print("outcome ok", flush=True)
