"""Celery integration: every task runs under a ``jobpulse.sync`` heartbeat.

Install it on the app (``pip install "jobpulse[celery]"``)::

    from jobpulse.integrations.celery import instrument

    app = Celery("reports", broker="redis://localhost:6379/0")
    instrument(app)

Each task then runs inside ``jobpulse.sync.heartbeat(redis, job_id_for(task.request.id),
kind=task.name)`` (``jobpulse.current()`` is that heartbeat, in the task's thread), entered by a
``task_prerun`` and left by a ``task_postrun`` signal handler, in whatever process or thread runs
the task (prefork child, solo, threads).

Redelivery: with the Redis transport and ``task_acks_late=True``, kombu keeps each delivery in
the ``unacked_index`` sorted set, scored by delivery time, and restores every entry older than
``visibility_timeout``, even while its task runs. While the heartbeat holds its lease, the task's
entry is re-scored every ``interval`` to ``now - visibility_timeout + ttl + interval``: a live task
is never restored, and a dead worker's task becomes restorable ``ttl + interval`` seconds after its
last refresh (then restored by the next scan, every ``unacked_restore_interval`` *
``unacked_restore_throttle`` seconds), whatever ``visibility_timeout`` is. Without ``acks_late``
the message is acked before the task runs and nothing is redelivered.

Sidecar (the default): the task's beats and that re-score go out from jobpulse's helper process
(one per process that runs tasks, ending with it), so a task that holds the GIL is neither read
STALE nor restored; ``sidecar=False`` sends both from threads of the task's process.

Cancel: ``jobpulse.request_cancel()`` reaches the task through ``current().check()``, which
raises ``JobCancelled``; Celery records the task FAILURE with that exception (acked, not
retried unless the task's own ``autoretry_for`` says so) and jobpulse records CANCELLED.

Terminate: ``revoke(task_id, terminate=True)`` SIGTERMs the prefork child running the task; the
child's handler raises ``SystemExit`` through the body, and Celery sends ``task_postrun`` with no
state: jobpulse records CANCELLED (a ``JobCancelled`` naming the interruption) and Celery
REVOKED. A child killed with SIGKILL writes nothing: the job is STALE within ``ttl``, LOST once a
sweeper claims it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import threading
import time
from typing import Any

import redis as redis_sync
from celery import Celery, signals  # type: ignore[import-untyped]

from ..errors import JobCancelled
from ._common import HelperClaim, PulseOptions, job_id_for, pulse_sync

__all__ = ["instrument"]

log = logging.getLogger("jobpulse.integrations")

_SOCKET_TIMEOUT = 2.0  # a blocking command of jobpulse or of the refresh is bounded by this


class _Instrumented:
    """The handlers :func:`instrument` connects for one app, and the tasks running now."""

    def __init__(self, app: Celery, options: PulseOptions) -> None:
        self.app = app
        self.options = options
        # keyed by (task id, thread): prerun and postrun of a task run in one thread, and a
        # duplicate delivery of the same id in another thread must not end this one's heartbeat
        self.running: dict[tuple[str, int], contextlib.ExitStack] = {}
        self.lock = threading.Lock()
        self._clients: dict[int, tuple[Any, Any]] = {}  # pid -> (jobpulse client, broker client)

    def clients(self) -> tuple[Any, Any]:
        """This process's clients (a prefork child gets its own: never a connection across fork)."""
        pid = os.getpid()
        with self.lock:
            if pid not in self._clients:
                url = str(self.app.conf.broker_url or "")
                broker = None
                if url.startswith(("redis://", "rediss://", "unix://")):
                    broker = redis_sync.Redis.from_url(url, socket_timeout=_SOCKET_TIMEOUT)
                ours = self.options.redis if self.options.redis is not None else broker
                if ours is None:
                    raise ValueError(
                        "jobpulse.integrations.celery: the broker is not Redis; pass redis="
                    )
                self._clients[pid] = (ours, broker)
            return self._clients[pid]

    def refresher(self, broker: Any, task: Any) -> tuple[Any, HelperClaim | None]:
        """The re-score of this delivery's ``unacked_index`` entry (None: not Redis), and the
        same re-score for the sidecar helper to run (None: it cannot)."""
        if broker is None:
            return None, None
        tag = (getattr(task.request, "properties", None) or {}).get("delivery_tag")
        if tag is None:
            return None, None
        topts = dict(self.app.conf.broker_transport_options or {})
        key = str(topts.get("global_keyprefix", "")) + str(
            topts.get("unacked_index_key", "unacked_index")
        )
        behind = max(0.0, float(topts.get("visibility_timeout", 3600)) - self.options.claim_ttl)

        rescore = functools.partial(_rescore, key, str(tag), behind)
        claim = HelperClaim.of(broker, rescore, self.options.interval, job_id_for(task.request.id))
        return functools.partial(rescore, broker), claim

    def prerun(self, task_id: str, task: Any, **_: Any) -> None:
        ours, broker = self.clients()
        refresh, claim = self.refresher(broker, task)
        stack = contextlib.ExitStack()
        stack.enter_context(
            pulse_sync(self.options, ours, task_id, task.name, refresh, claim=claim)
        )
        with self.lock:
            self.running[task_id, threading.get_ident()] = stack

    def postrun(self, task_id: str, state: str | None = None, retval: Any = None, **_: Any) -> None:
        with self.lock:
            stack = self.running.pop((task_id, threading.get_ident()), None)
        if stack is None:
            return
        if state is None:
            # The body never finished: Celery's tracer sends postrun from a `finally` while a
            # BaseException leaves the task — the SystemExit of a prefork child's SIGTERM
            # handler (revoke(terminate=True), a hard time limit), KeyboardInterrupt. Never
            # COMPLETED: the job was stopped from outside.
            stopped = _interrupted(sys.exc_info()[1])
            stack.__exit__(JobCancelled, stopped, None)
        elif state in ("FAILURE", "RETRY", "REJECTED") and isinstance(retval, BaseException):
            if not stack.__exit__(type(retval), retval, retval.__traceback__):
                return  # the heartbeat re-raised the task's own exception: recorded FAILED
        else:
            stack.__exit__(None, None, None)


