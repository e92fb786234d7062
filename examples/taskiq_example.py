"""A taskiq task under a jobpulse heartbeat: live progress read back while taskiq runs it.

Needs ``pip install ".[taskiq]"`` (from the checkout; taskiq and taskiq-redis) and a Redis at
``REDIS_URL`` (default ``redis://localhost:6379/0``; ``redis-server`` or ``docker run -p
6379:6379 redis:7`` starts one). Run the commands from the checkout's root.

All in one process (a receiver in this script runs one task; its progress is printed)::

    python examples/taskiq_example.py

In production the worker is taskiq's own command, and tasks are sent from another process::

    taskiq worker examples.taskiq_example:broker    # shell 1: the worker (reads REDIS_URL)
    python examples/taskiq_example.py --send        # shell 2: sends a task, prints its id
    jobpulse watch TASK_ID                          # shell 2: its live progress bar
"""

from __future__ import annotations

import argparse
import asyncio
import os

import redis.asyncio as aioredis
from taskiq import AsyncBroker
from taskiq.api import run_receiver_task
from taskiq.kicker import AsyncKicker
from taskiq_redis import RedisAsyncResultBackend, RedisStreamBroker

import jobpulse
from jobpulse import JobState, StatusReader
from jobpulse.integrations.taskiq import instrument

URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
QUEUE = "jobpulse-example-taskiq"  # the worker and the senders must name the same stream


async def report(rows: int) -> dict[str, int]:
    """A long task: ``jobpulse.current()`` is its heartbeat (None when not instrumented)."""
    hb = jobpulse.current()
    if hb is not None:
        hb.progress.set_total(rows)
        hb.set_stage("aggregate")
    for _ in range(rows):
        await asyncio.sleep(0.05)  # the real work
        if hb is not None:
            hb.progress.advance()
    return {"rows": rows}


def make_broker(url: str) -> AsyncBroker:
    # idle_timeout can be short: a running task's stream entry is kept fresh by the integration
    stream = RedisStreamBroker(url, queue_name=QUEUE, idle_timeout=10_000)
    broker = instrument(
        stream.with_result_backend(
            RedisAsyncResultBackend(url, prefix_str=QUEUE, result_ex_time=600)
        )
    )
    broker.register_task(report, task_name="report")
    return broker


broker = make_broker(URL)  # what ``taskiq worker`` runs


async def send(rows: int) -> str:
    """Send one task; its taskiq task id is its jobpulse job id. The broker's startup makes
    the stream's consumer group, so the task waits there until a worker reads it."""
    await broker.startup()
    try:
        task = await AsyncKicker(task_name="report", broker=broker, labels={}).kiq(rows)
        return task.task_id
    finally:
        await broker.shutdown()


async def main(rows: int) -> None:
    broker.is_worker_process = True
    await broker.startup()
    receiver = asyncio.create_task(run_receiver_task(broker))
    task = await AsyncKicker(task_name="report", broker=broker, labels={}).kiq(rows)
    async with aioredis.Redis.from_url(URL) as client, StatusReader(client) as reader:
        while True:
            status = await reader.get(task.task_id)
            stage = status.stage or "-"
            print(f"{status.state.name:9} {stage:10} {status.done}/{status.total}", flush=True)
            if status.state in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED):
                break
            await asyncio.sleep(0.3)
    result = await task.wait_result(timeout=10)
    print("taskiq result:", result.return_value)
    receiver.cancel()
    await asyncio.gather(receiver, return_exceptions=True)
    await broker.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--send", action="store_true", help="only send a task; print its id")
    parser.add_argument("--rows", type=int, default=200, help="the task's size (0.05 s a row)")
    args = parser.parse_args()
    if args.send:
        print(asyncio.run(send(args.rows)))
    else:
        asyncio.run(main(args.rows))
