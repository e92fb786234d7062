"""A Celery task under a jobpulse heartbeat: live progress read back while a Celery worker runs it.

Needs ``pip install ".[celery]"`` (from the checkout) and a Redis at ``REDIS_URL`` (default
``redis://localhost:6379/0``; ``redis-server`` or ``docker run -p 6379:6379 redis:7`` starts one).
Run the commands from the checkout's root.

All in one go (this script starts a worker, the command below with the solo pool, in a child
process, sends a task and prints its progress)::

    python examples/celery_example.py

In production the worker is Celery's own command, and tasks are sent from another process::

    celery -A examples.celery_example worker        # shell 1: the worker (reads REDIS_URL)
    python examples/celery_example.py --send        # shell 2: sends a task, prints its id
    jobpulse watch TASK_ID                          # shell 2: its live progress bar
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import redis
from celery import Celery

import jobpulse
import jobpulse.sync
from jobpulse import JobState
from jobpulse.integrations.celery import instrument

URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
QUEUE = "jobpulse-example-celery"  # the worker and the senders must name the same queue

app = Celery("celery_example", broker=URL, backend=URL)
app.conf.update(task_acks_late=True, task_default_queue=QUEUE)
instrument(app)  # every task below runs under jobpulse.sync.heartbeat(..., kind=<task name>)


@app.task(name="report")
def report(rows: int) -> dict[str, int]:
    """A long task: ``jobpulse.current()`` is its heartbeat (None when not instrumented)."""
    hb = jobpulse.current()
    if hb is not None:
        hb.progress.set_total(rows)
        hb.set_stage("aggregate")
    for _ in range(rows):
        if hb is not None:
            hb.check()  # stops here after jobpulse.sync.request_cancel
        time.sleep(0.05)  # the real work
        if hb is not None:
            hb.progress.advance()
    return {"rows": rows}


def main(rows: int) -> None:
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "examples.celery_example", "--quiet", "worker",
         "-P", "solo", "--loglevel", "WARNING"],
        cwd=Path(__file__).resolve().parent.parent,
    )  # fmt: skip
    try:
        result = report.delay(rows)  # the Celery task id is the jobpulse job id
        reader = jobpulse.sync.StatusReader(redis.Redis.from_url(URL))
        while True:
            status = reader.get(result.id)
            stage = status.stage or "-"
            print(f"{status.state.name:9} {stage:10} {status.done}/{status.total}", flush=True)
            if status.state in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED):
                break
            time.sleep(0.3)
        print("celery result:", result.get(timeout=10))
    finally:
        worker.terminate()
        worker.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--send", action="store_true", help="only send a task; print its id")
    parser.add_argument("--rows", type=int, default=200, help="the task's size (0.05 s a row)")
    args = parser.parse_args()
    if args.send:
        print(report.delay(args.rows).id)
    else:
        main(args.rows)
