"""The long poll's shared machinery: one reading task per watched job, whatever the number of
parked requests.

``GET /jobs/{id}?wait=N`` with ``If-None-Match`` parks the request here until the job's version
moves past the one the client holds. Parked requests never touch Redis themselves: the first
request parked on a job starts that job's task, which reads the status through the reader (its
cache and single flight, so a plain ``GET`` of the same job shares the read) every ``interval``
seconds and, when the version moved, wakes every request parked on the job at once. The task ends
when the last request leaves. 5,000 requests parked on 50 jobs cost Redis 50 reads per
``interval``, not 5,000.

Why the snapshot and not only the stream: most beats write only the Hash (a stream entry comes
every ``stream_every`` beats, and at stage changes, checkpoints and the end), and every beat
moves the ETag (``seq`` grows). Reading the snapshot is what returns a long poll within about one
beat of ``done`` moving.

Why tasks of its own instead of a task group: a mounted Starlette app gets no lifespan events,
so nothing would own a group. Each task lives exactly as long as requests are parked on its job
(the last one to leave cancels it) and is kept in ``self._jobs``, never dropped on the floor.

Versions are ordered by ``follow.order_of``: ``(fence, seq)`` (the contract's order of a job id's
writes over its whole life), then STALE after the RUNNING snapshot it was derived from, then a
pending cancel request (a flag set without a new seq) — every change the app's ETag shows. The
hub keeps the newest status it has seen (from its task or from a request joining), so reads that
resume out of order never show a parked request an older version than the one it holds.

Invariants: ``parked`` counts the requests inside :meth:`LongPollHub.wait` (the bound is checked
and the count raised in one synchronous step, so it is never exceeded); a job's entry exists
exactly while at least one request is parked on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.types import Receive

from .._reader.follow import order_of
from .._reader.status import JobStatus

__all__ = [
    "Crowded",
    "LongPollHub",
    "LongPollStatistics",
    "parse_wait",
    "until_disconnect",
]

log = logging.getLogger("jobpulse")


def parse_wait(text: str, cap: float) -> float | None:
    """The ``wait`` query parameter in seconds, capped at ``cap``; None when it is not a finite
    number >= 0 (answered 400)."""
    try:
        value = float(text)
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return min(value, cap)


async def until_disconnect(receive: Receive) -> None:
    """Return when the client of a request without a body goes away (ASGI
    ``http.disconnect``); the first message, the empty request body, is skipped."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class Crowded(Exception):
    """The process already holds ``max_waiters`` parked requests (answered 503)."""


@dataclass(frozen=True, slots=True)
class LongPollStatistics:
    """Counters of one long-poll hub.

    Attributes:
        parked: requests parked now.
        jobs: jobs watched now (one task each).
        reads: status reads the tasks made (each through the reader's cache).
        wakes: times a job's version moved while requests were parked on it.
        refused: requests answered 503 because ``max_waiters`` were parked.
    """

    parked: int
    jobs: int
    reads: int
    wakes: int
    refused: int


class _Job:
    """One watched job: the last status its task read, and the event of the next change."""

    __slots__ = ("changed", "error", "parked", "status", "task")

    def __init__(self, status: JobStatus) -> None:
        self.status = status
        self.error: BaseException | None = None
        self.changed = asyncio.Event()
        self.parked = 0
        self.task: asyncio.Task[None] | None = None


class LongPollHub:
    """Parks long-poll requests and wakes them when their job's version moves (one per app).

    Args:
        read: reads a job's status (``reader.get``).
        interval: seconds between two reads of one watched job (> 0).
        max_waiters: requests parked at once in this process, at most (>= 1).
    """

    def __init__(
        self,
        read: Callable[[str], Awaitable[JobStatus]],
        *,
        interval: float,
        max_waiters: int,
    ) -> None:
        self._read = read
        self.interval = interval
        self.max_waiters = max_waiters
        self._jobs: dict[str, _Job] = {}
        self._parked = 0
        self._reads = 0
        self._wakes = 0
        self._refused = 0

    def statistics(self) -> LongPollStatistics:
        return LongPollStatistics(
            self._parked, len(self._jobs), self._reads, self._wakes, self._refused
        )

    def __repr__(self) -> str:
        return f"<LongPollHub parked={self._parked} jobs={len(self._jobs)} reads={self._reads}>"

    async def wait(
        self,
        job_id: str,
        current: JobStatus,
        timeout: float,  # noqa: ASYNC109 - the request's own deadline
    ) -> JobStatus | None:
        """The job's status once its version moves past ``current``'s, or None after
        ``timeout`` s.

        Args:
            job_id: the job.
            current: the status just read, whose ETag the client holds.
            timeout: seconds to wait at most.

        Raises:
            Crowded: ``max_waiters`` requests are parked already.
            Exception: the watching task's read failed (a Redis fault, a corrupt snapshot).
        """
        if self._parked >= self.max_waiters:
            self._refused += 1
            raise Crowded
        self._parked += 1
        job = self._jobs.get(job_id)
        if job is None:
            job = self._jobs[job_id] = _Job(current)
            job.task = asyncio.create_task(self._follow(job_id, job), name=f"longpoll:{job_id}")
        elif order_of(current) > order_of(job.status):
            job.status = current
        job.parked += 1
        try:
            async with asyncio.timeout(timeout):
                while True:
                    if job.error is not None:
                        raise job.error
                    if order_of(job.status) > order_of(current):
                        return job.status
                    await job.changed.wait()
        except TimeoutError:
            return None
        finally:
            self._parked -= 1
            job.parked -= 1
            if job.parked == 0:
                del self._jobs[job_id]
                if job.task is not None:
                    job.task.cancel()

    async def _follow(self, job_id: str, job: _Job) -> None:
        """Read the job every ``interval`` s; wake its parked requests when the version moves."""
        while True:
            await asyncio.sleep(self.interval)
            self._reads += 1
            try:
                status = await self._read(job_id)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Every parked request answers the failure (503 / 502), as a plain GET would.
                job.error = exc
                self._wake(job)
                return
            if order_of(status) > order_of(job.status):
                job.status = status
                self._wakes += 1
                self._wake(job)

    @staticmethod
    def _wake(job: _Job) -> None:
        # Set, then replace: every request waiting now wakes; later ones wait for the next move.
        job.changed.set()
        job.changed = asyncio.Event()

    async def aclose(self) -> None:
        """Cancel every watching task (parked requests then time out as usual)."""
        tasks = [job.task for job in self._jobs.values() if job.task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
