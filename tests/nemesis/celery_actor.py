"""The queue of a nemesis run: real ``celery worker`` processes (prefork pool, ``acks_late``),
their broker the nemesis Redis through the fault proxy, instrumented by
:func:`jobpulse.integrations.celery.instrument` with its defaults (sidecar beats).

``python -m tests.nemesis.celery_actor ROLE CONFIG-JSON`` (the config as the other actors'):

* ``worker``: one Celery node (``-c 1``: one pool child; the harness runs two nodes, so a task
  restored from one runs on the other). It prints ``ready`` once it consumes. Every task is
  ``long``: 20-40 steps of 0.2 s (2-3 ``ttl``, so it spans faults), advancing the job's
  progress, a checkpoint every 5 steps. SIGUSR2 makes a pool child's body hold the GIL
  (SIGUSR1 is billiard's soft time limit).
* ``producer``: sends one ``long`` task every ``every`` seconds (to the server itself: the
  producer is not under test).

History (:mod:`tests.nemesis.history`), the node's main process: ``q_received`` (task: the
consumer got a delivery), ``q_ack`` (task: the delivery was acknowledged), ``q_restore``
(tasks: kombu put the deliveries of a channel it closed back on the queue, a lost
connection's), ``q_expired`` (task: a node's scan put back a delivery whose visibility timeout
passed); each pool child: ``exec_start`` / ``exec_end`` (task, node, node_pid: the main
process's, outcome ``completed`` or the exception's name), and the
job's ``acquire`` / ``checkpoint`` / ``final`` / ``lease_lost`` / ``job_error`` records as the
other workers write them (the job id is the task id); ``no_heartbeat`` (task) when jobpulse
could not take the lease at the task's start: the body then does nothing (a duplicate delivery
of a task another live attempt holds must not run it twice). The producer: ``q_send``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

STEP = 0.2


def _conf(app: Any, cfg: dict[str, Any]) -> None:
    app.conf.update(
        task_acks_late=True,
        task_default_queue=f"{cfg['ns']}:q",
        task_ignore_result=True,
        broker_transport_options={
            # below the tasks' length: without the integration's re-score every task would be
            # restored beside itself
            "visibility_timeout": cfg["ttl"],
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
            "global_keyprefix": f"{cfg['ns']}:celery:",
        },
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        worker_redirect_stdouts=False,
        worker_hijack_root_logger=False,
    )


def _worker_app(cfg: dict[str, Any]) -> Any:
    from celery import Celery, signals
    from celery.worker.request import Request
    from kombu.transport.redis import QoS as RedisQoS
    from kombu.transport.virtual.base import QoS

    import jobpulse.integrations.celery as jp_celery
    from jobpulse import LeaseLost, current

    from .actors import _gil_hold
    from .history import History

    app = Celery("jobpulse_nemesis", broker=cfg["conn"]["url"])
    _conf(app, cfg)
    hists: dict[int, History] = {}

    def hist() -> History:
        pid = os.getpid()
        if pid not in hists:
            main = cfg.get("main_pid") == pid
            hists[pid] = History(cfg["dir"], cfg["proc"] if main else f"{cfg['proc']}.c{pid}")
        return hists[pid]

    fences: dict[str, int] = {}  # task id -> the fence its heartbeat holds (this child)

    @app.task(bind=True, name="long")
    def long(self: Any, steps: int) -> str:
        task = self.request.id
        hb = current()
        t0 = time.monotonic()
        if hb is None:
            hist().add("no_heartbeat", task=task)
            return "skipped"
        fences[task] = hb.fence
        node = {"node": cfg["proc"], "node_pid": cfg["main_pid"]}
        hist().add("exec_start", task=task, **node)
        hist().add("acquire", job=hb.job_id, fence=hb.fence, attempt=hb.attempt, shell="celery",
                   sidecar=True, t0=t0)  # fmt: skip
        try:
            for k in range(1, steps + 1):
                time.sleep(STEP)
                hb.check()
                hb.progress.advance()
                if k % 5 == 0:
                    c0 = time.monotonic()
                    if hb.checkpoint(n=k):
                        hist().add("checkpoint", job=hb.job_id, fence=hb.fence, n=k, t0=c0)
        except BaseException as exc:
            hist().add("exec_end", task=task, outcome=type(exc).__name__, **node)
            raise
        hist().add("exec_end", task=task, outcome="completed", **node)
        return "done"

    original_leave = jp_celery.leave_recorded

    def leave(stack: Any, exc: BaseException | None, job_id: str) -> None:
        """jobpulse's final write, recorded as the other workers record theirs."""
        fence = fences.pop(job_id, None)
        t0 = time.monotonic()
        try:
            stack.__exit__(None if exc is None else type(exc), exc, None)
        except LeaseLost as raised:
            hist().add("lease_lost", job=job_id, fence=fence, cause=raised.cause.name)
            return
        except Exception as raised:
            if raised is not exc:
                hist().add("job_error", job=job_id, fence=fence, error=repr(raised))
            return
        if exc is None:
            hist().add("final", job=job_id, fence=fence, status="COMPLETED", t0=t0)

    assert original_leave is not None
    jp_celery.leave_recorded = leave  # type: ignore[assignment]
    jp_celery.instrument(app, ttl=cfg["ttl"], interval=cfg["interval"], namespace=cfg["ns"])

    acknowledge = Request.acknowledge

    def acked(self: Any) -> None:
        acknowledge(self)
        hist().add("q_ack", task=self.id)

    Request.acknowledge = acked  # type: ignore[method-assign]

    restore = QoS.restore_unacked_once

    def restored(self: Any, stderr: Any = None) -> Any:
        """kombu puts every delivery of a channel it closes back on its queue, running tasks'
        too (a lost broker connection): recorded, the checker's excuse for a task run again."""
        held = [m for tag, m in list(self._delivered.items()) if tag not in self._dirty]
        tasks = [str((m.headers or {}).get("id")) for m in held]
        if tasks and not self._delivered.restored:
            hist().add("q_restore", tasks=tasks)
        return restore(self, stderr)

    QoS.restore_unacked_once = restored  # type: ignore[method-assign]

    visible, by_tag = RedisQoS.restore_visible, RedisQoS.restore_by_tag
    scanning = threading.local()

    def restore_visible(self: Any, *args: Any, **kwargs: Any) -> Any:
        scanning.on = True
        try:
            return visible(self, *args, **kwargs)
        finally:
            scanning.on = False

    def restore_by_tag(self: Any, tag: Any, client: Any = None, leftmost: bool = False) -> Any:
        """A delivery whose ``unacked_index`` entry is older than the visibility timeout, put
        back on the queue by a node's periodic scan: recorded (``q_expired``), never an excuse
        (the integration keeps a live task's entry fresh)."""
        if getattr(scanning, "on", False):
            with self.channel.conn_or_acquire(client) as c:
                raw = c.hget(self.unacked_key, tag)
            if raw:
                message = json.loads(raw)[0]
                hist().add("q_expired", task=str((message.get("headers") or {}).get("id")))
        return by_tag(self, tag, client, leftmost)

    RedisQoS.restore_visible = restore_visible  # type: ignore[method-assign]
    RedisQoS.restore_by_tag = restore_by_tag  # type: ignore[method-assign]

    @signals.task_received.connect(weak=False)
    def _received(request: Any = None, **_: Any) -> None:
        if request is not None:
            hist().add("q_received", task=request.id)

    @signals.worker_ready.connect(weak=False)
    def _ready(**_: Any) -> None:
        print("ready", flush=True)

    @signals.worker_process_init.connect(weak=False)
    def _child(**_: Any) -> None:
        _gil_hold(hist(), cfg["gil"], signal.SIGUSR2)  # billiard's soft time limit is SIGUSR1

    return app


