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
pipeline is bounded by the smallest lease time left among its jobs.

The ticker's task lives exactly as long as it has jobs: the first ``add`` starts it, it returns
when the last job is removed. The registry maps a client to its ticker weakly, so an idle
ticker is collected with nothing left running.
"""

from __future__ import annotations

import asyncio
import logging
import math
import weakref
from collections.abc import Callable
from typing import Any

from .._protocol.clock import clock_of
from .._protocol.cluster import pipelined
from .._protocol.deadline import cancellable
from .._protocol.errors import is_redis_fault, tolerate_faults
from .._protocol.ratelimit import RateLimitedLog
from .._protocol.wire import exchange, fast_client
from .plan import CHUNK, Beating, BeatPlan, beat_calls, beat_commands, pack_beats, settle_beats
from .sampling import ProcessSample, ProcessSampler
from .stats import WORKER_STATS

__all__ = ["CHUNK", "SENDS", "Ticker"]

log = logging.getLogger("jobpulse")
SENDS = 16
"""Pipelines in flight at once per client: redis-py's pool refuses a 101st connection by
default (MaxConnectionsError), and a few pipelines already keep one Redis busy."""
_TICKERS: weakref.WeakValueDictionary[int, Ticker] = weakref.WeakValueDictionary()


class Ticker:
    """Beats every registered job of one asyncio Redis client. Use :meth:`for_client`."""

    def __init__(self, redis: Any, clock: Callable[[], float]) -> None:
        self._redis = redis
        self._clock = clock
        self._plan: BeatPlan[Beating] = BeatPlan()
        self._next_wake = math.inf
        self._wake = asyncio.Event()
        # The one ``_run`` loop, or None. Set when a loop starts and cleared by that loop, in the
        # same step in which it finds no jobs left (no await in between): ``add`` starts a loop
        # exactly when none is looping, so two loops never beat the same jobs.
        self._task: asyncio.Task[None] | None = None
        self._sampler = ProcessSampler(clock)
        self._warn = RateLimitedLog(log, clock)
        self._sends = asyncio.Semaphore(SENDS)
        self._server_delta: float | None = None  # server clock (s) minus our clock
        self.packed = fast_client(redis)  # a tick: one packed write on a pooled connection
        self.pipelines = 0

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

    def slot(self) -> asyncio.Semaphore:
        """One of the ``SENDS`` connections jobpulse may use on this client at once: every
        acquire, final write and beat pipeline takes one, so a burst of jobs entering or leaving
        together waits here instead of exhausting redis-py's pool (MaxConnectionsError)."""
        return self._sends

    def sample(self) -> ProcessSample:
        return self._sampler.sample()

    def __repr__(self) -> str:
        running = self._task is not None
        return f"<Ticker jobs={len(self._plan)} pipelines={self.pipelines} running={running}>"

    async def _run(self) -> None:
        me = asyncio.current_task()
        try:
            async with asyncio.TaskGroup() as sends:
                intended: float | None = None
                while self._plan:
                    now = self._clock()
                    lag = 0.0 if intended is None else max(0.0, now - intended)
                    if intended is not None:
                        WORKER_STATS.lagged(lag)
                    due = self._plan.take_due(now)
                    if due:
                        await self._dispatch(due, now, lag, sends)
                    intended = await self._sleep()
                # No job left, decided with no await since the check: from here on ``add``
                # starts a new loop; this task only waits for its last sends (of ended jobs).
                self._release(me)
        except Exception as exc:  # a bug, not a Redis fault: those are handled per send
            self._release(me)
            log.exception("jobpulse ticker crashed; stopping its jobs")
            for job in list(self._plan.jobs.values()):
                job.crashed(exc)
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

    async def _dispatch(
        self, due: list[Beating], now: float, lag: float, sends: asyncio.TaskGroup
    ) -> None:
        sample = self._sampler.sample()
        for start in range(0, len(due), CHUNK):
            chunk = due[start : start + CHUNK]
            beats = [(job, job.beat(now, lag, sample)) for job in chunk]
            sends.create_task(self._send(beats, now))
            if start + CHUNK < len(due):
                await asyncio.sleep(0)  # never block the loop for a whole 10,000-job tick

    def _server_now(self) -> Callable[[], float] | None:
        delta = self._server_delta
        return None if delta is None else (lambda: self._clock() + delta)

    async def _send(self, beats: list[tuple[Beating, list[Any]]], sent_at: float) -> None:
        jobs = [job for job, _ in beats]
        # one beat.lua call per BATCH jobs (per hash slot on a cluster client)
        batches = beat_calls(beats, getattr(self._redis, "keyslot", None))
        budget = min(job.machine.beat_budget(sent_at) for job in jobs)
        index = self._plan.index_refresh(jobs, self._server_now())
        clock = clock_of(self._redis)
        try:
            async with asyncio.timeout(budget), self._sends:
                await clock.sample(self._redis)  # argument time only, when due: else nothing
                if self.packed:
                    packed = pack_beats(batches, index, clock)
                    count = len(batches) + len(index)
                    results = await cancellable(exchange(self._redis, packed, count))
                else:  # a cluster (ASK followed on one connection) or one connection
                    commands = beat_commands(batches, index, clock)
                    results = await cancellable(pipelined(self._redis, commands))
            self.pipelines += 1
            WORKER_STATS.beats += len(jobs)
        except Exception as exc:
            if not is_redis_fault(exc):
                raise
            for job in jobs:
                job.beat_failed(sent_at, exc, quiet=True, at_once=False)
            self._warn.warning("beats of %d job(s) failed, retrying: %r", len(jobs), exc)
            return
        settled = settle_beats([b for b, _ in batches], results, index, sent_at, clock)
        if settled.index_failure is not None:  # the next refresh will retry
            self._warn.warning("running-index refresh failed: %r", settled.index_failure)
        if settled.server_ms is not None:
            self._server_delta = settled.server_ms / 1000 - sent_at
        for script in settled.load:
            with tolerate_faults(lambda _: None):  # the beats are retried, and so is the load
                await self._redis.script_load(script.text)
