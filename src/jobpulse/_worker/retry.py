"""Every retry schedule of a job's life, pure: the shells and the queue integrations only wait
what these say.

* entering: the index entry and the acquire, after a Redis fault, within ``ttl``
  (:data:`ACQUIRE_RETRY`);
* the final write, after a Redis fault, within ``final_timeout`` (:data:`FINAL_RETRY`);
* a failed beat, and a lease another live worker holds (``JobBusy``, asked for again by the
  queue integrations): :func:`retry_after`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["ACQUIRE_RETRY", "FINAL_RETRY", "Schedule", "retry_after"]


@dataclass(frozen=True, slots=True)
class Schedule:
    """A retry schedule: ``first`` seconds, doubling up to ``cap``."""

    first: float
    cap: float

    def delays(self) -> Iterator[float]:
        """The delays, forever (the caller stops at its deadline)."""
        delay = self.first
        while True:
            yield delay
            delay = min(delay * 2, self.cap)


ACQUIRE_RETRY = Schedule(0.02, 0.5)
"""The index entry and the acquire after a Redis fault (all of it within ``ttl``)."""

FINAL_RETRY = Schedule(0.05, 2.0)
"""The final write after a Redis fault (within ``final_timeout``, or one interval for LOST)."""


def retry_after(interval: float) -> float:
    """Seconds before a failed beat is sent again, and before a lease another live worker holds
    (``JobBusy``) is asked for again: soon, but never more often than the beats."""
    return min(interval, 0.25)