def _rescore(key: str, tag: str, behind: float, broker: Any) -> None:
    """Re-score a delivery's ``unacked_index`` entry to ``now - behind`` (in the worker, or in
    the sidecar helper). XX: never re-creates an entry kombu removed (acked, or restored)."""
    broker.zadd(key, {tag: time.time() - behind}, xx=True)


def _interrupted(exc: BaseException | None) -> JobCancelled:
    """The cancellation recorded for a task whose body was interrupted by ``exc``."""
    what = "" if exc is None else f" by {type(exc).__name__}({exc})"
    return JobCancelled(
        f"the task was interrupted{what} before it finished: its worker process was stopped "
        "(revoke(terminate=True) or a hard time limit)"
    )


def instrument(
    app: Celery,
    *,
    interval: float = 1.0,
    ttl: float = 6.0,
    namespace: str = "jobpulse",
    redis: Any = None,
    sidecar: bool = True,
) -> Celery:
    """Instrument a Celery app: every task it runs goes under a ``jobpulse.sync`` heartbeat.

    Call it once where the app is defined (the worker imports that module). Idempotent per app.

    Args:
        app: the Celery app.
        interval: seconds between beats and between refreshes of the delivery's
            ``unacked_index`` entry.
        ttl: the heartbeat's lease time (a dead worker's task is STALE after at most ``ttl``).
        namespace: jobpulse's key prefix.
        redis: the ``redis.Redis`` client jobpulse writes to; None uses one from the broker URL
            (the broker must then be Redis).
        sidecar: True (the default): each task's beats, and the refresh of its
            ``unacked_index`` entry, go out from jobpulse's helper process (one per worker
            process), so a body that holds the GIL delays neither; False: from threads of the
            worker process. With True, ``redis`` must be a client jobpulse can rebuild there
            (a plain ``redis.Redis``; TypeError here otherwise).

    Returns:
        The app.

    Raises:
        ValueError, TypeError: an option is out of range (checked here, before any Redis command).
    """
    options = PulseOptions(
        interval=interval, ttl=ttl, namespace=namespace, redis=redis, sidecar=sidecar
    )
    if getattr(app, "_jobpulse", None) is not None:
        return app
    hooks = _Instrumented(app, options)
    app._jobpulse = hooks

    def prerun(sender: Any = None, task_id: str = "", task: Any = None, **kw: Any) -> None:
        if task is not None and task.app is app:
            hooks.prerun(task_id, task)

    def postrun(sender: Any = None, task_id: str = "", task: Any = None, **kw: Any) -> None:
        if task is not None and task.app is app:
            hooks.postrun(task_id, kw.get("state"), kw.get("retval"))

    signals.task_prerun.connect(prerun, weak=False)
    signals.task_postrun.connect(postrun, weak=False)
    return app
