"""An arq worker process for the tests: ``python -m tests.integrations.arq_worker URL QUEUE
NAMESPACE MODE FUNCTION`` where MODE is ``jobpulse`` (instrumented, interval 0.25 s, ttl 1 s),
``jobpulse-slow-finish`` (the same, with an ``on_job_end`` hook that takes 0.5 s: arq stores the
result after it) or ``plain``, and FUNCTION the one task it runs (arq 0.25 cannot take
``job_timeout=None`` with more than one function: it compares their None timeouts). Prints
``ready`` once the worker starts; every task INCRs ``<QUEUE>:runs:<job id>`` when it starts, so
the tests count executions."""

from __future__ import annotations

import asyncio
import sys
from typing import Any, ClassVar

from arq.connections import RedisSettings
from arq.worker import run_worker

import jobpulse
from jobpulse.integrations.arq import instrument

URL, QUEUE, NAMESPACE, MODE, FUNCTION = sys.argv[1:6]


async def _count(ctx: dict[str, Any]) -> int:
    return int(await ctx["redis"].incr(f"{QUEUE}:runs:{ctx['job_id']}"))


async def progress(ctx: dict[str, Any], n: int) -> dict[str, int]:
    """Advances n items, one every 50 ms; returns its own result."""
    await _count(ctx)
    hb = jobpulse.current()
    assert hb is not None
    hb.progress.set_total(n)
    hb.set_stage("crunch")
    for _ in range(n):
        await asyncio.sleep(0.05)
        hb.progress.advance()
    return {"items": n, "job": ctx["job_id"]}


async def sleeper(ctx: dict[str, Any], seconds: float) -> str:
    """Runs for ``seconds`` (a live job: the loop is free)."""
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
    await ctx["redis"].set(f"{QUEUE}:checkpointed:{ctx['job_id']}", 1)
    await asyncio.sleep(60)
    return "not killed"


async def probe(ctx: dict[str, Any]) -> str:
    """What ``jobpulse.current()`` is inside a task."""
    await _count(ctx)
    return "none" if jobpulse.current() is None else "heartbeat"


async def _ready(ctx: dict[str, Any]) -> None:
    print("ready", flush=True)


class WorkerSettings:
    functions: ClassVar[list[Any]] = [globals()[FUNCTION]]
    redis_settings = RedisSettings.from_dsn(URL)
    queue_name = QUEUE
    job_timeout = None  # arq's in-progress key then lives 10 s: the shortest arq allows
    poll_delay = 0.1
    max_tries = 3
    on_startup = _ready


async def _slow(ctx: dict[str, Any]) -> None:
    await asyncio.sleep(0.5)


if MODE == "jobpulse-slow-finish":
    WorkerSettings.on_job_end = _slow  # type: ignore[attr-defined]
if MODE.startswith("jobpulse"):
    instrument(WorkerSettings, interval=0.25, ttl=1.0, namespace=NAMESPACE)
else:
    WorkerSettings.allow_abort_jobs = True  # type: ignore[attr-defined]

if __name__ == "__main__":
    run_worker(WorkerSettings)  # type: ignore[arg-type]
