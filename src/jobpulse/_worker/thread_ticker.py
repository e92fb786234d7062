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
last job is removed (a lock shared with every job guards the plan and the machines). ``remove``
returns once no send of the thread carries the job: after a job's ``with`` block the thread
does no I/O for it, so closing the client then leaves no connection open (a beat in flight at
the exit used to take a connection from the closed client's pool, a socket nothing closed).
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
from .._protocol.errors import tolerate_faults
from .._protocol.wire import exchange_sync
from .plan import CHUNK, Beating, beat_commands, pack_beats
from .sampling import ProcessSample
from .tick import TickCore

__all__ = ["ThreadTicker"]

log = logging.getLogger("jobpulse")
_TICKERS: weakref.WeakValueDictionary[int, ThreadTicker] = weakref.WeakValueDictionary()
_REGISTRY = threading.Lock()


class ThreadTicker(TickCore):
    """Beats every registered sync job of one blocking Redis client. Use :meth:`for_client`."""

    def __init__(self, redis: Any, clock: Callable[[], float]) -> None:
        super().__init__(redis, clock)
        self.lock = threading.RLock()  # guards the plan and every registered job's machine
        self._cond = threading.Condition(self.lock)
        self._deadlines: list[tuple[float, int, Beating]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._sending: frozenset[int] = frozenset()  # ids of the jobs the thread's sends carry

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
            self._arm(job, job.machine.lease.deadline)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="jobpulse-beat", daemon=True)
                self._thread.start()
            self._cond.notify()

    def remove(self, job: Beating) -> None:
        """Take ``job`` out of the plan; return once no send in flight carries it (from the
        thread itself, at once)."""
        with self._cond:
            self._plan.remove(job)
            self._cond.notify()
            if threading.current_thread() is not self._thread:
                while id(job) in self._sending:
                    self._cond.wait()

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

    def _arm(self, job: Beating, when: float) -> None:
        heapq.heappush(self._deadlines, (when, next(self._order), job))

    def _expire(self, now: float) -> None:
        """Apply the machine's expiry rule (:meth:`BeatMachine.check_expiry`) to the jobs whose
        check time came: lose, beat at once (a late wake), and look again when it says."""
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, _, job = heapq.heappop(heap)
            if self._plan.jobs.get(id(job)) is not job:
                continue
            expiry = job.machine.check_expiry(now)
            if expiry.cause is not None:
                job.lease_expired(expiry.cause)
                continue
            if expiry.beat_now:
                self._plan.schedule(job)
            if expiry.recheck_at != math.inf:
                self._arm(job, expiry.recheck_at)

    def _run(self) -> None:
        intended: float | None = None
        try:
            while True:
                with self._cond:
                    if not self._plan:
                        self._thread = None  # decided under the lock: ``add`` starts a new one
                        return
                    now = self._clock()
                    lag = self._lag(now, intended)
                    self._expire(now)
                    due = self._plan.take_due(now)
                    sample = self._sampler.sample() if due else None
                    chunks = [
                        [(job, job.beat(now, lag, sample)) for job in due[i : i + CHUNK]]
                        for i in range(0, len(due), CHUNK)
                        if sample is not None
                    ]
                    self._sending = frozenset(id(job) for job in due)
                try:
                    for beats in chunks:
                        self._send(beats, now)
                finally:
                    with self._cond:
                        self._sending = frozenset()
                        self._cond.notify_all()  # the jobs removed meanwhile may return
                intended = self._sleep()
        except Exception as exc:  # a bug, not a Redis fault: those are handled per send
            with self._cond:
                self._thread = None
                self._crashed(exc)

    def _sleep(self) -> float | None:
        with self._cond:
            if not self._plan:
                return None
            first = self._deadlines[0][0] if self._deadlines else self._plan.first()
            when = min(self._plan.first(), first)
            if when == math.inf:  # nothing planned (every lease lost): wait for add/remove
                self._cond.wait()
                return None
            timeout = when - self._clock()
            if timeout <= 0:
                return None
            notified = self._cond.wait(timeout)
            return None if notified else when

    def _send(self, beats: list[tuple[Beating, list[Any]]], sent_at: float) -> None:
        with self.lock:
            jobs, batches, index = self._calls(beats)
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
            self._sent(jobs)
        except Exception as exc:
            with self.lock:
                self._failed(jobs, sent_at, exc)
            return
        with self.lock:
            load = self._settled(batches, results, index, sent_at, clock)
        for script in load:
            with tolerate_faults(lambda _: None):  # the beats are retried, and so is the load
                self._redis.script_load(script.text)
