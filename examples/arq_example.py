"""An arq job under a jobpulse heartbeat: live progress read back while arq runs it.

Needs ``pip install ".[arq]"`` (from the checkout) and a Redis at ``REDIS_URL`` (default
``redis://localhost:6379/0``; ``redis-server`` or ``docker run -p 6379:6379 redis:7`` starts one).
Run the commands from the checkout's root.

All in one process (a burst worker in this script runs one job; its progress is printed)::

    python examples/arq_example.py

In production the worker is arq's own command, and jobs are sent from another process::

    arq examples.arq_example.WorkerSettings         # shell 1: the worker (reads REDIS_URL)
    python examples/arq_example.py --send           # shell 2: sends a job, prints its id
    jobpulse watch JOB_ID                           # shell 2: its live progress bar
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from arq.connections import RedisSettings, create_pool
from arq.worker import create_worker

import jobpulse
from jobpulse import JobState, StatusReader
from jobpulse.integrations.arq import instrument

URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
QUEUE = "jobpulse-example:arq"  # the worker and the senders must name the same queue


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
    queue_name = QUEUE
    redis_settings = RedisSettings.from_dsn(URL)


async def send(rows: int) -> str:
    """Enqueue one job; its arq job id is its jobpulse job id."""
    pool = await create_pool(WorkerSettings.redis_settings, default_queue_name=QUEUE)
    try:
        job = await pool.enqueue_job("report", rows)
        assert job is not None
        return job.job_id
    finally:
        await pool.aclose()


async def main(rows: int) -> None:
    job_id = await send(rows)
    pool = await create_pool(WorkerSettings.redis_settings, default_queue_name=QUEUE)
    worker = create_worker(WorkerSettings, redis_pool=pool, burst=True)  # type: ignore[arg-type]
    running = asyncio.create_task(worker.async_run())
    async with StatusReader(pool) as reader:
        while True:
            status = await reader.get(job_id)
            stage = status.stage or "-"
            print(f"{status.state.name:9} {stage:10} {status.done}/{status.total}", flush=True)
            if status.state in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED):
                break
            await asyncio.sleep(0.3)
    await running
    await worker.close()
    await pool.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--send", action="store_true", help="only send a job; print its id")
    parser.add_argument("--rows", type=int, default=200, help="the job's size (0.05 s a row)")
    args = parser.parse_args()
    if args.send:
        print(asyncio.run(send(args.rows)))
    else:
        asyncio.run(main(args.rows))
