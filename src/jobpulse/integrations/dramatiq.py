"""Dramatiq integration: every message runs under a ``jobpulse.sync`` heartbeat.

Install it on the broker (``pip install "jobpulse[dramatiq]"``)::

    from dramatiq.brokers.redis import RedisBroker
    from jobpulse.integrations.dramatiq import instrument

    broker = RedisBroker(url="redis://localhost:6379/0")
    instrument(broker)
    dramatiq.set_broker(broker)

``instrument`` adds a :class:`JobpulseMiddleware` last (its ``before_process_message`` enters
the heartbeat after every other middleware's; its ``after_process_message`` marks a cancelled
message not to be retried before the Retries middleware's runs) and a companion first (its
``after_process_message`` runs last and leaves the heartbeat: jobpulse's final write comes after
Retries decided and Results stored the return value, wherever Results was added). Each message
then runs inside ``jobpulse.sync.heartbeat(redis, job_id_for(message.message_id),
kind=message.actor_name)`` in the worker thread that runs the actor (``jobpulse.current()`` is
that heartbeat there).

Redelivery: the Redis broker keeps one heartbeat per worker process (``__heartbeats__``, written
by every fetch of its consumer threads, which keep polling while actors run and during a graceful
shutdown) and requeues the unacked messages of a process silent for ``heartbeat_timeout`` (60 s)
at a maintenance run. A live process's messages are therefore never requeued, so there is no
claim for jobpulse to refresh; a SIGKILLed worker's messages are requeued once, by Dramatiq,
``heartbeat_timeout`` after it died, and the next attempt takes the job over (``resume_from``).

Sidecar (the default): the message's beats go out from jobpulse's helper process (one per worker
process, ending with it), so an actor that holds the GIL is never read STALE; ``sidecar=False``
beats from a thread of the worker process. (Dramatiq's own heartbeat stops during such a hold.)

Cancel: ``jobpulse.request_cancel()`` reaches the actor through ``current().check()``, which
raises ``JobCancelled``; the message is failed without a retry (``JobCancelled`` is added to its
``throws``), so Dramatiq dead-letters it and the Results middleware stores the exception, and
jobpulse records CANCELLED.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from dramatiq import Broker, Middleware

from ..errors import JobCancelled
from ._common import PulseOptions, leave_recorded, pulse_sync

__all__ = ["JobpulseMiddleware", "instrument"]


class JobpulseMiddleware(Middleware):
    """Runs every message under a ``jobpulse.sync`` heartbeat (see :func:`instrument`).

    Installed by :func:`instrument`, it enters the heartbeat last of the broker's
    ``before_process_message`` hooks, and a companion middleware it puts first in the list
    leaves it last of the ``after_process_message`` hooks: jobpulse's final write comes after
    Retries decided and Results stored the return value. Added on its own, it leaves the
    heartbeat in its own ``after_process_message``.

    Args:
        options: the heartbeat options.
    """

    def __init__(self, options: PulseOptions) -> None:
        self.options = options
        # keyed by (message id, thread): a message's before and after hooks run in one thread
        self._running: dict[tuple[str, int], contextlib.ExitStack] = {}
        self._lock = threading.Lock()
        self._ends_last = False  # a _FinalWrite middleware, first in the list, leaves heartbeats

    def before_process_message(self, broker: Broker, message: Any) -> None:
        """Enter the message's heartbeat in the worker thread that runs it."""
        client: Any = self.options.redis
        if client is None:
            client = getattr(broker, "client", None)  # the RedisBroker's redis.Redis
        stack = contextlib.ExitStack()
        stack.enter_context(
            pulse_sync(self.options, client, message.message_id, message.actor_name, None)
        )
        with self._lock:
            self._running[message.message_id, threading.get_ident()] = stack

    def after_process_message(
        self,
        broker: Broker,
        message: Any,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        """A cancelled message is not retried; the heartbeat ends here unless a companion ends it
        after the other middleware."""
        if isinstance(exception, JobCancelled):
            # cancelled on request: no retry (the Retries middleware, whose hook runs after this
            # one, honours ``throws``)
            throws = message.options.get("throws") or ()
            throws = throws if isinstance(throws, tuple) else (throws,)
            message.options["throws"] = (JobCancelled, *throws)
        if not self._ends_last:
            self._end(message, exception)

    def after_skip_message(self, broker: Broker, message: Any) -> None:
        """A skipped message ends its heartbeat COMPLETED (Dramatiq did not run it to fail)."""
        if not self._ends_last:
            self._end(message, None)

    def _end(self, message: Any, exception: BaseException | None) -> None:
        """Leave the message's heartbeat: COMPLETED, FAILED or CANCELLED as the actor ended."""
        with self._lock:
            stack = self._running.pop((message.message_id, threading.get_ident()), None)
        if stack is not None:
            leave_recorded(stack, exception, message.message_id)


class _FinalWrite(Middleware):
    """First in the broker's list, so its ``after_*`` hooks run last: it leaves the heartbeats of
    a :class:`JobpulseMiddleware` once every other middleware handled the message."""

    def __init__(self, pulse: JobpulseMiddleware) -> None:
        self.pulse = pulse
        pulse._ends_last = True

    def after_process_message(
        self,
        broker: Broker,
        message: Any,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        self.pulse._end(message, exception)

    def after_skip_message(self, broker: Broker, message: Any) -> None:
        self.pulse._end(message, None)


def instrument(
    broker: Broker,
    *,
    interval: float = 1.0,
    ttl: float = 6.0,
    namespace: str = "jobpulse",
    redis: Any = None,
    sidecar: bool = True,
) -> JobpulseMiddleware:
    """Instrument a Dramatiq broker: every message it runs goes under a heartbeat.

    Call it where the broker is made, before workers start. Idempotent per broker.

    Args:
        broker: the Dramatiq broker (a ``RedisBroker``, or any broker with ``redis=`` given).
        interval: seconds between beats.
        ttl: the heartbeat's lease time (a dead worker's message is STALE after at most ``ttl``).
        namespace: jobpulse's key prefix.
        redis: the ``redis.Redis`` client jobpulse writes to; None uses the Redis broker's client.
        sidecar: True (the default): each message's beats go out from jobpulse's helper
            process (one per worker process), so a body that holds the GIL cannot delay them;
            False: from a thread of the worker process. With True, ``redis`` must be a client
            jobpulse can rebuild there (a plain ``redis.Redis``; TypeError here otherwise).

    Returns:
        The middleware added to the broker.

    Raises:
        ValueError, TypeError: an option is out of range, or the broker is not a Redis broker
            and ``redis`` is None (checked here, before any Redis command).
    """
    options = PulseOptions(
        interval=interval, ttl=ttl, namespace=namespace, redis=redis, sidecar=sidecar
    )
    for existing in broker.middleware:
        if isinstance(existing, JobpulseMiddleware):
            return existing
    if redis is None and getattr(broker, "client", None) is None:
        raise ValueError(
            "jobpulse.integrations.dramatiq: the broker has no Redis client; pass redis="
        )
    middleware = JobpulseMiddleware(options)
    broker.add_middleware(middleware)
    # first of all: its after hooks run last, wherever Results and the others were added
    broker.add_middleware(_FinalWrite(middleware), before=type(broker.middleware[0]))
    return middleware
