"""A SAQ job under a jobpulse heartbeat: live progress read back while SAQ runs it.

    python examples/saq_example.py [--redis URL]

Needs ``pip install "jobpulse[saq]"``. Uses the Redis at ``--redis`` / ``REDIS_URL`` when one
answers, else starts a private ``redis-server`` for the run. The worker runs in this process; in
production it is ``saq examples.saq_example.settings``.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
from typing import Any

from saq import Queue, Worker
from saq.job import Status

import jobpulse
from jobpulse import JobState, StatusReader
from jobpulse._provision import provision_redis
from jobpulse.integrations.saq import instrument


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


def make_settings(url: str) -> dict[str, Any]:
    queue = Queue.from_url(url, name=f"jobpulse-example-{secrets.token_hex(4)}")
    return instrument({"queue": queue, "functions": [report]})  # every function: a heartbeat


async def main(url: str) -> None:
    settings = make_settings(url)
    queue: Queue = settings["queue"]
    worker = Worker(**settings)
    running = asyncio.create_task(worker.start())
    # timeout=0: no run-time limit; heartbeat=10: swept 10 s after its worker died
    job = await queue.enqueue("report", rows=40, timeout=0, heartbeat=10)
    assert job is not None
    reader = StatusReader(queue.redis)
    while True:
        status = await reader.get(job.id)  # the SAQ job id is the jobpulse job id
        stage = status.stage or "-"
        print(f"{status.state.name:9} {stage:10} {status.done}/{status.total}", flush=True)
        if status.state in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED):
            break
        await asyncio.sleep(0.3)
    await job.refresh()
    assert job.status is Status.COMPLETE
    print("SAQ result:", job.result)
    await worker.stop()
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    await queue.disconnect()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default=None)
    args = parser.parse_args()
    with provision_redis(args.redis) as (url, how):
        print(f"Redis: {url} ({how})")
        asyncio.run(main(url))
