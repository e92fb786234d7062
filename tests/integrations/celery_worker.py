"""A Celery worker process for the tests: ``python -m tests.integrations.celery_worker URL
NAMESPACE MODE [POOL [NAME]]`` where MODE is ``jobpulse`` (instrumented, interval 0.25 s, ttl
1 s), ``threadbeats`` (the same with ``sidecar=False``) or ``plain``, POOL ``threads`` (the
default) or ``prefork``, and NAME the node's name (default ``NAMESPACE``). The app acks late, with
``visibility_timeout=3`` and the restore scan every 1 s, keys prefixed by ``NAMESPACE:`` and the
queue ``NAMESPACE:q``; a threads pool of 4 (so a restored copy of a running task starts beside it)
or a prefork pool of one child. Prints ``ready`` once the worker consumes; every task INCRs
``NAMESPACE:runs:<task id>`` when it starts, so the tests count executions."""

from __future__ import annotations

import ctypes
import os
import sys
import time
from typing import Any

import redis
from celery import Celery, signals
from celery.exceptions import Reject

import jobpulse
from jobpulse.integrations.celery import instrument

URL, NAMESPACE, MODE = sys.argv[1:4] if __name__ == "__main__" else ("redis://", "t", "plain")
POOL = sys.argv[4] if __name__ == "__main__" and len(sys.argv) > 4 else "threads"
NODE = sys.argv[5] if __name__ == "__main__" and len(sys.argv) > 5 else NAMESPACE

app = Celery("jobpulse_test", broker=URL, backend=URL)
app.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_default_queue=f"{NAMESPACE}:q",
    broker_transport_options={
        "visibility_timeout": 3,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
        "global_keyprefix": f"{NAMESPACE}:",
    },
    result_backend_transport_options={"global_keyprefix": f"{NAMESPACE}:"},
    broker_connection_retry_on_startup=True,
    worker_redirect_stdouts=False,
    worker_hijack_root_logger=False,
)
client = redis.Redis.from_url(URL)


def _count(task_id: str) -> int:
    return int(client.incr(f"{NAMESPACE}:runs:{task_id}"))


@app.task(bind=True, name="progress")
def progress(self: Any, n: int) -> dict[str, Any]:
    """Advances n items, one every 50 ms; returns its own result."""
    _count(self.request.id)
    hb = jobpulse.current()
    assert hb is not None
    hb.progress.set_total(n)
    hb.set_stage("crunch")
    for _ in range(n):
        time.sleep(0.05)
        hb.progress.advance()
    return {"items": n, "job": self.request.id}


@app.task(bind=True, name="sleeper")
def sleeper(self: Any, seconds: float) -> str:
    """Runs for ``seconds``, calling ``check()`` when a heartbeat is there; records its pid."""
    _count(self.request.id)
    client.rpush(f"{NAMESPACE}:pids:{self.request.id}", os.getpid())
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        hb = jobpulse.current()
        if hb is not None:
            hb.check()
        time.sleep(0.05)
    return "slept"


@app.task(bind=True, name="resumable")
def resumable(self: Any) -> Any:
    """First attempt: checkpoint, then run until killed. A later attempt returns resume_from."""
    _count(self.request.id)
    hb = jobpulse.current()
    assert hb is not None
    if hb.resume_from is not None:
        return {"resumed_from": hb.resume_from, "attempt": hb.attempt}
    hb.checkpoint(step=5)
    client.set(f"{NAMESPACE}:checkpointed:{self.request.id}", 1)
    time.sleep(60)
    return "not killed"


@app.task(bind=True, name="gil_hold")
def gil_hold(self: Any, seconds: int) -> str:
    """Holds the GIL for ``seconds`` in one C call (libc ``sleep`` through ``ctypes.PyDLL``,
    which keeps the GIL), one second after recording ``NAMESPACE:holding:<task id>``."""
    _count(self.request.id)
    client.set(f"{NAMESPACE}:holding:{self.request.id}", os.getpid())
    time.sleep(1)  # the claim's keeper has refreshed it (it runs at once, then every 0.25 s)
    ctypes.PyDLL(None).sleep(seconds)
    return "held"


@app.task(bind=True, name="probe")
def probe(self: Any) -> str:
    """What ``jobpulse.current()`` is inside a task (the documented pattern: None -> plain)."""
    _count(self.request.id)
    hb = jobpulse.current()
    return "none" if hb is None else "heartbeat"


@app.task(bind=True, name="rejecter")
def rejecter(self: Any) -> str:
    """Rejects its message (not requeued): Celery's REJECTED state."""
    _count(self.request.id)
    raise Reject("not for this worker", requeue=False)


@signals.worker_ready.connect
def _ready(**_: Any) -> None:
    print("ready", flush=True)


@signals.task_prerun.connect
def _delivered(task_id: str = "", **_: Any) -> None:
    """Counts ``NAMESPACE:deliveries:<task id>`` before jobpulse's handler (connected after this
    one) enters the heartbeat: a delivery counts even when the body never starts."""
    client.incr(f"{NAMESPACE}:deliveries:{task_id}")


if MODE in ("jobpulse", "threadbeats"):
    instrument(app, interval=0.25, ttl=1.0, namespace=NAMESPACE, sidecar=MODE == "jobpulse")

if __name__ == "__main__":
    app.worker_main(
        [
            "--quiet",
            "worker",
            "-P",
            POOL,
            "-c",
            "4" if POOL == "threads" else "1",
            "-Q",
            f"{NAMESPACE}:q",
            "--loglevel",
            "WARNING",
            "--without-heartbeat",
            "--without-mingle",
            "--without-gossip",
            "-n",
            f"{NODE}@%h",
        ]
    )
