"""Worker and sweeper processes for test_sweeper.py.

Run as ``python -m tests.integration.sweep_worker MODE JSON-ARGS`` (workers, killed or frozen by
the test), or import :func:`sweep_process` in a ``multiprocessing`` child (sweepers). Each mode
prints one JSON line when ready and, where it ends by itself, one JSON line with its outcome.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import redis.asyncio as aioredis

from jobpulse import LeaseLost, Sweeper, heartbeat
from jobpulse._protocol.keys import KeySchema

from ..support import connect


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


async def hold(
    url: str, ns: str, ids: list[str], interval: float, ttl: float, index_shards: int = 1
) -> None:
    """Run every job of ``ids`` until killed; each records two checkpoints first."""
    client = await connect(url)
    entered = 0
    all_in = asyncio.Event()
    gate = asyncio.Semaphore(10)  # a loaded machine must not turn 50 acquires into timeouts

    async def one(job_id: str) -> None:
        nonlocal entered
        opts = {"namespace": ns, "interval": interval, "ttl": ttl, "index_every": 1,
                "index_shards": index_shards}  # fmt: skip
        await gate.acquire()
        async with heartbeat(client, job_id, **opts) as hb:
            hb.set_stage("work")
            await hb.checkpoint(job=job_id, phase="a")
            hb.progress.set(3)
            await hb.checkpoint(job=job_id, phase="b")
            gate.release()
            entered += 1
            if entered == len(ids):
                all_in.set()
            await asyncio.sleep(3600)

    async with asyncio.TaskGroup() as tg:
        for job_id in ids:
            tg.create_task(one(job_id))
        await all_in.wait()
        say(ready=True, pid=os.getpid())


async def frozen(url: str, ns: str, job_id: str, interval: float, ttl: float) -> None:
    """One job that keeps checkpointing; the test freezes it (SIGSTOP) and thaws it (SIGCONT).
    Prints what happened to it once it stops."""
    client = await connect(url)
    tried = 0
    opts = {"namespace": ns, "interval": interval, "ttl": ttl, "index_every": 1, "worker": "old"}
    try:
        async with heartbeat(client, job_id, **opts) as hb:
            await hb.checkpoint(step=0)
            say(ready=True, fence=hb.fence, attempt=hb.attempt)
            while True:
                await asyncio.sleep(interval / 2)
                hb.progress.advance()
                hb.set_stage(f"step-{tried}")
                tried += 1
                await hb.checkpoint(step=tried)
    except LeaseLost as exc:
        say(outcome="LeaseLost", cause=exc.cause.name, writes_tried_after=tried)
    else:
        say(outcome="ended")


async def live(url: str, ns: str, ids: list[str], interval: float, ttl: float, run: float) -> None:
    """Jobs that stay alive for ``run`` seconds and complete; prints how each ended."""
    client = await connect(url)
    outcomes: dict[str, str] = {}

    async def one(job_id: str) -> None:
        opts = {"namespace": ns, "interval": interval, "ttl": ttl, "index_every": 1}
        try:
            async with heartbeat(client, job_id, **opts) as hb:
                end = time.monotonic() + run
                while time.monotonic() < end:
                    hb.progress.advance()
                    await asyncio.sleep(0.01)
            outcomes[job_id] = "COMPLETED"
        except Exception as exc:
            outcomes[job_id] = repr(exc)

    say(ready=True, pid=os.getpid())
    async with asyncio.TaskGroup() as tg:
        for job_id in ids:
            tg.create_task(one(job_id))
    say(outcomes=outcomes)


def sweep_process(url: str, ns: str, sweepers: int, within: float) -> tuple[int, list[str]]:
    """A process of ``sweepers`` concurrent sweepers. Waits for the go signal (a Redis key), then
    sweeps (acknowledging each claim) until the namespace's index is empty. Returns (pid,
    every job id it claimed)."""
    return asyncio.run(_sweep_process(url, ns, sweepers, within))


async def _sweep_process(url: str, ns: str, sweepers: int, within: float) -> tuple[int, list[str]]:
    control = aioredis.Redis.from_url(url)
    index = KeySchema(ns).index(0)
    claimed: list[str] = []

    async def sweeper(n: int) -> None:
        client = await connect(url)
        try:
            # Each claim is acknowledged at once (as a user of sweep() does once it handled the
            # job), long before redeliver_after; a later sweep then drops its index entry.
            name = f"{os.getpid()}-{n}"
            s = Sweeper(client, namespace=ns, batch=16, name=name, redeliver_after=3.0)
            while True:
                for job in await s.sweep():
                    claimed.append(job.job_id)
                    await s.ack(job)
                if not await client.zcard(index) or await client.exists(f"{ns}:test:abort"):
                    return
                await asyncio.sleep(0.005)
        finally:
            await client.aclose()

    try:
        await control.incr(f"{ns}:test:ready")
        async with asyncio.timeout(within):
            while not await control.exists(f"{ns}:test:go"):
                if await control.exists(f"{ns}:test:abort"):  # the test failed before "go"
                    return os.getpid(), []
                await asyncio.sleep(0.002)
            async with asyncio.TaskGroup() as tg:
                for n in range(sweepers):
                    tg.create_task(sweeper(n))
    finally:
        await control.aclose()
    return os.getpid(), claimed


def main() -> None:
    mode, args = sys.argv[1], json.loads(sys.argv[2])
    runner = {"hold": hold, "frozen": frozen, "live": live}[mode]
    asyncio.run(runner(**args))


if __name__ == "__main__":
    main()
