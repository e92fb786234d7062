"""One background thread per blocking Redis client beats every sync job of the process.

The thread shell's twin of ``ticker.py``: the same :class:`~jobpulse._worker.plan.BeatPlan`
decides who is due, the same :func:`~jobpulse._worker.plan.settle_beats` hands replies back;
only the timer (a ``threading.Condition``) and the I/O (a blocking exchange or pipeline) differ.
The thread also keeps every job's lease deadline (a heap of deadlines, re-armed at the later
deadline when the lease was renewed meanwhile, as the asyncio shell's loop timers are), so a
lease expires on time whatever the bodies do; a body learns of it through
``check()``/``cancelled``.

A blocking pipeline is bounded by the client's ``socket_timeout``, not by the lease: give the
client one below ``ttl`` (``docs/sync.md``). While a send blocks, deadlines are still honoured
where they matter: ``cancelled``/``check()`` compare the deadline with the clock themselves.

The thread lives exactly as long as it has jobs: the first ``add`` starts it, it ends when the
last job is removed (a lock shared with every job guards the plan and the machines).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import weakref
from collections.abc import Callable
from typing import Any

from .._protocol.clock import clock_of
from .._protocol.errors import is_redis_fault, tolerate_faults
from .._protocol.ratelimit import RateLimitedLog
from .._protocol.wire import exchange_sync, fast_client
from .plan import CHUNK, Beating, BeatPlan, beat_calls, beat_commands, pack_beats, settle_beats
from .sampling import ProcessSample, ProcessSampler
from .stats import WORKER_STATS

__all__ = ["ThreadTicker"]

log = logging.getLogger("jobpulse")
_TICKERS: weakref.WeakValueDictionary[int, ThreadTicker] = weakref.WeakValueDictionary()
_REGISTRY = threading.Lock()


class ThreadTicker:
    """Beats every registered sync job of one blocking Redis client. Use :meth:`for_client`."""

    def __init__(self, redis: Any, clock: Callable[[], float]) -> None:
        self._redis = redis
        self._clock = clock
        self.lock = threading.RLock()  # guards the plan and every registered job's machine
        self._cond = threading.Condition(self.lock)
        self._plan: BeatPlan[Beating] = BeatPlan()
        self._deadlines: list[tuple[float, int, Beating]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._sampler = ProcessSampler(clock)
        self._warn = RateLimitedLog(log, clock)
        self._server_delta: float | None = None
        self.packed = fast_client(redis)  # a tick: one packed write on a pooled connection
        self.pipelines = 0

    @classmethod
    def for_client(cls, redis: Any, clock: Callable[[], float]) -> ThreadTicker:
        """The ticker of ``redis`` (created on first use)."""
        with _REGISTRY:
            ticker = _TICKERS.get(id(redis))
            if ticker is None:
                ticker = _TICKERS[id(redis)] = cls(redis, clock)
            return ticker

    def add(self, job: Beating) -> None:
        with self._cond:
            self._plan.add(job)
            self._arm(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="jobpulse-beat", daemon=True)
                self._thread.start()
            self._cond.notify()

    def remove(self, job: Beating) -> None:
        with self._cond:
            self._plan.remove(job)
            self._cond.notify()

    def schedule(self, job: Beating) -> None:
        """Plan ``job``'s next beat at ``job.machine.due`` (the caller may hold the lock)."""
        with self._cond:
            if self._plan.schedule(job):
                self._cond.notify()

    def sample(self) -> ProcessSample:
        with self.lock:
            return self._sampler.sample()

    def __repr__(self) -> str:
        alive = self._thread is not None
        return f"<ThreadTicker jobs={len(self._plan)} pipelines={self.pipelines} running={alive}>"

    def _arm(self, job: Beating) -> None:
        deadline = job.machine.lease.deadline
        heapq.heappush(self._deadlines, (deadline, next(self._order), job))

    def _expire(self, now: float) -> None:
        """Lose the leases whose deadline passed; re-arm those renewed meanwhile."""
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, _, job = heapq.heappop(heap)
            if self._plan.jobs.get(id(job)) is not job or not job.machine.lease.held:
                continue
            cause = job.machine.expire_if_due(now)
            if cause is None:
                self._arm(job)
            else:
                job.lease_expired(cause)

    def _run(self) -> None:
        intended: float | None = None
        try:
            while True:
                with self._cond:
                    if not self._plan:
                        self._thread = None  # decided under the lock: ``add`` starts a new one
                        return
                    now = self._clock()
                    lag = 0.0 if intended is None else max(0.0, now - intended)
                    if intended is not None:
                        WORKER_STATS.lagged(lag)
                    self._expire(now)
                    due = self._plan.take_due(now)
                    sample = self._sampler.sample() if due else None
                    chunks = [
                        [(job, job.beat(now, lag, sample)) for job in due[i : i + CHUNK]]
                        for i in range(0, len(due), CHUNK)
                        if sample is not None
                    ]
                for beats in chunks:
                    self._send(beats, now)
                intended = self._sleep()
        except Exception as exc:  # a bug, not a Redis fault: those are handled per send
            log.exception("jobpulse beat thread crashed; stopping its jobs")
            with self._cond:
                self._thread = None
                for job in list(self._plan.jobs.values()):
                    job.crashed(exc)

    def _sleep(self) -> float | None:
        with self._cond:
            if not self._plan:
                return None
            first = self._deadlines[0][0] if self._deadlines else self._plan.first()
            when = min(self._plan.first(), first)
            timeout = when - self._clock()
            if timeout <= 0:
                return None
            # inf: no beat planned and no deadline left (a lost lease, a checkpoint waiting for
            # it): sleep until notified, as the asyncio ticker does (wait(inf) is OverflowError)
            notified = self._cond.wait(None if math.isinf(timeout) else timeout)
            return None if notified else when

    def _server_now(self) -> Callable[[], float] | None:
        delta = self._server_delta
        return None if delta is None else (lambda: self._clock() + delta)

    def _send(self, beats: list[tuple[Beating, list[Any]]], sent_at: float) -> None:
        jobs = [job for job, _ in beats]
        # one beat.lua call per BATCH jobs (per hash slot on a cluster client)
        batches = beat_calls(beats, getattr(self._redis, "keyslot", None))
        with self.lock:
            index = self._plan.index_refresh(jobs, self._server_now())
        clock = clock_of(self._redis)
        try:
            clock.sample_sync(self._redis)  # argument time only, when due: else nothing
            if self.packed:
                packed = pack_beats(batches, index, clock)
                results = exchange_sync(self._redis, packed, len(batches) + len(index))
            else:
                pipe = self._redis.pipeline(transaction=False)
                for command in beat_commands(batches, index, clock):
                    pipe.execute_command(*command)
                results = pipe.execute(raise_on_error=False)
            self.pipelines += 1
            WORKER_STATS.beats += len(jobs)
        except Exception as exc:
            if not is_redis_fault(exc):
                raise
            with self.lock:
                for job in jobs:
                    job.beat_failed(sent_at, exc, quiet=True, at_once=False)
            self._warn.warning("beats of %d job(s) failed, retrying: %r", len(jobs), exc)
            return
        with self.lock:
            settled = settle_beats([b for b, _ in batches], results, index, sent_at, clock)
            if settled.server_ms is not None:
                self._server_delta = settled.server_ms / 1000 - sent_at
        if settled.index_failure is not None:  # the next refresh will retry
            self._warn.warning("running-index refresh failed: %r", settled.index_failure)
        for script in settled.load:
            with tolerate_faults(lambda _: None):  # the beats are retried, and so is the load
                self._redis.script_load(script.text)
