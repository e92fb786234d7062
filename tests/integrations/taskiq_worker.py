"""A taskiq worker process for the tests: ``python -m tests.integrations.taskiq_worker URL QUEUE
NAMESPACE MODE IDLE_MS [MAX_TASKS]`` where MODE is ``jobpulse`` (instrumented, interval 0.25 s, ttl
1 s), ``jobpulse-slow-finish`` (the same, with a result backend that saves 0.5 s late),
``jobpulse-threadbeats`` (instrumented with ``sidecar=False``) or ``plain``, on a taskiq-redis
``RedisStreamBroker`` of stream QUEUE whose ``idle_timeout`` is IDLE_MS, running at most MAX_TASKS
tasks at once (taskiq's default, 100, when not given; the broker's read-ahead, ``xread_count``,
stays at its default). Prints ``ready`` once its consumer group exists. Every task INCRs the
counter key it is given when it starts, so the tests count executions, and every delivery of a task
INCRs ``NAMESPACE:deliveries:<task id>`` before it runs (a middleware's ``pre_execute``)."""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import time
from typing import Any

import redis
import redis.asyncio as aioredis
from taskiq import TaskiqMessage, TaskiqMiddleware, TaskiqResult
from taskiq.api import run_receiver_task
from taskiq_redis import RedisAsyncResultBackend, RedisStreamBroker

import jobpulse
from jobpulse.integrations.taskiq import instrument

URL, QUEUE, NAMESPACE, MODE, IDLE_MS = sys.argv[1:6]
MAX_TASKS = int(sys.argv[6]) if len(sys.argv) > 6 else 100


class SlowResultBackend(RedisAsyncResultBackend[Any]):
    """Saves each result 0.5 s late."""

    async def set_result(self, task_id: str, result: TaskiqResult[Any]) -> None:
        await asyncio.sleep(0.5)
        await super().set_result(task_id, result)


backend = SlowResultBackend if MODE == "jobpulse-slow-finish" else RedisAsyncResultBackend
broker = RedisStreamBroker(
    URL, queue_name=QUEUE, idle_timeout=int(IDLE_MS), xread_block=200
).with_result_backend(backend(URL, prefix_str=QUEUE, result_ex_time=600))


class Deliveries(TaskiqMiddleware):
    """Counts the deliveries of each task id (a redelivery counts, whether or not it runs)."""

    async def pre_execute(self, message: TaskiqMessage) -> TaskiqMessage:
        await _count(f"{NAMESPACE}:deliveries:{message.task_id}")
        return message


broker.add_middlewares(Deliveries())
if MODE.startswith("jobpulse"):
    sidecar = MODE != "jobpulse-threadbeats"
    instrument(broker, interval=0.25, ttl=1.0, namespace=NAMESPACE, sidecar=sidecar)

_counter: list[aioredis.Redis] = []


async def _count(key: str) -> None:
    if not _counter:
        _counter.append(aioredis.Redis.from_url(URL))
    await _counter[0].incr(key)


@broker.task(task_name="progress")
async def progress(counter: str, n: int) -> dict[str, int]:
    """Advances n items, one every 50 ms; returns its own result."""
    await _count(counter)
    hb = jobpulse.current()
    assert hb is not None
    hb.progress.set_total(n)
    hb.set_stage("crunch")
    for _ in range(n):
        await asyncio.sleep(0.05)
        hb.progress.advance()
    return {"items": n}


@broker.task(task_name="sleeper")
async def sleeper(counter: str, seconds: float) -> str:
    """Runs for ``seconds`` (a live task: the loop is free)."""
    await _count(counter)
    await asyncio.sleep(seconds)
    return "slept"


@broker.task(task_name="gated")
async def gated(counter: str, gate: str, after: float) -> str:
    """Runs until the key ``gate`` exists, then ``after`` seconds more."""
    await _count(counter)
    while not await _counter[0].exists(gate):
        await asyncio.sleep(0.02)
    await asyncio.sleep(after)
    return "opened"


@broker.task(task_name="orphan")
def orphan(counter: str, lost: str, ended: str, seconds: float) -> str:
    """A plain ``def`` body that outlives its lease: once the job must stop it sets ``lost``,
    goes on for ``seconds``, then sets ``ended``."""
    hb = jobpulse.current()
    assert hb is not None
    with redis.Redis.from_url(URL) as r:
        r.incr(counter)
        while not hb.progress.cancelled:
            time.sleep(0.01)
        r.set(lost, 1)
        time.sleep(seconds)
        r.set(ended, 1)
    return "orphan"


@broker.task(task_name="gil_hold")
def gil_hold(counter: str, holding: str, seconds: int) -> str:
    """A plain ``def`` task (taskiq runs it in a thread): sets ``holding`` to its pid, waits 1 s
    (the entry's refresh has run), then holds the GIL for ``seconds`` in one C call (libc
    ``sleep`` through ``ctypes.PyDLL``, which keeps the GIL): the worker's loop stops too."""
    with redis.Redis.from_url(URL) as r:
        r.incr(counter)
        r.set(holding, os.getpid())
    time.sleep(1)
    ctypes.PyDLL(None).sleep(seconds)
    return "held"


@broker.task(task_name="resumable")
async def resumable(counter: str, marker: str) -> Any:
    """First attempt: checkpoint, then run until killed. A later attempt returns resume_from."""
    await _count(counter)
    hb = jobpulse.current()
    assert hb is not None
    if hb.resume_from is not None:
        return {"resumed_from": hb.resume_from, "attempt": hb.attempt}
    await hb.checkpoint(step=5)
    await _counter[0].set(marker, 1)
    await asyncio.sleep(60)
    return "not killed"


@broker.task(task_name="probe")
async def probe(counter: str) -> str:
    """What ``jobpulse.current()`` is inside a task."""
    await _count(counter)
    return "none" if jobpulse.current() is None else "heartbeat"


async def main() -> None:
    broker.is_worker_process = True
    await broker.startup()
    print("ready", flush=True)
    await run_receiver_task(broker, run_startup=False, max_async_tasks=MAX_TASKS)


if __name__ == "__main__":
    asyncio.run(main())
