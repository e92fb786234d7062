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
``unacked_restore_throttle`` seconds), whatever ``visibility_timeout`` is. The deliveries the
worker holds for tasks that do not run yet (prefetched, ETA/countdown, rate-limited) are
re-scored the same way by one thread per worker process, which dies with it. The re-score goes
through a channel of kombu's own Redis transport (``redis://``, ``rediss://``,
``redis+socket://``, ``sentinel://``). Without ``acks_late`` the message is acked before the task
runs and nothing is redelivered.

Order: Celery stores the result, then sends ``task_postrun``, where jobpulse writes the final
state.

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
import weakref
from typing import Any

import redis as redis_sync
from celery import Celery, signals  # type: ignore[import-untyped]

from .._protocol.ratelimit import RateLimitedLog
from ..errors import JobBusy, JobCancelled
from ._common import (
    HelperClaim,
    PulseOptions,
    job_id_for,
    leave_recorded,
    pulse_sync,
    refresh_delays,
)

__all__ = ["instrument"]

log = logging.getLogger("jobpulse.integrations")

_SOCKET_TIMEOUT = 2.0  # a blocking command of jobpulse or of the refresh is bounded by this


class _Rescore:
    """Re-scores deliveries' ``unacked_index`` entries through a kombu channel of the broker's own
    transport (``redis://``, ``rediss://``, ``redis+socket://``, ``sentinel://``): the key, the
    ``global_keyprefix`` and ``visibility_timeout`` are the ones kombu itself uses."""

    def __init__(self, connection: Any, claim_ttl: float) -> None:
        self.connection = connection  # kept: the channel lives as long as its connection
        channel = connection.default_channel
        self.client = channel.client
        self.key = channel.unacked_index_key
        self.behind = max(0.0, float(channel.visibility_timeout) - claim_ttl)

    def __call__(self, tags: list[str]) -> None:
        # XX: never re-creates an entry kombu removed (acked, or restored already)
        now = time.time() - self.behind
        self.client.zadd(self.key, dict.fromkeys(tags, now), xx=True)


def _is_redis_transport(app: Celery) -> bool:
    """Whether the app's broker is one of kombu's Redis transports (no connection is made)."""
    from kombu.transport.redis import Transport

    connection = app.connection_for_write()
    try:
        return isinstance(connection.transport, Transport)
    finally:
        connection.release()


def _client_url(url: str) -> str | None:
    """The URL of a ``redis.Redis`` for jobpulse's own writes, from a broker URL, or None."""
    if url.startswith(("redis://", "rediss://", "unix://")):
        return url
    if url.startswith("redis+socket://"):
        return "unix://" + url.removeprefix("redis+socket://")
    return None


