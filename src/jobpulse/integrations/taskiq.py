"""taskiq integration: every task of a broker runs under a jobpulse heartbeat.

Install it on the broker (``pip install "jobpulse[taskiq]"``, which brings taskiq-redis)::

    from taskiq_redis import RedisStreamBroker
    from jobpulse.integrations.taskiq import instrument

    broker = instrument(RedisStreamBroker("redis://localhost:6379"))

Each task then runs inside ``heartbeat(redis, job_id_for(task_id), kind=<task name>)``
(``jobpulse.current()`` is that heartbeat). With taskiq-redis's ``RedisStreamBroker``, every
``interval`` seconds while the worker lives, each stream entry pending for the worker's consumer
is re-claimed by that consumer (``XCLAIM … 0 … JUSTID``: its idle time goes back to 0): the
entries of running tasks (while their heartbeat holds its lease) and the entries the broker read
ahead that wait for a slot (``xread_count``, 100 by default). The broker's ``XAUTOCLAIM`` hands on
only entries idle for ``idle_timeout``, so a live worker's deliveries are never delivered twice
and ``idle_timeout`` can be short; a dead worker's are handed on ``idle_timeout`` after it died.

A plain ``def`` task (taskiq runs it in a thread) beats from jobpulse's sidecar helper process
(``sidecar=True``, the default), which also re-claims that task's stream entry: a body holding
the GIL stops this worker's event loop, and with it the keeper, but not the helper.

Cancel: taskiq has no cancelled state. ``jobpulse.request_cancel()`` cancels the body, jobpulse
records CANCELLED, and taskiq records an error result whose error is ``JobCancelled`` (the
message is acknowledged as for any finished task, so it is not delivered again).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import anyio
from redis.asyncio import Redis
from taskiq import AsyncBroker, TaskiqMessage, TaskiqMiddleware, TaskiqResult
from taskiq_redis import RedisStreamBroker

from ._common import (
    WRAPPED,
    AsyncPulse,
    ClaimHold,
    HelperClaim,
    PulseOptions,
    job_id_for,
    keep_claim,
    run_in_thread,
)
from ._settle import SettledRun

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
        self.keeper: _DeliveryKeeper | None = None
        self._settling: dict[int, SettledRun] = {}  # by the message's id(): see settling()
        # The keeper's refresh loop, owned by this stack from startup to shutdown (the middleware
        # hooks are the only scope taskiq gives a worker-wide task).
        self._stack = contextlib.AsyncExitStack()

    async def startup(self) -> None:
        """Wrap every task registered by now (tasks are imported before the worker starts) and,
        in a worker of a ``RedisStreamBroker``, start keeping its consumer's deliveries fresh."""
        broker = self.broker
        if isinstance(broker, RedisStreamBroker):
            self.queue_redis = Redis(connection_pool=broker.connection_pool)
            if self.redis is None:
                self.redis = self.queue_redis
            if broker.is_worker_process and self.keeper is None:
                self.keeper = _DeliveryKeeper(broker, self.queue_redis)
                name = f"taskiq consumer {broker.consumer_name}"
                refresh = keep_claim(self.keeper.refresh, self.options.interval, job_id=name)
                await self._stack.enter_async_context(refresh)
        _wrap_tasks(self.broker, self)

    async def shutdown(self) -> None:
        """Stop keeping the deliveries fresh."""
        await self._stack.aclose()
        self.keeper = None

    def pre_execute(self, message: TaskiqMessage) -> TaskiqMessage:
        """Remember the message for the task's wrapper."""
        _MESSAGE.set(message)
        return message

    def settling(self, message: TaskiqMessage, run: SettledRun) -> None:
        """Hold ``run``'s heartbeat end until taskiq saved the message's result."""
        key = id(message)  # post_save gets this very message object
        self._settling[key] = run

        def forget(_: object) -> None:
            if self._settling.get(key) is run:
                del self._settling[key]

        run.host.add_done_callback(forget)

    async def post_save(self, message: TaskiqMessage, result: TaskiqResult[Any]) -> None:
        """taskiq saved the task's result: the heartbeat writes its end now."""
        run = self._settling.pop(id(message), None)
        if run is not None:
            await run.finished()


