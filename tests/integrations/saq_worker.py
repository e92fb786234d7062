"""A SAQ worker process for the tests: ``python -m tests.integrations.saq_worker URL QUEUE
NAMESPACE MODE SWEEP`` where MODE is ``jobpulse`` (instrumented, interval 0.25 s, ttl 1 s),
``jobpulse-slow-finish`` (the same, on a queue whose ``finish`` waits 0.5 s before it stores the
outcome, as over a slow link), ``jobpulse-threadbeats`` (instrumented with ``sidecar=False``) or
``plain``, and SWEEP the seconds between SAQ's sweeps (its abort
check runs every second).

Prints ``ready`` once the worker's first sweep has run. SAQ 0.26 moves a job to its active list
and marks it ACTIVE a few round trips later; a sweep in between takes it for stuck (status not
ACTIVE) and aborts it. Starting the tests' jobs right after a sweep keeps them out of that window
(SAQ's race, not the integration's). Every task INCRs ``<QUEUE>:runs:<job key>`` when it starts,
so the tests count executions."""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import time
from typing import Any

import redis
import redis.asyncio as aioredis
from saq import Queue, Worker
from saq.job import Job, Status
from saq.queue.redis import RedisQueue

import jobpulse
from jobpulse.integrations.saq import instrument

URL, QUEUE, NAMESPACE, MODE, SWEEP = sys.argv[1:6]


async def _count(ctx: dict[str, Any]) -> int:
    job = ctx["job"]
    return int(await job.get_queue().redis.incr(f"{QUEUE}:runs:{job.key}"))


async def progress(ctx: dict[str, Any], *, n: int) -> dict[str, Any]:
    """Advances n items, one every 50 ms; returns its own result."""
    await _count(ctx)
    hb = jobpulse.current()
    assert hb is not None
    hb.progress.set_total(n)
    hb.set_stage("crunch")
    for _ in range(n):
        await asyncio.sleep(0.05)
        hb.progress.advance()
    return {"items": n, "job": ctx["job"].key}


async def sleeper(ctx: dict[str, Any], *, seconds: float) -> str:
    """Runs for ``seconds`` without calling job.update() (a live job: the loop is free)."""
    await _count(ctx)
    await asyncio.sleep(seconds)
    return "slept"


async def resumable(ctx: dict[str, Any]) -> Any:
    """First attempt: checkpoint, then run until killed. A later attempt returns resume_from."""
    await _count(ctx)
    hb = jobpulse.current()
    assert hb is not None
    if hb.resume_from is not None:
        return {"resumed_from": hb.resume_from, "attempt": hb.attempt}
    await hb.checkpoint(step=5)
    await ctx["job"].get_queue().redis.set(f"{QUEUE}:checkpointed:{ctx['job'].key}", 1)
    await asyncio.sleep(60)
    return "not killed"


def threaded(ctx: dict[str, Any], *, n: int) -> int:
    """A plain ``def`` task: SAQ (and the integration) run it in a thread."""
    hb = jobpulse.current()
    assert hb is not None
    hb.progress.set_total(n)
    for _ in range(n):
        time.sleep(0.01)
        hb.progress.check()
        hb.progress.advance()
    return n


def _mark(ctx: dict[str, Any], what: str) -> None:
    """RPUSH ``what@<wall clock ms>`` to ``<QUEUE>:marks:<job key>`` (from a task's thread)."""
    with redis.Redis.from_url(URL) as r:
        r.rpush(f"{QUEUE}:marks:{ctx['job'].key}", f"{what}@{int(time.time() * 1000)}")


def orphan(ctx: dict[str, Any], *, seconds: float) -> str:
    """A plain ``def`` body that outlives its lease: once the job must stop it waits 0.5 s (more
    than one claim refresh may take), marks ``lost``, then goes on for ``seconds`` and marks
    ``ended``."""
    hb = jobpulse.current()
    assert hb is not None
    _mark(ctx, "start")
    while not hb.progress.cancelled:
        time.sleep(0.01)
    time.sleep(0.5)
    _mark(ctx, "lost")
    time.sleep(seconds)
    _mark(ctx, "ended")
    return "orphan"


def step(ctx: dict[str, Any], *, first: float, later: float) -> str:
    """A plain ``def`` body of one step (``first`` seconds on attempt 1, ``later`` after; no
    check() inside the step), then ``check()``; marks ``start`` and ``end``."""
    hb = jobpulse.current()
    assert hb is not None
    _mark(ctx, "start")
    time.sleep(first if hb.attempt == 1 else later)
    _mark(ctx, "end")
    hb.progress.check()
    return "stepped"


def gil_hold(ctx: dict[str, Any], *, seconds: int) -> str:
    """A plain ``def`` task (run in a thread): counts its run, sets ``<QUEUE>:holding:<job key>``
    to its pid, waits 1 s (the ``touched`` refresh has run), then holds the GIL for ``seconds`` in
    one C call (libc ``sleep`` through ``ctypes.PyDLL``, which keeps the GIL): the worker's loop
    stops too."""
    key = ctx["job"].key
    with redis.Redis.from_url(URL) as r:
        r.incr(f"{QUEUE}:runs:{key}")
        r.set(f"{QUEUE}:holding:{key}", os.getpid())
    time.sleep(1)
    ctypes.PyDLL(None).sleep(seconds)
    return "held"


async def probe(ctx: dict[str, Any]) -> str:
    """What ``jobpulse.current()`` is inside a task."""
    await _count(ctx)
    return "none" if jobpulse.current() is None else "heartbeat"


class SlowFinishQueue(RedisQueue):
    """A Redis queue whose ``finish`` stores the outcome 0.5 s late."""

    async def finish(self, job: Job, status: Status, **kwargs: Any) -> None:
        await asyncio.sleep(0.5)
        await super().finish(job, status, **kwargs)


async def _ready_after_first_sweep(queue: Queue) -> None:
    while not await queue.redis.exists(f"saq:{QUEUE}:sweep"):  # the sweep's lock key
        await asyncio.sleep(0.01)
    print("ready", flush=True)


async def main() -> None:
    settings: dict[str, Any] = {
        "queue": (
            SlowFinishQueue(aioredis.Redis.from_url(URL), name=QUEUE)
            if MODE == "jobpulse-slow-finish"
            else Queue.from_url(URL, name=QUEUE)
        ),
        "functions": [progress, sleeper, resumable, threaded, orphan, step, gil_hold, probe],
        "concurrency": 4,
        "timers": {"sweep": int(SWEEP), "abort": 1, "schedule": 1},
    }
    if MODE.startswith("jobpulse"):
        sidecar = MODE != "jobpulse-threadbeats"
        settings = instrument(
            settings, interval=0.25, ttl=1.0, namespace=NAMESPACE, sidecar=sidecar
        )
    worker = Worker(**settings)
    await worker.queue.connect()
    ready = asyncio.create_task(_ready_after_first_sweep(worker.queue))  # type: ignore[arg-type]
    await worker.start()
    await ready


if __name__ == "__main__":
    asyncio.run(main())
