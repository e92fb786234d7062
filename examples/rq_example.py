"""An RQ job under a jobpulse heartbeat: live progress read back while an RQ worker runs it.

Needs ``pip install ".[rq]"`` (from the checkout) and a Redis at ``REDIS_URL`` (default
``redis://localhost:6379/0``; ``redis-server`` or ``docker run -p 6379:6379 redis:7`` starts one).
Run the commands from the checkout's root.

All in one go (this script sends a job, starts a burst worker, the command below, in a child
process, and prints the job's progress)::

    python examples/rq_example.py

In production the worker is RQ's own command, and jobs are sent from another process::

    rq worker -u "$REDIS_URL" -w examples.rq_example.JobpulseWorker jobpulse-example-rq  # shell 1
    python examples/rq_example.py --send            # shell 2: sends a job, prints its id
    jobpulse watch JOB_ID                           # shell 2: its live progress bar
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import redis
from rq import Queue

import jobpulse
import jobpulse.sync
from jobpulse import JobState
from jobpulse.integrations.rq import worker_class

URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
QUEUE = "jobpulse-example-rq"  # the worker and the senders must name the same queue

JobpulseWorker = worker_class()  # every job runs under jobpulse.sync.heartbeat(...)


def report(rows: int) -> dict[str, int]:
    """A long job: ``jobpulse.current()`` is its heartbeat (None under a plain worker)."""
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


def send(connection: redis.Redis, rows: int) -> str:
    """Enqueue one job; its RQ job id is its jobpulse job id."""
    return Queue(QUEUE, connection=connection).enqueue("examples.rq_example.report", rows).id


def main(rows: int) -> None:
    connection = redis.Redis.from_url(URL)
    job_id = send(connection, rows)
    worker = subprocess.Popen(
        [sys.executable, "-m", "rq.cli", "worker", "--burst", "-u", URL,
         "-w", "examples.rq_example.JobpulseWorker", QUEUE],
        cwd=Path(__file__).resolve().parent.parent,
    )  # fmt: skip
    try:
        reader = jobpulse.sync.StatusReader(connection)
        while True:
            status = reader.get(job_id)
            stage = status.stage or "-"
            print(f"{status.state.name:9} {stage:10} {status.done}/{status.total}", flush=True)
            if status.state in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED):
                break
            time.sleep(0.3)
        worker.wait(timeout=30)
        job = Queue(QUEUE, connection=connection).fetch_job(job_id)
        print("rq result:", job.return_value() if job is not None else None)
    finally:
        if worker.poll() is None:
            worker.terminate()
            worker.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--send", action="store_true", help="only send a job; print its id")
    parser.add_argument("--rows", type=int, default=200, help="the job's size (0.05 s a row)")
    args = parser.parse_args()
    if args.send:
        print(send(redis.Redis.from_url(URL), args.rows))
    else:
        main(args.rows)
