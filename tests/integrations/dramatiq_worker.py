"""A Dramatiq worker process for the tests: ``python -m tests.integrations.dramatiq_worker URL
NAMESPACE MODE [HEARTBEAT_MS] [results-last]`` where MODE is ``jobpulse`` (instrumented,
interval 0.25 s, ttl 1 s), ``threadbeats`` (the same with ``sidecar=False``) or ``plain``; the
Results middleware is added before ``instrument()``, or after it with ``results-last``.
The Redis broker uses the namespace ``NAMESPACE-dq`` with ``heartbeat_timeout=HEARTBEAT_MS``
(default 3000) ms and
maintenance on every fetch; results go to ``NAMESPACE-res``; two worker threads. Prints ``ready``
once the worker runs. Every actor INCRs ``NAMESPACE:runs:<message id>`` when it starts."""

from __future__ import annotations

import ctypes
import signal
import sys
import threading
import time
from typing import Any

import dramatiq
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

import jobpulse
from jobpulse.integrations.dramatiq import instrument

URL, NAMESPACE, MODE = sys.argv[1:4]
EXTRA = sys.argv[4:]
RESULTS_LAST = "results-last" in EXTRA
HEARTBEAT_MS = next((int(arg) for arg in EXTRA if arg.isdigit()), 3000)

broker = RedisBroker(
    url=URL,
    namespace=f"{NAMESPACE}-dq",
    heartbeat_timeout=HEARTBEAT_MS,
    maintenance_chance=1_000_000,
)
results = Results(backend=RedisBackend(url=URL, namespace=f"{NAMESPACE}-res"))
if not RESULTS_LAST:
    broker.add_middleware(results)
broker.add_middleware(CurrentMessage())
if MODE in ("jobpulse", "threadbeats"):
    instrument(broker, interval=0.25, ttl=1.0, namespace=NAMESPACE, sidecar=MODE == "jobpulse")
if RESULTS_LAST:
    broker.add_middleware(results)
dramatiq.set_broker(broker)


def _count() -> str:
    message = CurrentMessage.get_current_message()
    assert message is not None
    broker.client.incr(f"{NAMESPACE}:runs:{message.message_id}")
    return str(message.message_id)


@dramatiq.actor(queue_name="q", store_results=True, max_retries=0)
def progress(n: int) -> dict[str, Any]:
    """Advances n items, one every 50 ms; returns its own result."""
    _count()
    hb = jobpulse.current()
    assert hb is not None
    hb.progress.set_total(n)
    hb.set_stage("crunch")
    for _ in range(n):
        time.sleep(0.05)
        hb.progress.advance()
    return {"items": n}


@dramatiq.actor(queue_name="q", store_results=True, max_retries=3)
def sleeper(seconds: float) -> str:
    """Runs for ``seconds``, calling ``check()`` when a heartbeat is there."""
    _count()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        hb = jobpulse.current()
        if hb is not None:
            hb.check()
        time.sleep(0.05)
    return "slept"


@dramatiq.actor(queue_name="q", store_results=True, max_retries=0)
def resumable() -> Any:
    """First attempt: checkpoint, then run until killed. A later attempt returns resume_from."""
    message_id = _count()
    hb = jobpulse.current()
    assert hb is not None
    if hb.resume_from is not None:
        return {"resumed_from": hb.resume_from, "attempt": hb.attempt}
    hb.checkpoint(step=5)
    broker.client.set(f"{NAMESPACE}:checkpointed:{message_id}", 1)
    time.sleep(60)
    return "not killed"


@dramatiq.actor(queue_name="q", store_results=True, max_retries=0)
def gil_hold(seconds: int) -> str:
    """Holds the GIL for ``seconds`` in one C call (libc ``sleep`` through ``ctypes.PyDLL``,
    which keeps the GIL), one second after recording ``NAMESPACE:holding:<message id>``."""
    message_id = _count()
    broker.client.set(f"{NAMESPACE}:holding:{message_id}", 1)
    time.sleep(1)
    ctypes.PyDLL(None).sleep(seconds)
    return "held"


@dramatiq.actor(queue_name="q", store_results=True, max_retries=0)
def probe() -> str:
    """What ``jobpulse.current()`` is inside an actor (the documented pattern: None -> plain)."""
    _count()
    return "none" if jobpulse.current() is None else "heartbeat"


if __name__ == "__main__":
    worker = Worker(broker, worker_threads=2, worker_timeout=100)
    worker.start()
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    print("ready", flush=True)
    stopping.wait()
    worker.stop()
