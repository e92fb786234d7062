"""One ticker per Redis client beats every job of the process.

One task and one round trip per job tops out near 4,000 beats/s; here every tick takes the jobs
that are due from a heap, with those due within a tenth of their interval (so beats coalesce;
a tick costs O(due · log n), never a scan of every job), builds their beats synchronously in
chunks of ``CHUNK`` (yielding to the loop between chunks), and sends each chunk as one pipeline of
``EVALSHA`` on its own connection. Lease deadlines are loop timers of each job (see
``JobHeartbeat._arm_expiry``), never checked by waiting for a reply, so a job's local-ttl stop
does not depend on the ticker or on another job's slow reply; each pipeline is bounded by the
smallest lease time left among its jobs.

The ticker's task lives exactly as long as it has jobs: the first ``add`` starts it, it returns
when the last job is removed. The registry maps a client to its ticker weakly, so an idle
ticker is collected with nothing left running.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._protocol.errors import is_noscript, is_redis_fault
from .._protocol.scripts import SCRIPTS
from .ratelimit import RateLimitedLog
from .sampling import ProcessSample, ProcessSampler
from .stats import WORKER_STATS

if TYPE_CHECKING:
    from .heartbeat import JobHeartbeat

__all__ = ["CHUNK", "Ticker"]

log = logging.getLogger("jobpulse")
CHUNK = 256
COALESCE = 0.1
"""A beat may go out this fraction of its interval early, to share a pipeline."""
SENDS = 16
"""Pipelines in flight at once per client: redis-py's pool refuses a 101st connection by
default (MaxConnectionsError), and a few pipelines already keep one Redis busy."""
_TICKERS: weakref.WeakValueDictionary[int, Ticker] = weakref.WeakValueDictionary()


class Ticker:
    """Beats every registered job of one Redis client. Use :meth:`for_client`."""

    def __init__(self, redis: Any, clock: Callable[[], float]) -> None:
        self._redis = redis
        self._clock = clock
        self._jobs: dict[int, JobHeartbeat] = {}
        # (when, order, job): a job may have stale entries; only the one equal to its
        # ``_planned`` counts. Invariant: every registered job not in flight has a live entry.
        self._plan: list[tuple[float, int, JobHeartbeat]] = []
        self._order = itertools.count()
        self._next_wake = math.inf
        self._wake = asyncio.Event()
        self._running = False
        self._task: asyncio.Task[None] | None = None
        self._sampler = ProcessSampler(clock)
        self._warn = RateLimitedLog(log, clock)
        self._sends = asyncio.Semaphore(SENDS)
        self._server_delta: float | None = None  # server clock (s) minus our clock
        self.pipelines = 0

    @classmethod
    def for_client(cls, redis: Any, clock: Callable[[], float]) -> Ticker:
        """The ticker of ``redis`` (created on first use). Tickers hold their client strongly,
        so an ``id`` cannot be reused while its ticker lives."""
        ticker = _TICKERS.get(id(redis))
        if ticker is None:
            ticker = _TICKERS[id(redis)] = cls(redis, clock)
        return ticker

    def add(self, job: JobHeartbeat) -> None:
        self._jobs[id(job)] = job
        if not self._running:
            self._running = True
            self._task = asyncio.get_running_loop().create_task(self._run(), name="jobpulse-ticker")
        self.schedule(job)

    def remove(self, job: JobHeartbeat) -> None:
        """Forget ``job``; its heap entries are dropped when they surface."""
        self._jobs.pop(id(job), None)
        if not self._jobs:
            self._wake.set()

    def schedule(self, job: JobHeartbeat) -> None:
        """Plan ``job``'s next beat at ``job._due``."""
        when = job._due
        job._planned = when
        heapq.heappush(self._plan, (when, next(self._order), job))
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
        return f"<Ticker jobs={len(self._jobs)} pipelines={self.pipelines} running={self._running}>"

    async def _run(self) -> None:
        try:
            async with asyncio.TaskGroup() as sends:
                intended: float | None = None
                while self._jobs:
                    now = self._clock()
                    lag = 0.0 if intended is None else max(0.0, now - intended)
                    if intended is not None:
                        WORKER_STATS.lagged(lag)
                    due = self._take_due(now)
                    if due:
                        await self._dispatch(due, now, lag, sends)
                    intended = await self._sleep()
                self._running = False
        except Exception as exc:  # a bug, not a Redis fault: those are handled per send
            self._running = False
            log.exception("jobpulse ticker crashed; stopping its jobs")
            for job in list(self._jobs.values()):
                job._crashed(exc)
        finally:
            self._running = False

    def _take_due(self, now: float) -> list[JobHeartbeat]:
        """Pop the jobs due now and those due within a tenth of their interval: beats of jobs
        started at scattered times coalesce into a few pipelines per interval, not one each."""
        due: list[JobHeartbeat] = []
        plan = self._plan
        while plan and plan[0][0] - COALESCE * plan[0][2]._cfg.interval <= now:
            when, _, job = heapq.heappop(plan)
            live = self._jobs.get(id(job)) is job and job._planned == when
            if live and job._inflight is None and job._lease.held:
                due.append(job)
        return due

    async def _sleep(self) -> float | None:
        """Sleep until the first planned beat or a wake-up; return the time we meant to wake
        at if we slept the whole way (the loop lag is measured against it)."""
        self._wake.clear()
        if not self._jobs:
            return None
        when = self._plan[0][0] if self._plan else math.inf
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
        self, due: list[JobHeartbeat], now: float, lag: float, sends: asyncio.TaskGroup
    ) -> None:
        sample = self._sampler.sample()
        for start in range(0, len(due), CHUNK):
            chunk = due[start : start + CHUNK]
            beats = [(job, job._next_beat(now, lag, sample)) for job in chunk]
            sends.create_task(self._send(beats, now))
            if start + CHUNK < len(due):
                await asyncio.sleep(0)  # never block the loop for a whole 10,000-job tick

    async def _send(self, beats: list[tuple[JobHeartbeat, list[Any]]], sent_at: float) -> None:
        jobs = [job for job, _ in beats]
        budget = max(0.05, min(job._lease.left(sent_at) for job in jobs))
        index = self._index_refresh(jobs)
        try:
            async with asyncio.timeout(budget), self._sends:
                pipe = self._redis.pipeline(transaction=False)
                for _job, args in beats:
                    # execute_command: redis-py blocks pipe.evalsha() on RedisCluster pipelines
                    pipe.execute_command("EVALSHA", *args)
                for key, members in index.items():
                    pipe.zadd(key, members, gt=True)  # a deadline never moves back
                results = await pipe.execute(raise_on_error=False)
            self.pipelines += 1
            WORKER_STATS.beats += len(jobs)
        except Exception as exc:
            if not is_redis_fault(exc):
                raise
            for job in jobs:
                job._beat_failed(sent_at, exc, quiet=True)
            self._warn.warning("beats of %d job(s) failed, retrying: %r", len(jobs), exc)
            return
        for members, result in zip(index.values(), results[len(jobs) :], strict=True):
            if isinstance(result, Exception):  # an index refresh: the next one will retry
                self._warn.warning("running-index refresh failed: %r", result)
                continue
            for job in jobs:  # what the job's conditional unindex may remove at its end
                score = members.get(job.job_id)
                if score is not None:
                    job._index_score = max(job._index_score, score)
        noscript = False
        for job, result in zip(jobs, results, strict=False):
            if isinstance(result, Exception):
                noscript |= is_noscript(result)
                missing = is_noscript(result)
                job._beat_failed(sent_at, result, quiet=missing, at_once=missing)
            else:
                job._beat_replied(sent_at, result)
                self._server_delta = int(result[2]) / 1000 - sent_at
        if noscript:
            try:
                await self._redis.script_load(SCRIPTS.beat.text)
            except Exception as exc:
                if not is_redis_fault(exc):
                    raise

    def _index_refresh(self, jobs: list[JobHeartbeat]) -> dict[str, dict[str, int]]:
        """ZADD members for the jobs whose index entry is due (every ``index_every`` beats, and
        after a data loss), grouped by index shard."""
        if self._server_delta is None:
            return {}
        out: dict[str, dict[str, int]] = {}
        for job in jobs:
            if job._beats % job._cfg.index_every and not job._resend_static:
                continue
            deadline = (self._clock() + self._server_delta + job._cfg.index_horizon) * 1000
            out.setdefault(job._schema.index_for(job.job_id), {})[job.job_id] = int(deadline)
            # the per-kind index and the kinds (docs/protocol.md) ride on the same refresh
            out.setdefault(job._schema.kind_index(job.kind), {})[job.job_id] = job._started_ms
            out.setdefault(job._schema.kinds(), {})[job.kind] = int(deadline)
        return out
