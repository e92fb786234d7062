"""A Dramatiq actor under a jobpulse heartbeat: live progress read back while a worker runs it.

Needs ``pip install ".[dramatiq]"`` (from the checkout) and a Redis at ``REDIS_URL`` (default
``redis://localhost:6379/0``; ``redis-server`` or ``docker run -p 6379:6379 redis:7`` starts one).
Run the commands from the checkout's root.

All in one process (a ``dramatiq.Worker``, the class the ``dramatiq`` command runs, in this
script runs one message; its progress is printed)::

    python examples/dramatiq_example.py

In production the worker is Dramatiq's own command, and messages are sent from another process::

    dramatiq examples.dramatiq_example              # shell 1: the worker (reads REDIS_URL)
    python examples/dramatiq_example.py --send      # shell 2: sends a message, prints its id
    jobpulse watch MESSAGE_ID                       # shell 2: its live progress bar
"""

from __future__ import annotations

import argparse
import os
import time

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

import jobpulse
import jobpulse.sync
from jobpulse import JobState
from jobpulse.integrations.dramatiq import instrument

URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
NAMESPACE = "jobpulse-example-dramatiq"  # the worker and the senders must name the same

broker = RedisBroker(url=URL, namespace=NAMESPACE)
broker.add_middleware(Results(backend=RedisBackend(url=URL, namespace=NAMESPACE)))
instrument(broker)  # every actor runs under jobpulse.sync.heartbeat(..., kind=<actor name>)
dramatiq.set_broker(broker)


@dramatiq.actor(store_results=True)  # store_results: the Results middleware above
def report(rows: int) -> dict[str, int]:
    """A long actor: ``jobpulse.current()`` is its heartbeat (None when not instrumented)."""
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
    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        message = report.send(rows)  # the message id is the jobpulse job id
        reader = jobpulse.sync.StatusReader(redis.Redis.from_url(URL))
        while True:
            status = reader.get(message.message_id)
            stage = status.stage or "-"
            print(f"{status.state.name:9} {stage:10} {status.done}/{status.total}", flush=True)
            if status.state in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED):
                break
            time.sleep(0.3)
        print("dramatiq result:", message.get_result(block=True, timeout=10_000))
    finally:
        worker.stop()
        broker.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--send", action="store_true", help="only send a message; print its id")
    parser.add_argument("--rows", type=int, default=200, help="the job's size (0.05 s a row)")
    args = parser.parse_args()
    if args.send:
        print(report.send(args.rows).message_id)
    else:
        main(args.rows)
