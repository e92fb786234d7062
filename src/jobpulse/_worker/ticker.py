"""One ticker per asyncio Redis client beats every job of the process.

One task and one round trip per job tops out near 4,000 beats/s; here every tick takes the jobs
that are due from the shared :class:`~jobpulse._worker.plan.BeatPlan` (those due within a tenth
of their interval too, so beats coalesce), builds their beats synchronously in chunks of
``CHUNK`` (yielding to the loop between chunks), and sends each chunk's ``EVALSHA`` calls and
index ``ZADD``s on its own connection: on a plain client as one write packed by jobpulse
(:func:`~jobpulse._worker.plan.pack_beats`, :func:`~jobpulse._protocol.wire.exchange`), on a
cluster as commands routed per node (:func:`~jobpulse._protocol.cluster.pipelined`, which
follows ASK on one connection), on a ``single_connection_client`` as one redis-py pipeline;
:func:`~jobpulse._worker.plan.settle_beats` hands the replies back. Lease deadlines are loop
timers of each job (see ``JobHeartbeat._arm_expiry``), never checked by waiting for a reply, so
a job's local-ttl stop does not depend on the ticker or on another job's slow reply; each
pipeline is bounded by :func:`~jobpulse._worker.plan.chunk_budget` (the smallest lease time left
among its jobs, but at least an interval).

Overload degrades the beat rate, not the leases (:class:`~jobpulse._worker.plan.SendGate`
decides, this shell only waits): the ticker takes at most ``CHUNK`` due jobs at a time, in lease
deadline order, and only once it holds a connection, so a beat is built (and counts as a try)
when it can be sent; beats take a free connection before acquires and final writes; and new
jobs start entering ``ENTERING`` at a time, one at a time while a running job's lease presses
(waiting to enter writes nothing and starts no timeout). Each beat reports how late it
went out (``loop_lag_ms``, the loop-lag metric): the loop's lateness, or the beats' own when
the ticker cannot keep up.

The ticker's task lives exactly as long as it has jobs: the first ``add`` starts it, it returns
when the last job is removed. The registry maps a client to its ticker weakly, so an idle
ticker is collected with nothing left running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

from .._protocol.clock import clock_of
from .._protocol.cluster import pipelined
from .._protocol.deadline import cancellable
from .._protocol.errors import tolerate_faults
from .._protocol.wire import exchange
from .plan import CHUNK, Beating, SendGate, beat_commands, chunk_budget, pack_beats
from .sampling import ProcessSample
from .stats import WORKER_STATS
from .tick import TickCore

__all__ = ["CHUNK", "SENDS", "Ticker"]

log = logging.getLogger("jobpulse")
SENDS = 16
"""Pipelines in flight at once per client: redis-py's pool refuses a 101st connection by
default (MaxConnectionsError), and a few pipelines already keep one Redis busy."""
_TICKERS: weakref.WeakValueDictionary[int, Ticker] = weakref.WeakValueDictionary()


class Ticker(TickCore):
    """Beats every registered job of one asyncio Redis client. Use :meth:`for_client`."""

    def __init__(self, redis: Any, clock: Callable[[], float]) -> None:
        super().__init__(redis, clock)
        self._next_wake = math.inf
        self._wake = asyncio.Event()
        # The one ``_run`` loop, or None. Set when a loop starts and cleared by that loop, in the
        # same step in which it finds no jobs left (no await in between): ``add`` starts a loop
        # exactly when none is looping, so two loops never beat the same jobs.
        self._task: asyncio.Task[None] | None = None
        self._gate: SendGate[asyncio.Future[None]] = SendGate(SENDS)

    @classmethod
    def for_client(cls, redis: Any, clock: Callable[[], float]) -> Ticker:
        """The ticker of ``redis`` (created on first use). Tickers hold their client strongly,
        so an ``id`` cannot be reused while its ticker lives."""
        ticker = _TICKERS.get(id(redis))
        if ticker is None:
            ticker = _TICKERS[id(redis)] = cls(redis, clock)
        return ticker

    def add(self, job: Beating) -> None:
        self._plan.add(job)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="jobpulse-ticker")
        self._wake_if(job.machine.due)

    def remove(self, job: Beating) -> None:
        """Forget ``job``; its heap entries are dropped when they surface."""
        self._plan.remove(job)
        if not self._plan:
            self._wake.set()

    def schedule(self, job: Beating) -> None:
        """Plan ``job``'s next beat at ``job.machine.due``."""
        self._plan.schedule(job)
        self._wake_if(job.machine.due)

    def _wake_if(self, when: float) -> None:
        if when < self._next_wake:
            self._wake.set()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """One of the ``SENDS`` connections jobpulse may use on this client at once: every
        acquire, final write and beat pipeline takes one, so a burst of jobs entering or leaving
        together waits here instead of exhausting redis-py's pool (MaxConnectionsError). Beat
        pipelines take a freed one first."""
        await self._take(beat=False)
        try:
            yield
        finally:
            self._give_back()

    @contextlib.asynccontextmanager
    async def entering(self) -> AsyncIterator[None]:
        """Hold the body of ``async with`` while a new job enters: waits (writing nothing)
        for its turn (``ENTERING`` at a time, one at a time while a running job's lease
        presses)."""
        waiter = asyncio.get_running_loop().create_future()
        if not self._gate.enter(waiter, pressing=self._plan.pressing(self._clock())):
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():  # admitted, then cancelled
                    self._entered()
                else:
                    self._gate.forget(waiter)
                raise
        try:
            yield
        finally:
            self._entered()

    def _entered(self) -> None:
        self._gate.entered()
        self._admit()

    def _admit(self) -> None:
        """Wake the new jobs the gate lets enter now."""
        while self._gate.waiting:  # else nothing to decide: the plan is not asked (per tick)
            stale = 0
            for waiter in self._gate.admit(pressing=self._plan.pressing(self._clock())):
                if waiter.done():  # cancelled while it waited: it does not enter
                    stale += 1
                else:
                    waiter.set_result(None)
            if not stale:
                return
            for _ in range(stale):
                self._gate.entered()

    async def _take(self, *, beat: bool) -> None:
        waiter = asyncio.get_running_loop().create_future()
        if self._gate.take(waiter, beat=beat):
            return
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():  # the slot was handed, then cancelled
                self._give_back()
            else:
                self._gate.forget(waiter)
            raise

    def _give_back(self) -> None:
        while (waiter := self._gate.give_back()) is not None:
            if not waiter.done():  # a cancelled waiter passes the slot on
                waiter.set_result(None)
                return

    def sample(self) -> ProcessSample:
        return self._sampler.sample()

    def __repr__(self) -> str:
        running = self._task is not None
        return (
            f"<Ticker jobs={len(self._plan)} pipelines={self.pipelines} "
            f"entering={self._gate.entering} waiting={self._gate.waiting} running={running}>"
        )

    async def _run(self) -> None:
        me = asyncio.current_task()
        try:
            async with asyncio.TaskGroup() as sends:
                intended: float | None = None
                while self._plan:
                    now = self._clock()
                    lag = self._lag(now, intended)
                    self._admit()
                    if self._plan.has_due(now):
                        await self._dispatch(lag, sends)
                        intended = None
                        continue
                    intended = await self._sleep()
                # No job left, decided with no await since the check: from here on ``add``
                # starts a new loop; this task only waits for its last sends (of ended jobs).
                self._release(me)
        except Exception as exc:  # a bug, not a Redis fault: those are handled per send
            self._release(me)
            self._crashed(exc)
        finally:
            self._release(me)

    def _release(self, task: asyncio.Task[Any] | None) -> None:
        if self._task is task:
            self._task = None

    async def _sleep(self) -> float | None:
        """Sleep until the first planned beat or a wake-up; return the time we meant to wake
        at if we slept the whole way (the loop lag is measured against it)."""
        self._wake.clear()
        if not self._plan:
            return None
        when = self._plan.first()
        timeout = when - self._clock()
        if timeout <= 0:
            await asyncio.sleep(0)
            return None
        self._next_wake = when
        try:
            async with asyncio.timeout(None if math.isinf(timeout) else timeout):
                await self._wake.wait()
        except TimeoutError:
            return when
        finally:
            self._next_wake = math.inf
        return None

    async def _dispatch(self, lag: float, sends: asyncio.TaskGroup) -> None:
        """Take a connection (before any acquire or final write), then the ``CHUNK`` due jobs
        closest to their lease deadlines, and send their beats on it."""
        await self._take(beat=True)
        try:
            now = self._clock()
            chunk = self._plan.take_due(now, CHUNK)
            if chunk:
                late = max(lag, self._plan.lateness(chunk, now))
                if late > lag:
                    WORKER_STATS.lagged(late)
                sample = self._sampler.sample()
                beats = [(job, job.beat(now, late, sample)) for job in chunk]
                sends.create_task(self._send(beats, now))
                await asyncio.sleep(0)  # never block the loop for a whole 10,000-job tick
                return
        except BaseException:
            self._give_back()
            raise
        self._give_back()  # nothing was due any more (ended or in flight)

    async def _send(self, beats: list[tuple[Beating, list[Any]]], sent_at: float) -> None:
        """Send a chunk's beats on the connection ``_dispatch`` took for it (given back here)."""
        try:
            await self._send_held(beats, sent_at)
        finally:
            self._give_back()

    async def _send_held(self, beats: list[tuple[Beating, list[Any]]], sent_at: float) -> None:
        jobs, batches, index = self._calls(beats)
        budget = chunk_budget(
            [job.machine.beat_budget(sent_at) for job in jobs],
            [job.machine.cfg.interval for job in jobs],
        )
        clock = clock_of(self._redis)
        try:
            async with asyncio.timeout(budget):
                await clock.sample(self._redis)  # argument time only, when due: else nothing
                if self.packed:
                    packed = pack_beats(batches, index, clock)
                    count = len(batches) + len(index)
                    results = await cancellable(exchange(self._redis, packed, count))
                else:  # a cluster (ASK followed on one connection) or one connection
                    commands = beat_commands(batches, index, clock)
                    results = await cancellable(pipelined(self._redis, commands))
            self._sent(jobs)
        except Exception as exc:
            self._failed(jobs, sent_at, exc)
            return
        for script in self._settled(batches, results, index, sent_at, clock):
            with tolerate_faults(lambda _: None):  # the beats are retried, and so is the load
                await self._redis.script_load(script.text)
