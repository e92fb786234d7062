"""taskiq integration: every task of a broker runs under a jobpulse heartbeat.

Install it on the broker (``pip install "jobpulse[taskiq]"``, which brings taskiq-redis)::

    from taskiq_redis import RedisStreamBroker
    from jobpulse.integrations.taskiq import instrument

    broker = instrument(RedisStreamBroker("redis://localhost:6379"))

Each task then runs inside ``heartbeat(redis, job_id_for(task_id), kind=<task name>)``
(``jobpulse.current()`` is that heartbeat). With taskiq-redis's ``RedisStreamBroker``, while the
heartbeat lives the task's stream entry is re-claimed by its own consumer every ``interval``
seconds (``XCLAIM … 0 … JUSTID``: its idle time goes back to 0): the broker's ``XAUTOCLAIM``
hands on only entries idle for ``idle_timeout``, so a live task is never delivered twice and
``idle_timeout`` can be short.

Cancel: taskiq has no cancelled state. ``jobpulse.request_cancel()`` cancels the body, jobpulse
records CANCELLED, and taskiq records an error result whose error is ``JobCancelled`` (the
message is acknowledged as for any finished task, so it is not delivered again).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import anyio
from redis.asyncio import Redis
from taskiq import AsyncBroker, TaskiqMessage, TaskiqMiddleware
from taskiq_redis import RedisStreamBroker

from ._common import WRAPPED, PulseOptions, pulse, run_in_thread

__all__ = ["JobpulseMiddleware", "instrument"]

# The message of the task about to run, set by the middleware in the receiver's task, taken by
# the task's wrapper (which runs in the same asyncio task, so it sees the value).
_MESSAGE: ContextVar[TaskiqMessage | None] = ContextVar("jobpulse_taskiq_message", default=None)

# KEYS[1] the stream; ARGV[1] the consumer group, ARGV[2] this consumer, ARGV[3..] entry ids.
# Resets the idle time of each entry still pending for THIS consumer (XCLAIM with min-idle 0 and
# JUSTID, which does not count a delivery); an entry acknowledged or claimed by another consumer
# meanwhile is left alone. Returns how many entries were touched.
_TOUCH = """
local n = 0
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if p[1] and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    n = n + 1
  end
end
return n
"""


class JobpulseMiddleware(TaskiqMiddleware):
    """The middleware :func:`instrument` adds: it hands each task's message to the task's
    wrapper, and at startup wraps every task the broker knows.

    Args:
        options: the heartbeat options.
    """

    def __init__(self, options: PulseOptions) -> None:
        super().__init__()
        self.options = options
        self.redis: Any = options.redis  # jobpulse's client
        self.queue_redis: Any = None  # the broker's Redis (its stream)

    def startup(self) -> None:
        """Wrap every task registered by now (tasks are imported before the worker starts)."""
        if isinstance(self.broker, RedisStreamBroker):
            self.queue_redis = Redis(connection_pool=self.broker.connection_pool)
            if self.redis is None:
                self.redis = self.queue_redis
        _wrap_tasks(self.broker, self)

    def pre_execute(self, message: TaskiqMessage) -> TaskiqMessage:
        """Remember the message for the task's wrapper."""
        _MESSAGE.set(message)
        return message


def instrument(
    broker: AsyncBroker,
    *,
    interval: float = 1.0,
    ttl: float = 6.0,
    namespace: str = "jobpulse",
    redis: Any = None,
) -> AsyncBroker:
    """Instrument a taskiq broker: every task runs under a heartbeat.

    Adds :class:`JobpulseMiddleware`; tasks are wrapped when the broker starts up (so tasks
    registered after this call are included). Returns the broker.

    Args:
        broker: a taskiq broker; the stream entry is kept fresh for taskiq-redis's
            ``RedisStreamBroker`` (other brokers have no redelivery to prevent).
        interval: seconds between beats and between refreshes of the stream entry.
        ttl: the heartbeat's lease time.
        namespace: jobpulse's key prefix.
        redis: the ``redis.asyncio`` client for jobpulse; None uses the broker's connection pool
            (required for a broker that is not a taskiq-redis broker).

    Returns:
        The broker, instrumented.

    Raises:
        ValueError, TypeError: an option is out of range (checked here, before any Redis command).
    """
    options = PulseOptions(interval=interval, ttl=ttl, namespace=namespace, redis=redis)
    if redis is None and not isinstance(broker, RedisStreamBroker):
        raise TypeError("jobpulse.integrations.taskiq needs redis= for a non-Redis-stream broker")
    broker.add_middlewares(JobpulseMiddleware(options))
    return broker


