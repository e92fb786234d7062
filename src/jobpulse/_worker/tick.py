"""What both tickers (``ticker.py``: an asyncio task; ``thread_ticker.py``: a thread) decide
about a tick, with no I/O and no timer of their own: the loop lag, what a chunk's send carries
(``beat.lua`` calls, index refreshes), what a failed send or a settled one means. A ticker adds
only how it sleeps, how it sends and how it guards the plan (the thread ticker calls these
under its lock).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from .._protocol.clock import ScriptClock
from .._protocol.errors import is_redis_fault
from .._protocol.ratelimit import RateLimitedLog
from .._protocol.scripts import Script
from .._protocol.wire import fast_client
from .plan import Beating, BeatPlan, beat_calls, settle_beats
from .sampling import ProcessSampler
from .stats import WORKER_STATS

__all__ = ["Batches", "TickCore"]

log = logging.getLogger("jobpulse")

Batches = list[tuple[list[Beating], list[Any]]]


class TickCore:
    """The shared state and decisions of a ticker of one Redis client."""

    def __init__(self, redis: Any, clock: Callable[[], float]) -> None:
        self._redis = redis
        self._clock = clock
        self._plan: BeatPlan[Beating] = BeatPlan()
        self._sampler = ProcessSampler(clock)
        self._warn = RateLimitedLog(log, clock)
        self._server_delta: float | None = None  # server clock (s) minus our clock
        self.packed = fast_client(redis)  # a tick: one packed write on a pooled connection
        self.pipelines = 0

    def _lag(self, now: float, intended: float | None) -> float:
        """How late this tick woke (0 when it was woken early or did not sleep), recorded."""
        if intended is None:
            return 0.0
        lag = max(0.0, now - intended)
        WORKER_STATS.lagged(lag)
        return lag

    def _server_now(self) -> Callable[[], float] | None:
        delta = self._server_delta
        return None if delta is None else (lambda: self._clock() + delta)

    def _calls(
        self, beats: Sequence[tuple[Beating, list[Any]]]
    ) -> tuple[list[Beating], Batches, dict[str, dict[str, int]]]:
        """A chunk's jobs, its ``beat.lua`` calls (one per BATCH jobs, per hash slot on a
        cluster client) and the index refreshes it carries."""
        jobs = [job for job, _ in beats]
        batches = beat_calls(beats, getattr(self._redis, "keyslot", None))
        return jobs, batches, self._plan.index_refresh(jobs, self._server_now())

    def _sent(self, jobs: Sequence[Beating]) -> None:
        self.pipelines += 1
        WORKER_STATS.beats += len(jobs)

    def _failed(self, jobs: Sequence[Beating], sent_at: float, exc: Exception) -> None:
        """A chunk's send failed: a Redis fault retries each job's beat, anything else is a
        bug (raised: the ticker stops its jobs)."""
        if not is_redis_fault(exc):
            raise exc
        for job in jobs:
            job.beat_failed(sent_at, exc, quiet=True, at_once=False)
        self._warn.warning("beats of %d job(s) failed, retrying: %r", len(jobs), exc)

    def _settled(
        self,
        batches: Batches,
        results: Sequence[Any],
        index: dict[str, dict[str, int]],
        sent_at: float,
        clock: ScriptClock,
    ) -> list[Script]:
        """Hand each job its reply; return the scripts to load (a NOSCRIPT came back)."""
        settled = settle_beats([b for b, _ in batches], results, index, sent_at, clock)
        if settled.server_ms is not None:
            self._server_delta = settled.server_ms / 1000 - sent_at
        if settled.index_failure is not None:  # the next refresh will retry
            self._warn.warning("running-index refresh failed: %r", settled.index_failure)
        return settled.load

    def _crashed(self, exc: Exception) -> None:
        """A bug in the ticker (Redis faults are handled per send): stop every job."""
        log.exception("jobpulse ticker crashed; stopping its jobs")
        for job in list(self._plan.jobs.values()):
            job.crashed(exc)