class _Instrumented:
    """The handlers :func:`instrument` connects for one app, and the tasks running now."""

    def __init__(self, app: Celery, options: PulseOptions) -> None:
        self.app = app
        self.options = options
        # keyed by (task id, thread): prerun and postrun of a task run in one thread, and a
        # duplicate delivery of the same id in another thread must not end this one's heartbeat
        self.running: dict[tuple[str, int], contextlib.ExitStack] = {}
        # the deliveries the worker's consumer received and has not acknowledged: prefetched
        # (waiting for a pool slot), scheduled (ETA/countdown), rate-limited, running
        self.held: weakref.WeakSet[Any] = weakref.WeakSet()
        self.keeper: threading.Thread | None = None
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self._clients: dict[int, Any] = {}  # pid -> jobpulse's client
        # whether the broker keeps an unacked index (kombu's Redis transports): decided once,
        # without a connection; the re-score's connection is made on first use, per process
        self.redis_transport = _is_redis_transport(app)
        self._rescores: dict[int, _Rescore | None] = {}  # pid -> re-score (None: no ack index)
        self._rescore_lock = threading.Lock()
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        # a prefork child: the parent's threads are not here, and a lock one of them held at the
        # fork would never be released
        self.lock = threading.Lock()
        self._rescore_lock = threading.Lock()
        self.held = weakref.WeakSet()
        self.keeper = None

    def client(self) -> Any:
        """This process's jobpulse client (a prefork child gets its own: never a connection
        across fork)."""
        pid = os.getpid()
        with self.lock:
            if pid not in self._clients:
                ours = self.options.redis
                if ours is None:
                    url = _client_url(str(self.app.conf.broker_url or ""))
                    if url is None:
                        raise ValueError(_NOT_REDIS)
                    ours = redis_sync.Redis.from_url(url, socket_timeout=_SOCKET_TIMEOUT)
                self._clients[pid] = ours
            return self._clients[pid]

    def rescore(self, tags: list[str]) -> None:
        """Re-score these deliveries through this process's kombu channel, made on first use
        (a refresh, whose faults are logged and tried again: never a task's start)."""
        pid = os.getpid()
        with self._rescore_lock:
            if pid not in self._rescores:
                connection = self.app.connection_for_write(
                    transport_options={
                        "socket_timeout": _SOCKET_TIMEOUT,
                        "socket_connect_timeout": _SOCKET_TIMEOUT,
                        "max_retries": 1,
                        "connect_retries_timeout": _SOCKET_TIMEOUT,
                    }
                )
                ack_index = connection.default_channel.ack_emulation
                self._rescores[pid] = (
                    _Rescore(connection, self.options.claim_ttl) if ack_index else None
                )
            rescore = self._rescores[pid]
        if rescore is not None:
            rescore(tags)

    def broker(self) -> Any:
        """A ``redis.Redis`` for the broker's URL, for the sidecar helper to rebuild (no
        connection is made here), or None: kombu's transport only (``sentinel://``)."""
        url = _client_url(str(self.app.conf.broker_url or ""))
        if url is None:
            return None
        return redis_sync.Redis.from_url(url, socket_timeout=_SOCKET_TIMEOUT)

    def refresher(self, task: Any) -> tuple[Any, HelperClaim | None]:
        """The re-score of this delivery's ``unacked_index`` entry through kombu's channel
        (None: not Redis), and the same re-score for the sidecar helper to run (None: no
        sidecar, or the helper cannot rebuild the broker's client; the worker re-scores)."""
        if not self.redis_transport:
            return None, None
        tag = (getattr(task.request, "properties", None) or {}).get("delivery_tag")
        if tag is None:
            return None, None
        claim = None
        broker = self.broker() if self.options.sidecar else None
        if broker is not None:
            topts = dict(self.app.conf.broker_transport_options or {})
            key = str(topts.get("global_keyprefix", "")) + str(
                topts.get("unacked_index_key", "unacked_index")
            )
            vt = float(topts.get("visibility_timeout", 3600))
            behind = max(0.0, vt - self.options.claim_ttl)
            rescore = functools.partial(_rescore, key, str(tag), behind)
            claim = HelperClaim.of(
                broker, rescore, self.options.interval, job_id_for(task.request.id)
            )
        return (lambda: self.rescore([tag])), claim

    def received(self, request: Any) -> None:
        """The consumer received ``request``: keep its delivery fresh until it is acknowledged
        (its task's own heartbeat takes over while the task runs)."""
        if not self.redis_transport:
            return
        with self.lock:
            self.held.add(request)
            if self.keeper is not None:
                return
            self.keeper = threading.Thread(
                target=self._keep_held, name="jobpulse-held-deliveries", daemon=True
            )
            self.keeper.start()

    def _keep_held(self) -> None:
        """Every ``interval``, re-score the deliveries this worker holds that no task runs: a
        delivery waiting for a pool slot, an ETA or a rate limit is never restored while the
        worker lives. The thread dies with the worker: a dead worker's deliveries become
        restorable ``ttl + interval`` after its last re-score."""
        from celery.worker import state  # type: ignore[import-untyped]

        warn = RateLimitedLog(log, time.monotonic)
        for delay in refresh_delays(self.options.interval):
            if self.stopped.wait(delay):
                return
            try:
                with self.lock:
                    for request in [r for r in self.held if r.message.acknowledged]:
                        self.held.discard(request)
                    held = list(self.held)
                # a running task's delivery is its heartbeat's to keep (while it holds the lease)
                tags = [r.message.delivery_tag for r in held if r not in state.active_requests]
                if tags:
                    self.rescore(tags)
            except Exception as exc:  # a fault here must never stop the keeper nor the worker
                warn.warning("could not refresh the worker's held deliveries: %r", exc)

    def prerun(self, task_id: str, task: Any, **_: Any) -> None:
        stack = contextlib.ExitStack()
        # A replacement (task.replace()) has the id of the run it replaces, which sent it from
        # its body and ends just after: that run is the job's previous attempt, not a live
        # duplicate, so its end is waited for (up to ttl + interval) rather than refused.
        replaces = bool(getattr(task.request, "replaced_task_nesting", 0))
        deadline = time.monotonic() + self.options.claim_ttl
        refresh, claim = self.refresher(task)
        while True:
            pulse = pulse_sync(
                self.options, self.client(), task_id, task.name, refresh, claim=claim
            )
            try:
                stack.enter_context(pulse)
            except JobBusy:
                if not replaces or time.monotonic() >= deadline:
                    raise
                time.sleep(min(self.options.interval, 0.05))
                continue
            break
        with self.lock:
            self.running[task_id, threading.get_ident()] = stack

    def postrun(self, task_id: str, state: str | None = None, retval: Any = None, **_: Any) -> None:
        with self.lock:
            stack = self.running.pop((task_id, threading.get_ident()), None)
        if stack is None:
            return
        # Celery stored the result before sending task_postrun: jobpulse's final write is last
        if state is None:
            # The body never finished: Celery's tracer sends postrun from a `finally` while a
            # BaseException leaves the task — the SystemExit of a prefork child's SIGTERM
            # handler (revoke(terminate=True), a hard time limit), KeyboardInterrupt. Never
            # COMPLETED: the job was stopped from outside.
            leave_recorded(stack, _interrupted(sys.exc_info()[1]), task_id)
        elif state in _NOT_DONE and isinstance(retval, BaseException):
            leave_recorded(stack, retval, task_id)  # FAILED, or CANCELLED for JobCancelled
        else:
            leave_recorded(stack, None, task_id)


