"""An RQ worker process for the tests: ``python -m tests.integrations.rq_worker URL NAMESPACE
MODE`` where MODE is ``jobpulse`` (``worker_class(interval=0.25, ttl=1.0)``: a StartedJobRegistry
TTL of 3 s), ``threadbeats`` (the same with ``sidecar=False``) or ``plain`` (RQ's ``Worker``
with the same 3 s registry TTL: the stall threshold set short), on the queue ``NAMESPACE-q``
with maintenance every 1 s (``worker_ttl=16``: an idle worker
waits 1 s per BLPOP and runs maintenance between them). Prints ``ready`` before it works. Every
job INCRs ``NAMESPACE:runs:<job id>`` when it starts and ``NAMESPACE:done:<job id>`` when its
body returns, so the tests count executions and completions."""

from __future__ import annotations

import ctypes
import os
import sys
import time
from typing import Any

import redis
from rq import Queue, get_current_job
from rq.worker import Worker

import jobpulse
from jobpulse.integrations.rq import worker_class


def _counter(ns: str, what: str) -> int:
    job = get_current_job()
    assert job is not None
    return int(job.connection.incr(f"{ns}:{what}:{job.id}"))


def progress(ns: str, n: int) -> dict[str, Any]:
    """Advances n items, one every 50 ms; returns its own result."""
    _counter(ns, "runs")
    hb = jobpulse.current()
    assert hb is not None
    hb.progress.set_total(n)
    hb.set_stage("crunch")
    for _ in range(n):
        time.sleep(0.05)
        hb.progress.advance()
    return {"items": n}


def sleeper(ns: str, seconds: float) -> str:
    """Runs for ``seconds``, calling ``check()`` when a heartbeat is there; records its pid."""
    _counter(ns, "runs")
    job = get_current_job()
    assert job is not None
    job.connection.rpush(f"{ns}:pids:{job.id}", os.getpid())
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        hb = jobpulse.current()
        if hb is not None:
            hb.check()
        time.sleep(0.05)
    _counter(ns, "done")
    return "slept"


def resumable(ns: str) -> Any:
    """First attempt: checkpoint, then run 60 s. A later attempt returns resume_from."""
    _counter(ns, "runs")
    job = get_current_job()
    assert job is not None
    job.connection.rpush(f"{ns}:pids:{job.id}", os.getpid())
    hb = jobpulse.current()
    assert hb is not None
    if hb.resume_from is not None:
        return {"resumed_from": hb.resume_from, "attempt": hb.attempt}
    hb.checkpoint(step=5)
    job.connection.set(f"{ns}:checkpointed:{job.id}", 1)
    time.sleep(60)
    return "not killed"


def gil_hold(ns: str, seconds: int) -> str:
    """Holds the GIL for ``seconds`` in one C call (libc ``sleep`` through ``ctypes.PyDLL``,
    which keeps the GIL), one second after recording ``NAMESPACE:holding:<job id>``."""
    _counter(ns, "runs")
    job = get_current_job()
    assert job is not None
    job.connection.set(f"{ns}:holding:{job.id}", os.getpid())
    time.sleep(1)  # the claim's keeper has refreshed it (it runs at once, then every 0.25 s)
    ctypes.PyDLL(None).sleep(seconds)
    _counter(ns, "done")
    return "held"


def probe(ns: str) -> str:
    """What ``jobpulse.current()`` is inside a job (the documented pattern: None -> plain)."""
    _counter(ns, "runs")
    return "none" if jobpulse.current() is None else "heartbeat"


class CountingWorker(Worker):
    """RQ's worker that INCRs ``NAMESPACE:deliveries:<job id>`` in the work horse before anything
    else runs the job (a delivery counts even when the body never starts)."""

    def perform_job(self, job: Any, queue: Any, execution: Any) -> bool:
        job.connection.incr(f"{queue.name.removesuffix('-q')}:deliveries:{job.id}")
        return bool(super().perform_job(job, queue, execution))


class ShortWorker(Worker):
    """RQ's worker with its StartedJobRegistry TTL set to 3 s (its main process refreshes it
    only every ``job_monitoring_interval``, 30 s)."""

    def get_heartbeat_ttl(self, job: Any, working_time: float = 0.0) -> int:
        return 3


if __name__ == "__main__":
    URL, NAMESPACE, MODE = sys.argv[1:4]
    connection = redis.Redis.from_url(URL)
    cls = (
        worker_class(
            CountingWorker,
            interval=0.25,
            ttl=1.0,
            namespace=NAMESPACE,
            sidecar=MODE == "jobpulse",
        )
        if MODE in ("jobpulse", "threadbeats")
        else ShortWorker
    )
    worker = cls(
        [Queue(f"{NAMESPACE}-q", connection=connection)],
        connection=connection,
        maintenance_interval=1,
        worker_ttl=16,
    )
    print("ready", flush=True)
    worker.work(logging_level="WARNING")
