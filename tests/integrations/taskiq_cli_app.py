"""A taskiq app run by the taskiq CLI in the tests: ``taskiq worker
tests.integrations.taskiq_cli_app:broker`` with ``JOBPULSE_TEST_URL``, ``JOBPULSE_TEST_QUEUE`` and
``JOBPULSE_TEST_NS`` in the environment (more tasks in ``taskiq_cli_tasks``). The broker is
instrumented (interval 0.25 s, ttl 1 s); its tasks are plain ``def`` functions, which taskiq runs
in a thread, and one ``async def``. Every task INCRs the counter key it is given when it starts,
so the tests count executions."""

from __future__ import annotations

import asyncio
import os
import time

import redis
from taskiq_redis import RedisAsyncResultBackend, RedisStreamBroker

import jobpulse
from jobpulse.integrations.taskiq import instrument

URL = os.environ["JOBPULSE_TEST_URL"]
QUEUE = os.environ["JOBPULSE_TEST_QUEUE"]
NAMESPACE = os.environ["JOBPULSE_TEST_NS"]

broker = instrument(
    RedisStreamBroker(
        URL, queue_name=QUEUE, idle_timeout=60_000, xread_block=200
    ).with_result_backend(RedisAsyncResultBackend(URL, prefix_str=QUEUE, result_ex_time=600)),
    interval=0.25,
    ttl=1.0,
    namespace=NAMESPACE,
)

_blocking = redis.Redis.from_url(URL)  # for the sync tasks (they run in a thread)


@broker.task(task_name="sync_progress")
def sync_progress(counter: str, n: int) -> dict[str, object]:
    """A plain ``def``: advances n items, one every 50 ms, from taskiq's thread."""
    _blocking.incr(counter)
    hb = jobpulse.current()
    assert hb is not None, "jobpulse.current() is None in a sync taskiq task"
    hb.progress.set_total(n)
    hb.set_stage("crunch")
    for _ in range(n):
        time.sleep(0.05)
        hb.progress.advance()
    return {"items": n, "job_id": hb.job_id}


@broker.task(task_name="sync_until_cancelled")
def sync_until_cancelled(counter: str, marker: str) -> str:
    """A plain ``def`` that runs until the job is cancelled (``progress.check()`` raises)."""
    _blocking.incr(counter)
    hb = jobpulse.current()
    assert hb is not None
    while True:
        hb.progress.check()
        hb.progress.advance()
        _blocking.set(marker, hb.progress.done)
        time.sleep(0.05)


@broker.task(task_name="async_progress")
async def async_progress(counter: str, n: int) -> dict[str, int]:
    """An ``async def`` beside them, run by the same CLI worker."""
    _blocking.incr(counter)
    hb = jobpulse.current()
    assert hb is not None
    hb.progress.set_total(n)
    for _ in range(n):
        await asyncio.sleep(0.02)
        hb.progress.advance()
    return {"items": n}