def worker(cfg: dict[str, Any]) -> None:
    import warnings

    warnings.filterwarnings("ignore", message=".*superuser privileges")  # the CI's container
    cfg["main_pid"] = os.getpid()  # the pool children are forks of it: the same app
    app = _worker_app(cfg)
    app.worker_main(["--quiet", "worker", "-P", "prefork", "-c", "1", "-Q", f"{cfg['ns']}:q",
                     "--loglevel", "ERROR", "--without-heartbeat", "--without-mingle",
                     "--without-gossip", "-n", f"{cfg['proc']}@%h"])  # fmt: skip


def producer(cfg: dict[str, Any]) -> None:
    import random

    from celery import Celery

    from .history import History

    hist = History(cfg["dir"], cfg["proc"])
    app = Celery("jobpulse_nemesis", broker=cfg["conn"]["url"])
    _conf(app, cfg)
    rng = random.Random(f"{cfg['seed']}-{cfg['proc']}")
    print("ready", flush=True)
    for n in range(1, 1_000_000):
        task = f"q-{cfg['proc']}-{n}"
        try:
            app.send_task("long", args=(rng.randint(20, 40),), task_id=task)
            hist.add("q_send", task=task)
        except Exception as exc:  # the server restarting: the next one goes
            hist.add("q_send_error", task=task, error=repr(exc))
        time.sleep(cfg["every"])


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    {"worker": worker, "producer": producer}[sys.argv[1]](json.loads(sys.argv[2]))
