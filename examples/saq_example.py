"""A SAQ job under a jobpulse heartbeat: live progress read back while SAQ runs it.

Needs ``pip install ".[saq]"`` (from the checkout) and a Redis at ``REDIS_URL`` (default
``redis://localhost:6379/0``; ``redis-server`` or ``docker run -p 6379:6379 redis:7`` starts one).
Run the commands from the checkout's root.

All in one process (a worker in this script runs one job; its progress is printed)::

    python examples/saq_example.py

In production the worker is SAQ's own command, and jobs are sent from another process::

    saq examples.saq_example.settings               # shell 1: the worker (reads REDIS_URL)
    python examples/saq_example.py --send           # shell 2: sends a job, prints its id
    jobpulse watch JOB_ID                           # shell 2: its live progress bar
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from saq import Queue, Worker

import jobpulse
from jobpulse import JobState, StatusReader
from jobpulse.integrations.saq import instrument

URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
QUEUE = "jobpulse-example-saq"  # the worker and the senders must name the same queue


async def report(ctx: dict[str, Any], *, rows: int) -> dict[str, int]:
    """A long job: ``jobpulse.current()`` is its heartbeat (None when not instrumented)."""
    hb = jobpulse.current()
    if hb is not None:
        hb.progress.set_total(rows)
        hb.set_stage("aggregate")
    for _ in range(rows):
        await asyncio.sleep(0.05)  # the real work; no job.update() needed to stay alive
        if hb is not None:
            hb.progress.advance()
    return {"rows": rows}


def settings() -> dict[str, Any]:
    """The worker's settings (SAQ calls it): every function runs under a heartbeat."""
    return instrument({"queue": Queue.from_url(URL, name=QUEUE), "functions": [report]})


async def send(queue: Queue, rows: int) -> str:
    """Enqueue one job; its SAQ job id is its jobpulse job id."""
    # timeout=0: no run-time limit; heartbeat=10: swept 10 s after its worker died
    job = await queue.enqueue("report", rows=rows, timeout=0, heartbeat=10)
    assert job is not None
    return job.id


async def send_one(rows: int) -> str:
    queue = Queue.from_url(URL, name=QUEUE)
    try:
        return await send(queue, rows)
    finally:
        await queue.disconnect()


async def main(rows: int) -> None:
    config = settings()
    queue: Queue = config["queue"]
    worker = Worker(**config)
    running = asyncio.create_task(worker.start())
    job_id = await send(queue, rows)
    async with StatusReader(queue.redis) as reader:
        while True:
            status = await reader.get(job_id)
            stage = status.stage or "-"
            print(f"{status.state.name:9} {stage:10} {status.done}/{status.total}", flush=True)
            if status.state in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED):
                break
            await asyncio.sleep(0.3)
    await worker.stop()
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    await queue.disconnect()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--send", action="store_true", help="only send a job; print its id")
    parser.add_argument("--rows", type=int, default=200, help="the job's size (0.05 s a row)")
    args = parser.parse_args()
    if args.send:
        print(asyncio.run(send_one(args.rows)))
    else:
        asyncio.run(main(args.rows))
