"""A taskiq task under a jobpulse heartbeat: live progress read back while taskiq runs it.

    python examples/taskiq_example.py [--redis URL]

Needs ``pip install "jobpulse[taskiq]"`` (taskiq and taskiq-redis). Uses the Redis at
``--redis`` / ``REDIS_URL`` when one answers, else starts a private ``redis-server`` for the run.
The receiver runs in this process; in production it is ``taskiq worker
examples.taskiq_example:broker``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets

import redis.asyncio as aioredis
from taskiq import AsyncBroker
from taskiq.api import run_receiver_task
from taskiq.kicker import AsyncKicker
from taskiq_redis import RedisAsyncResultBackend, RedisStreamBroker

import jobpulse
from jobpulse import JobState, StatusReader
from jobpulse._provision import provision_redis
from jobpulse.integrations.taskiq import instrument

QUEUE = f"jobpulse-example-{secrets.token_hex(4)}"


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


broker = make_broker(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))  # for the CLI


async def main(url: str) -> None:
    broker = make_broker(url)
    broker.is_worker_process = True
    await broker.startup()
    receiver = asyncio.create_task(run_receiver_task(broker))
    task = await AsyncKicker(task_name="report", broker=broker, labels={}).kiq(40)
    client = aioredis.Redis.from_url(url)
    reader = StatusReader(client)
    while True:
        status = await reader.get(task.task_id)  # the taskiq task id is the jobpulse job id
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
    await client.delete(QUEUE)  # the example's stream
    await client.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default=None)
    args = parser.parse_args()
    with provision_redis(args.redis) as (url, how):
        print(f"Redis: {url} ({how})")
        asyncio.run(main(url))
