"""A Celery worker process for the tests: ``python -m tests.integrations.celery_worker URL
NAMESPACE MODE [POOL [CONCURRENCY [BROKER [NAME]]]]`` where MODE is ``jobpulse`` (instrumented,
interval 0.25 s, ttl 1 s), ``threadbeats`` (the same with ``sidecar=False``), ``slowhelper`` (the
same as ``jobpulse`` with a helper process that takes 3 s to start) or ``plain``, POOL
``threads`` (the default) or ``prefork``, CONCURRENCY the pool's size (4 threads by default, so a
restored copy of a running task starts beside it; one prefork child), BROKER the broker URL when it
is not URL (a ``sentinel://`` URL of the master ``jobpulse``; results stay on URL) and NAME the
node's name (default ``NAMESPACE``). The app acks late with Celery's default prefetch multiplier
(4), ``visibility_timeout=3`` and the restore scan every 1 s, keys prefixed by ``NAMESPACE:`` and
the queue ``NAMESPACE:q``. Prints ``ready`` once the worker consumes; every task INCRs
``NAMESPACE:runs:<task id>`` when it starts, so the tests count executions."""

from __future__ import annotations

import ctypes
import os
import sys
import time
from typing import Any

import redis
from celery import Celery, signals
from celery.exceptions import Ignore, Reject

import jobpulse
from jobpulse.integrations.celery import instrument

ARGS = sys.argv[1:] if __name__ == "__main__" else ["redis://", "t", "plain"]
URL, NAMESPACE, MODE = ARGS[:3]
POOL = ARGS[3] if len(ARGS) > 3 else "threads"
CONCURRENCY = ARGS[4] if len(ARGS) > 4 else ("4" if POOL == "threads" else "1")
BROKER = ARGS[5] if len(ARGS) > 5 else URL
NODE = ARGS[6] if len(ARGS) > 6 else NAMESPACE

app = Celery("jobpulse_test", broker=BROKER, backend=URL)
app.conf.update(
    task_acks_late=True,  # and Celery's default worker_prefetch_multiplier (4)
    task_default_queue=f"{NAMESPACE}:q",
    broker_transport_options={
        "visibility_timeout": 3,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
        "global_keyprefix": f"{NAMESPACE}:",
        **({"master_name": "jobpulse"} if BROKER.startswith("sentinel://") else {}),
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


@app.task(bind=True, name="ignorer")
def ignorer(self: Any) -> str:
    """Ends with ``Ignore``: Celery's IGNORED state (no result stored)."""
    _count(self.request.id)
    raise Ignore("handled elsewhere")


@app.task(bind=True, name="replacer")
def replacer(self: Any) -> Any:
    """Replaces itself with ``probe`` (Celery: ``Ignore`` here, the replacement keeps the id)."""
    _count(self.request.id)
    return self.replace(probe.s())


class SlowReplace(app.Task):  # type: ignore[name-defined,misc]
    """``task.replace()`` whose run ends 1 s after the replacement was sent: the replacement
    starts while the run it replaces still holds the job."""

    def on_replace(self, sig: Any) -> Any:
        try:
            return super().on_replace(sig)
        finally:
            time.sleep(1)


@app.task(bind=True, name="slow_replacer", base=SlowReplace)
def slow_replacer(self: Any) -> Any:
    """Replaces itself with ``probe``, the replacement starting before this run ends."""
    _count(self.request.id)
    return self.replace(probe.s())


@signals.worker_ready.connect
def _ready(**_: Any) -> None:
    print("ready", flush=True)


@signals.task_prerun.connect
def _delivered(task_id: str = "", **_: Any) -> None:
    """Counts ``NAMESPACE:deliveries:<task id>`` before jobpulse's handler (connected after this
    one) enters the heartbeat: a delivery counts even when the body never starts."""
    client.incr(f"{NAMESPACE}:deliveries:{task_id}")


if MODE == "slowhelper":
    # the sidecar's helper process takes 3 s to start, as it can on a loaded machine
    from jobpulse._worker.sidecar import channel as _channel

    _start = _channel.Channel.__init__

    def _slow_start(self: Any) -> None:
        time.sleep(3)
        _start(self)

    _channel.Channel.__init__ = _slow_start  # type: ignore[method-assign]

if MODE in ("jobpulse", "threadbeats", "slowhelper"):
    jobpulse_redis = client if BROKER != URL else None  # jobpulse needs redis= beside Sentinel
    instrument(
        app,
        interval=0.25,
        ttl=1.0,
        namespace=NAMESPACE,
        redis=jobpulse_redis,
        sidecar=MODE != "threadbeats",
    )

if __name__ == "__main__":
    app.worker_main(
        [
            "--quiet",
            "worker",
            "-P",
            POOL,
            "-c",
            CONCURRENCY,
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
