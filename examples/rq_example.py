"""An RQ job under a jobpulse heartbeat: live progress read back while an RQ worker runs it.

    python examples/rq_example.py [--redis URL]

Needs ``pip install "jobpulse[rq]"``. Uses the Redis at ``--redis`` / ``REDIS_URL`` when one
answers, else starts a private ``redis-server`` for the run. The worker (``rq worker -w
examples.rq_example.JobpulseWorker``, in burst mode) runs in a child process of this script.
"""

from __future__ import annotations

import argparse
import secrets
import subprocess
import sys
import time
from pathlib import Path

import redis
from rq import Queue

import jobpulse
import jobpulse.sync
from jobpulse import JobState
from jobpulse._provision import provision_redis
from jobpulse.integrations.rq import worker_class

JobpulseWorker = worker_class()  # every job runs under jobpulse.sync.heartbeat(...)


def report(rows: int) -> dict[str, int]:
    """A long job: ``jobpulse.current()`` is its heartbeat (None under a plain worker)."""
    hb = jobpulse.current()
    if hb is not None:
        hb.progress.set_total(rows)
        hb.set_stage("aggregate")
    for _ in range(rows):
        if hb is not None:
            hb.check()  # stops here after jobpulse.request_cancel
        time.sleep(0.05)  # the real work
        if hb is not None:
            hb.progress.advance()
    return {"rows": rows}


def main(url: str) -> None:
    connection = redis.Redis.from_url(url)
    queue = Queue(f"jobpulse-example-{secrets.token_hex(4)}", connection=connection)
    job = queue.enqueue("examples.rq_example.report", 40)
    root = Path(__file__).resolve().parent.parent
    worker = subprocess.Popen(
        [sys.executable, "-m", "rq.cli", "worker", "--burst", "-u", url,
         "-w", "examples.rq_example.JobpulseWorker", queue.name],
        cwd=root,
    )  # fmt: skip
    try:
        reader = jobpulse.sync.StatusReader(connection)
        while True:
            status = reader.get(job.id)  # the RQ job id is the jobpulse job id
            stage = status.stage or "-"
            print(f"{status.state.name:9} {stage:10} {status.done}/{status.total}", flush=True)
            if status.state in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED):
                break
            time.sleep(0.3)
        worker.wait(timeout=30)
        print("rq result:", job.return_value())
    finally:
        if worker.poll() is None:
            worker.terminate()
            worker.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default=None)
    args = parser.parse_args()
    with provision_redis(args.redis) as (url, how):
        print(f"Redis: {url} ({how})")
        main(url)