def _wrap_tasks(broker: AsyncBroker, middleware: JobpulseMiddleware) -> None:
    for task in broker.get_all_tasks().values():
        fn = task.original_func
        if not getattr(fn, WRAPPED, False):
            task.original_func = _wrap(fn, task.task_name, middleware)


def _wrap(fn: Callable[..., Any], name: str, middleware: JobpulseMiddleware) -> Any:
    is_async = asyncio.iscoroutinefunction(fn)

    @functools.wraps(fn)
    async def run(*args: Any, **kwargs: Any) -> Any:
        message = _MESSAGE.get()
        _MESSAGE.set(None)  # a task function called from inside this task runs plainly
        if message is None or message.task_name != name:
            return await _call(fn, is_async, args, kwargs)
        broker = middleware.broker
        refresh = _noop
        if isinstance(broker, RedisStreamBroker):
            refresh = _EntryKeeper(broker, middleware.queue_redis, message).refresh

        async def pulsed() -> Any:
            async with pulse(middleware.options, middleware.redis, message.task_id, name, refresh):
                return await _call(fn, is_async, args, kwargs)

        return await _ended(asyncio.get_running_loop().create_task(pulsed()))

    setattr(run, WRAPPED, True)
    return run


async def _ended(job: asyncio.Task[Any]) -> Any:
    """Wait for the task's own asyncio task (body and heartbeat) to end, and pass its outcome on.

    taskiq's ``timeout`` label cancels through an anyio cancel scope, which cancels the task
    again at every ``await`` until it leaves the scope: the heartbeat's final write would be
    cancelled too (the job left STALE instead of CANCELLED). So the body runs in a task of its
    own; a cancellation of this one cancels it once and waits, shielded, for its heartbeat to
    write the end, then goes on.
    """
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        job.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.wait({job})
        raise


async def _call(fn: Callable[..., Any], is_async: bool, args: Any, kwargs: Any) -> Any:
    if is_async:
        return await fn(*args, **kwargs)
    return await run_in_thread(fn, *args, **kwargs)  # a sync task: in a thread, as taskiq does


async def _noop() -> None:
    return None


class _EntryKeeper:
    """Keeps the stream entry of one running task fresh (its idle time near 0)."""

    def __init__(self, broker: RedisStreamBroker, redis: Any, message: TaskiqMessage) -> None:
        self._broker = broker
        self._redis = redis
        self._message = message
        self._stream = str(message.labels.get("queue_name") or broker.queue_name)
        self._ids: list[bytes] = []

    async def refresh(self) -> None:
        if not self._ids:
            self._ids = await self._find()
        if self._ids:
            b = self._broker
            args = [b.consumer_group_name, b.consumer_name, *self._ids]
            await self._redis.eval(_TOUCH, 1, self._stream, *args)

    async def _find(self) -> list[bytes]:
        """The ids of this consumer's pending entries that carry this task (by task id)."""
        b = self._broker
        pending = await self._redis.xpending_range(
            self._stream, b.consumer_group_name, "-", "+", 1000, consumername=b.consumer_name
        )
        ids = [p["message_id"] for p in pending]
        if not ids:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for entry_id in ids:
                pipe.xrange(self._stream, entry_id, entry_id)
            entries = await pipe.execute()
        found = []
        for rows in entries:
            for entry_id, fields in rows:
                data = fields.get(b"data")
                if data is not None and _task_id(b, data) == self._message.task_id:
                    found.append(entry_id)
        return found


def _task_id(broker: AsyncBroker, data: bytes) -> str | None:
    try:
        return broker.formatter.loads(message=data).task_id
    except Exception:  # not a message this broker can read: not ours
        return None
