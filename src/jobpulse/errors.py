"""The jobpulse exception hierarchy.

Every exception jobpulse raises on purpose derives from :class:`JobpulseError`. Input errors
also derive from :class:`ValueError`, because that is what callers already catch for bad
arguments. Redis client exceptions are not translated: they are classified at one boundary
(:mod:`jobpulse._protocol.errors`: ``is_redis_fault`` says whether a retry may get past one,
``is_noscript`` whether a script must be loaded again), never deep in business code, and a
fault that jobpulse cannot absorb surfaces as redis-py's own exception (``RedisError``,
``OSError`` or ``TimeoutError``).
"""

from __future__ import annotations

import enum
from typing import Any

__all__ = [
    "InvalidJobId",
    "JobBusy",
    "JobCancelled",
    "JobpulseError",
    "LeaseLost",
    "LeaseLostCause",
    "ProtocolError",
    "StateNotWritten",
]


class JobpulseError(Exception):
    """Root of every exception raised by jobpulse.

    Every one pickles to an equal exception (same type, message and attributes): the sidecar
    helper sends them between processes, as a process pool would. A subclass whose ``__init__``
    takes other arguments than its message defines ``__reduce__``.
    """


class InvalidJobId(JobpulseError, ValueError):
    """A job id (or namespace) breaks the contract's grammar.

    Job ids are 1 to 200 characters of ``A-Z a-z 0-9 . _ - : /``. Raised before any Redis call.
    """


class JobBusy(JobpulseError):
    """Another live worker holds the job's lease, so this worker may not start it."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id!r} is held by another live worker")
        self.job_id = job_id

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception pickles as ``cls(*self.args)``, and args holds the message, not the job id:
        # the message doubled when the sidecar helper sent the error back. Every subclass with
        # its own __init__ says how it is rebuilt (its attributes and notes go along).
        return (type(self), (self.job_id,), self.__dict__)


class LeaseLostCause(enum.Enum):
    """Why a worker lost its lease."""

    TAKEN_OVER = "taken over"
    """The ``alive`` key (the lease) holds another owner's value."""
    FENCED_OUT = "fenced out"
    """The job's fence moved past ours: a sweeper claimed the job, or a newer attempt started."""
    EXPIRED = "expired"
    """No renewal succeeded within ``ttl`` by the worker's monotonic clock (Redis unreachable)."""
    SIDECAR_DIED = "sidecar helper died"
    """The helper process that beat the job (``sidecar=True``) died: nobody beats the job any
    more, it goes STALE within ``ttl`` and a sweeper records it LOST."""


class LeaseLost(JobpulseError):
    """The worker no longer owns the job; it stopped and none of its later writes land.

    Attributes:
        job_id: the job.
        cause: a :class:`LeaseLostCause`.
    """

    def __init__(self, job_id: str, cause: LeaseLostCause) -> None:
        super().__init__(f"lease of job {job_id!r} lost: {cause.value}")
        self.job_id = job_id
        self.cause = cause

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.job_id, self.cause), self.__dict__)


class JobCancelled(JobpulseError):
    """The job was cancelled on request (:func:`jobpulse.request_cancel`).

    Raised by :meth:`jobpulse.ProgressCell.check` inside the computation, and out of
    ``async with heartbeat(...)`` once the job has been recorded CANCELLED.
    """


class ProtocolError(JobpulseError):
    """Redis holds data that does not follow the jobpulse protocol (a corrupt or foreign key)."""


class StateNotWritten(JobpulseError):
    """The job's final state could not be written to Redis within the final-write timeout.

    Raised out of ``async with heartbeat(...)`` when the body itself succeeded; when the body
    raised, its own exception propagates with a note saying the final state was not written.
    """