def instrument(
    broker: AsyncBroker,
    *,
    interval: float = 1.0,
    ttl: float = 6.0,
    namespace: str = "jobpulse",
    redis: Any = None,
    sidecar: bool = True,
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
        sidecar: True (the default): a plain ``def`` task (taskiq runs it in a thread) gets its
            beats, and its stream entry's refresh, from jobpulse's helper process, so a body
            that holds the GIL delays neither; ``async def`` tasks beat from the loop whatever
            this says. False: every task beats from the loop. With True, ``redis`` must be a
            client jobpulse can rebuild there (a plain ``redis.asyncio.Redis``; TypeError here
            otherwise).

    Returns:
        The broker, instrumented.

    Raises:
        ValueError, TypeError: an option is out of range (checked here, before any Redis command).
    """
    options = PulseOptions(
        interval=interval, ttl=ttl, namespace=namespace, redis=redis, sidecar=sidecar
    )
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
        keeper = middleware.keeper
        task_id = message.task_id

        async def body(hb: AsyncPulse) -> Any:
            if keeper is None:
                return await _call(fn, is_async, args, kwargs)
            with keeper.running(task_id, lambda: hb.lease_held):
                return await _call(fn, is_async, args, kwargs)

        options = middleware.options
        sidecar = options.sidecar and not is_async  # a thread's GIL hold starves the loop
        claim = None
        if sidecar and keeper is not None:
            claim = await keeper.helper_claim(task_id, options.interval)
        settled = SettledRun(
            options,
            middleware.redis,
            task_id,
            name,
            None,
            body,
            settle=True,
            wait=options.ttl,
            sidecar=sidecar,
            claim=claim,
        )
        middleware.settling(message, settled)
        return await settled.result(_shielded)

    setattr(run, WRAPPED, True)
    return run


async def _shielded(host: asyncio.Task[Any]) -> None:
    """Wait for the task's host (body and heartbeat) to end after a cancel.

    taskiq's ``timeout`` label cancels through an anyio cancel scope, which cancels the task
    again at every ``await`` until it leaves the scope: the heartbeat's final write would be
    cancelled too (the job left STALE instead of CANCELLED). So the body runs in a task of its
    own (:class:`SettledRun`); a cancellation of this one cancels it once and waits, shielded,
    for its heartbeat to write the end, then goes on.
    """
    with anyio.CancelScope(shield=True):
        await asyncio.wait({host})


async def _call(fn: Callable[..., Any], is_async: bool, args: Any, kwargs: Any) -> Any:
    if is_async:
        return await fn(*args, **kwargs)
    return await run_in_thread(fn, *args, **kwargs)  # a sync task: in a thread, as taskiq does


class _DeliveryKeeper:
    """Keeps every stream entry pending for this worker's consumer fresh (its idle time near 0).

    One refresh, every ``interval`` while the worker lives: list the consumer's pending entries
    (``XPENDING`` by consumer, a page at a time), read the task id of each entry not seen before
    (``XRANGE``; an entry never changes), and re-claim, in one script, every entry except those of
    a running task whose heartbeat no longer holds its lease (:class:`ClaimHold`, the rule of
    every claim keeper). Entries read ahead that wait for a slot are refreshed like running ones:
    the worker holds them. A dead worker refreshes nothing.
    """

    #: XPENDING page size.
    PAGE = 1000

    def __init__(self, broker: RedisStreamBroker, redis: Any) -> None:
        self._broker = broker
        self._redis = redis
        self._streams = [broker.queue_name, *broker.additional_streams]
        self._task_of: dict[bytes, str | None] = {}
        self._running: dict[str, tuple[ClaimHold, Callable[[], bool]]] = {}

    @contextlib.contextmanager
    def running(self, task_id: str, lease_held: Callable[[], bool]) -> Iterator[None]:
        """While the block runs, the task's entry is refreshed only while ``lease_held()``."""
        self._running[task_id] = (ClaimHold(), lease_held)
        try:
            yield
        finally:
            self._running.pop(task_id, None)

    async def helper_claim(self, task_id: str, period: float) -> HelperClaim | None:
        """The refresh of ``task_id``'s stream entries for the sidecar helper (a task run in a
        thread, whose GIL hold stops this loop, and with it :meth:`refresh`): the entries
        pending for this consumer whose message is the task's, found now. None when there is
        none (not delivered through the stream) or the helper cannot rebuild the client."""
        b = self._broker
        entries: list[tuple[str, bytes]] = []
        for stream in self._streams:
            ids = await self._pending(stream)
            await self._learn(stream, [i for i in ids if i not in self._task_of])
            entries += [(stream, i) for i in ids if self._task_of.get(i) == task_id]
        if not entries:
            return None
        touch = functools.partial(
            _touch_entries, b.consumer_group_name, b.consumer_name, tuple(entries)
        )
        return HelperClaim.of(self._redis, touch, period, job_id_for(task_id))

    def _holds(self, entry_id: bytes) -> bool:
        task_id = self._task_of.get(entry_id)
        run = self._running.get(task_id) if task_id is not None else None
        return run is None or run[0].ask(run[1]())

    async def refresh(self) -> None:
        b = self._broker
        seen: set[bytes] = set()
        for stream in self._streams:
            ids = await self._pending(stream)
            seen.update(ids)
            await self._learn(stream, [i for i in ids if i not in self._task_of])
            keep = [i for i in ids if self._holds(i)]
            if keep:
                args = [b.consumer_group_name, b.consumer_name, *keep]
                await self._redis.eval(_TOUCH, 1, stream, *args)
        for gone in self._task_of.keys() - seen:  # acknowledged or handed on: forget it
            del self._task_of[gone]

    async def _pending(self, stream: str) -> list[bytes]:
        """The ids of the entries pending for this consumer, all pages."""
        b = self._broker
        ids: list[bytes] = []
        start: str | bytes = "-"
        while True:
            page = await self._redis.xpending_range(
                stream, b.consumer_group_name, start, "+", self.PAGE, consumername=b.consumer_name
            )
            ids += [p["message_id"] for p in page]
            if len(page) < self.PAGE:
                return ids
            start = b"(" + ids[-1]

    async def _learn(self, stream: str, ids: list[bytes]) -> None:
        """Read the task id of each new entry (None: not a message this broker reads)."""
        if not ids:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for entry_id in ids:
                pipe.xrange(stream, entry_id, entry_id)
            entries = await pipe.execute()
        for entry_id, rows in zip(ids, entries, strict=True):
            data = rows[0][1].get(b"data") if rows else None
            self._task_of[entry_id] = None if data is None else _task_id(self._broker, data)


def _touch_entries(
    group: str, consumer: str, entries: tuple[tuple[str, bytes], ...], client: Any
) -> None:
    """(In the sidecar helper, with its blocking client) re-claim one task's entries, as
    :meth:`_DeliveryKeeper.refresh` does: only while still pending for ``consumer``."""
    for stream, entry_id in entries:
        client.eval(_TOUCH, 1, stream, group, consumer, entry_id)


def _task_id(broker: AsyncBroker, data: bytes) -> str | None:
    try:
        return broker.formatter.loads(message=data).task_id
    except Exception:  # not a message this broker can read: not ours
        return None
