"""An arq job under a jobpulse heartbeat: live progress read back while arq runs it.

    python examples/arq_example.py [--redis URL]

Needs ``pip install "jobpulse[arq]"``. Uses the Redis at ``--redis`` / ``REDIS_URL`` when one
answers, else starts a private ``redis-server`` for the run. The worker runs in this process
(``burst=True``: it stops when the queue is empty); in production it is ``arq
examples.arq_example.WorkerSettings``.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
from typing import Any

from arq.connections import RedisSettings, create_pool
from arq.worker import create_worker

import jobpulse
from jobpulse import JobState, StatusReader
from jobpulse._provision import provision_redis
from jobpulse.integrations.arq import instrument


async def report(ctx: dict[str, Any], rows: int) -> dict[str, int]:
    """A long job: ``jobpulse.current()`` is its heartbeat (None when not instrumented)."""
    hb = jobpulse.current()
    if hb is not None:
        hb.progress.set_total(rows)
        hb.set_stage("aggregate")
    for _ in range(rows):
        await asyncio.sleep(0.05)  # the real work
        if hb is not None:
            hb.progress.advance()
    return {"rows": rows}


@instrument  # every function below runs under heartbeat(..., kind="report")
class WorkerSettings:
    functions = [report]  # noqa: RUF012 (arq reads class attributes)
    queue_name = f"jobpulse-example-{secrets.token_hex(4)}"


async def main(url: str) -> None:
    pool = await create_pool(
        RedisSettings.from_dsn(url), default_queue_name=WorkerSettings.queue_name
    )
    job = await pool.enqueue_job("report", 40)
    assert job is not None
    worker = create_worker(WorkerSettings, redis_settings=RedisSettings.from_dsn(url), burst=True)  # type: ignore[arg-type]
    running = asyncio.create_task(worker.async_run())
    reader = StatusReader(pool)
    while True:
        status = await reader.get(job.job_id)  # the arq job id is the jobpulse job id
        stage = status.stage or "-"
        print(f"{status.state.name:9} {stage:10} {status.done}/{status.total}", flush=True)
        if status.state in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED):
            break
        await asyncio.sleep(0.3)
    print("arq result:", await job.result(timeout=10))
    await running
    await worker.close()
    await pool.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default=None)
    args = parser.parse_args()
    with provision_redis(args.redis) as (url, how):
        print(f"Redis: {url} ({how})")
        asyncio.run(main(url))
