"""Lease state: pure decisions about ownership, no I/O and no clock of its own.

The worker holds the lease from a successful acquire until one of:
  * a beat or final write says the lease holds another token (TAKEN_OVER) or the fence moved
    (FENCED_OUT), or
  * the worker tried to renew it in time (a beat sent before the local deadline) and no renewal
    succeeded within ``ttl`` by the local monotonic clock (EXPIRED: Redis did not answer), or
    a beat sent after the deadline failed too.
A renewal counts from the moment its beat was *sent*: the server renewed it no earlier than that.

A deadline that passed with no beat sent since the last renewal is a *late* worker (a frozen
process, a GIL held by a C call, a blocked event loop), not a lost lease: its next beat decides,
and ``beat.lua`` re-takes a lease nobody claimed (code 2) or answers that it was claimed.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import LeaseLostCause

__all__ = ["Lease"]


@dataclass(slots=True)
class Lease:
    """The worker's view of its lease.

    Args:
        ttl: the lease time in seconds.
        renewed_at: monotonic time of the last renewal (the acquire's send time at first).
    """

    ttl: float
    renewed_at: float
    lost: LeaseLostCause | None = None
    tried_at: float | None = None  # the first beat sent since the last renewal, unanswered

    def tried(self, sent_at: float) -> None:
        """A beat (a renewal attempt) was sent at ``sent_at``."""
        if self.tried_at is None:
            self.tried_at = sent_at

    @property
    def held(self) -> bool:
        return self.lost is None

    @property
    def deadline(self) -> float:
        """Monotonic time after which the lease may have expired on the server."""
        return self.renewed_at + self.ttl

    def held_at(self, now: float) -> bool:
        """True while the worker may act as the lease's holder: not lost, and its deadline (by
        the local monotonic clock) not passed. The rule a queue integration's claim keeper asks
        before each refresh of the queue's claim, in both shells."""
        return self.lost is None and self.deadline > now

    def left(self, now: float) -> float:
        return self.deadline - now

    def renewed(self, sent_at: float) -> None:
        if self.held:
            self.renewed_at = max(self.renewed_at, sent_at)
            self.tried_at = None

    def overdue(self, now: float) -> bool:
        """The deadline passed although a renewal was tried before it (Redis did not answer)."""
        tried = self.tried_at
        return self.held and now >= self.deadline and tried is not None and tried < self.deadline

    def late(self, now: float) -> bool:
        """The deadline passed with no renewal tried before it: the worker was late."""
        return self.held and now >= self.deadline and not self.overdue(now)

    def expire_if_due(self, now: float) -> bool:
        """Mark the lease EXPIRED when it is :meth:`overdue`; True when this call lost it."""
        if self.overdue(now):
            self.lost = LeaseLostCause.EXPIRED
            return True
        return False

    def lose(self, cause: LeaseLostCause) -> bool:
        """Record the loss (the first cause wins); True when this call lost it."""
        if self.held:
            self.lost = cause
            return True
        return False

    def __str__(self) -> str:
        return "held" if self.held else f"lost ({self.lost.value if self.lost else ''})"
