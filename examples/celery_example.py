"""A Celery task under a jobpulse heartbeat: live progress read back while a Celery worker runs it.

    python examples/celery_example.py [--redis URL]

Needs ``pip install "jobpulse[celery]"``. Uses the Redis at ``--redis`` / ``REDIS_URL`` when one
answers, else starts a private ``redis-server`` for the run. A worker (``celery -A
examples.celery_example worker``, solo pool) runs in a child process of this script.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import redis
from celery import Celery

import jobpulse
import jobpulse.sync
from jobpulse import JobState
from jobpulse._provision import provision_redis
from jobpulse.integrations.celery import instrument

URL = os.environ.get("JOBPULSE_EXAMPLE_URL", "redis://127.0.0.1:6379/0")
QUEUE = os.environ.get("JOBPULSE_EXAMPLE_QUEUE", "jobpulse-example")

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
            hb.check()  # stops here after jobpulse.request_cancel
        time.sleep(0.05)  # the real work
        if hb is not None:
            hb.progress.advance()
    return {"rows": rows}


def main(url: str) -> None:
    queue = f"jobpulse-example-{secrets.token_hex(4)}"
    env = {**os.environ, "JOBPULSE_EXAMPLE_URL": url, "JOBPULSE_EXAMPLE_QUEUE": queue}
    root = Path(__file__).resolve().parent.parent
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "examples.celery_example", "--quiet", "worker",
         "-P", "solo", "-Q", queue, "--loglevel", "WARNING"],
        cwd=root, env=env,
    )  # fmt: skip
    try:
        app.conf.update(broker_url=url, result_backend=url, task_default_queue=queue)
        result = report.delay(40)
        reader = jobpulse.sync.StatusReader(redis.Redis.from_url(url))
        while True:
            status = reader.get(result.id)  # the Celery task id is the jobpulse job id
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
    parser.add_argument("--redis", default=None)
    args = parser.parse_args()
    with provision_redis(args.redis) as (url, how):
        print(f"Redis: {url} ({how})")
        main(url)