#: The states of a body that ended without doing its job: recorded FAILED with the exception.
#: IGNORED is ``raise Ignore()``, and ``task.replace()``, whose replacement runs under the same
#: task id: a new jobpulse run of the job.
_NOT_DONE = ("FAILURE", "RETRY", "REJECTED", "IGNORED")

_NOT_REDIS = (
    "jobpulse.integrations.celery: jobpulse writes to Redis, and the broker URL is not "
    "redis://, rediss:// or unix:// (redis+socket://); pass redis= (a redis.Redis)"
)


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
            (which must then be ``redis://``, ``rediss://`` or ``unix://``; a ``sentinel://``
            broker needs ``redis=``).
        sidecar: True (the default): each task's beats, and the refresh of its
            ``unacked_index`` entry, go out from jobpulse's helper process (one per worker
            process), so a body that holds the GIL delays neither; False: from threads of the
            worker process. With True, ``redis`` must be a client jobpulse can rebuild there
            (a plain ``redis.Redis``; TypeError here otherwise). A broker the helper cannot
            reach from its URL (``sentinel://``) is re-scored from the worker process.

    Returns:
        The app.

    Raises:
        ValueError, TypeError: an option is out of range, or ``redis`` is None and the broker
            URL is not ``redis://``, ``rediss://`` or ``unix://`` (``redis+socket://``) (checked
            here, before any Redis command).
    """
    options = PulseOptions(
        interval=interval, ttl=ttl, namespace=namespace, redis=redis, sidecar=sidecar
    )
    if getattr(app, "_jobpulse", None) is not None:
        return app
    if redis is None and _client_url(str(app.conf.broker_url or "")) is None:
        raise ValueError(_NOT_REDIS)
    hooks = _Instrumented(app, options)
    app._jobpulse = hooks

    def prerun(sender: Any = None, task_id: str = "", task: Any = None, **kw: Any) -> None:
        if task is not None and task.app is app:
            hooks.prerun(task_id, task)

    def postrun(sender: Any = None, task_id: str = "", task: Any = None, **kw: Any) -> None:
        if task is not None and task.app is app:
            hooks.postrun(task_id, kw.get("state"), kw.get("retval"))

    def received(sender: Any = None, request: Any = None, **kw: Any) -> None:
        if request is not None and getattr(request.task, "app", None) is app:
            hooks.received(request)

    def shutdown(sender: Any = None, **kw: Any) -> None:
        hooks.stopped.set()

    signals.task_prerun.connect(prerun, weak=False)
    signals.task_postrun.connect(postrun, weak=False)
    signals.task_received.connect(received, weak=False)
    signals.worker_shutdown.connect(shutdown, weak=False)
    return app
