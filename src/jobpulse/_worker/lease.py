"""Lease state: pure decisions about ownership, no I/O and no clock of its own.

The worker holds the lease from a successful acquire until one of:
  * a beat or final write says the lease holds another token (TAKEN_OVER) or the fence moved
    (FENCED_OUT), or
  * no renewal succeeded within ``ttl`` by the local monotonic clock (EXPIRED).
A renewal counts from the moment its beat was *sent*: the server renewed it no earlier than that.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..errors import LeaseLostCause

__all__ = ["BeatOutcome", "Lease", "classify_beat"]


class BeatOutcome(enum.Enum):
    WRITTEN = "written"
    RESEND_STATIC = "resend static"  # the snapshot lost writes that landed: resend everything
    SEQ_BEHIND = "seq behind"  # lease renewed, snapshot already newer: jump seq forward
    LOST = "lost"


def classify_beat(code: int) -> tuple[BeatOutcome, LeaseLostCause | None]:
    """Map the beat script's reply code (see ``beat.lua``) to what the worker does next."""
    if code in (1, 2):
        return BeatOutcome.WRITTEN, None
    if code == 3:
        return BeatOutcome.RESEND_STATIC, None
    if code == 0:
        return BeatOutcome.SEQ_BEHIND, None
    if code == -1:
        return BeatOutcome.LOST, LeaseLostCause.TAKEN_OVER
    return BeatOutcome.LOST, LeaseLostCause.FENCED_OUT


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

    def expire_if_due(self, now: float) -> bool:
        """Mark the lease EXPIRED when its deadline passed; True when this call lost it."""
        if self.held and now >= self.deadline:
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
