"""A Dramatiq actor under a jobpulse heartbeat: live progress read back while a worker runs it.

    python examples/dramatiq_example.py [--redis URL]

Needs ``pip install "jobpulse[dramatiq]"``. Uses the Redis at ``--redis`` / ``REDIS_URL`` when one
answers, else starts a private ``redis-server`` for the run. The worker (``dramatiq.Worker``, the
class the ``dramatiq`` command runs) runs in this process; in production it is ``dramatiq
examples.dramatiq_example``.
"""

from __future__ import annotations

import argparse
import secrets
import time

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

import jobpulse
import jobpulse.sync
from jobpulse import JobState
from jobpulse._provision import provision_redis
from jobpulse.integrations.dramatiq import instrument


def report(rows: int) -> None:
    """A long actor: ``jobpulse.current()`` is its heartbeat (None when not instrumented)."""
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


def main(url: str) -> None:
    broker = RedisBroker(url=url, namespace=f"jobpulse-example-{secrets.token_hex(4)}")
    instrument(broker)  # every actor runs under jobpulse.sync.heartbeat(..., kind=<actor name>)
    dramatiq.set_broker(broker)
    actor = dramatiq.actor(report, broker=broker)
    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        message = actor.send(40)
        reader = jobpulse.sync.StatusReader(redis.Redis.from_url(url))
        while True:
            status = reader.get(message.message_id)  # the message id is the jobpulse job id
            stage = status.stage or "-"
            print(f"{status.state.name:9} {stage:10} {status.done}/{status.total}", flush=True)
            if status.state in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED):
                break
            time.sleep(0.3)
    finally:
        worker.stop()
        broker.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default=None)
    args = parser.parse_args()
    with provision_redis(args.redis) as (url, how):
        print(f"Redis: {url} ({how})")
        main(url)
