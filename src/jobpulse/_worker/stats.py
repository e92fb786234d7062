"""One process-wide tally of what this process's heartbeats did, for metrics exporters.

Every heartbeat of the process (all clients, all tickers) adds to the one :data:`WORKER_STATS`.
An update is a plain integer or float assignment — no lock, no I/O, no allocation — because
some happen on the beat path; the exporters (:mod:`jobpulse.metrics`) only read it. Updates
run on event-loop threads; a reader on another thread (a Prometheus scrape thread) may see a
counter one increment behind, never a torn value (CPython int and float stores are atomic).

Observers (:func:`add_observer`) hear of stage changes and checkpoints synchronously, in the
caller's task, so an OpenTelemetry adapter can add span events to the caller's current span.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["WORKER_STATS", "WorkerStats", "add_observer", "notify", "remove_observer"]

log = logging.getLogger("jobpulse")

Observer = Callable[[str, str, str, Mapping[str, Any]], None]
"""``observer(event, job_id, kind, attributes)``; ``event`` is ``"stage"`` or ``"checkpoint"``."""


@dataclass(slots=True)
class WorkerStats:
    """Counters of the heartbeats of this process (monotonic, since the process started).

    Attributes:
        beats: beats answered by Redis (sent and renewed, or fenced out).
        beat_failures: beats that got no answer or an error (each is retried).
        beats_late: beats sent after the moment they were due (a starved loop, a slow reply).
        lease_losses: lease losses by cause (``LeaseLostCause`` names in lower case:
            ``expired``, ``taken_over``, ``fenced_out``).
        final_writes_failed: final states (COMPLETED, FAILED, ...) that could not be written.
        loop_lag: the last measured lateness of the ticker's wake-up, in seconds.
        loop_lag_sum: the sum of every measured lateness, in seconds.
        loop_lag_count: how many wake-ups were measured.
    """

    beats: int = 0
    beat_failures: int = 0
    beats_late: int = 0
    lease_losses: dict[str, int] = field(default_factory=dict)
    final_writes_failed: int = 0
    loop_lag: float = 0.0
    loop_lag_sum: float = 0.0
    loop_lag_count: int = 0

    def lost(self, cause: str) -> None:
        """Count one lease loss of ``cause``."""
        self.lease_losses[cause] = self.lease_losses.get(cause, 0) + 1

    def lagged(self, seconds: float) -> None:
        """Record one measured loop lag."""
        self.loop_lag = seconds
        self.loop_lag_sum += seconds
        self.loop_lag_count += 1


WORKER_STATS = WorkerStats()
"""The process's one tally (never replaced, so a reference to it stays valid)."""

# Process-wide by design, like WORKER_STATS: span events belong to whatever span is current in
# the caller's task, whichever client or heartbeat it uses. Empty unless an adapter opted in.
_observers: list[Observer] = []


def add_observer(observer: Observer) -> None:
    """Call ``observer`` on every stage change and checkpoint of this process's heartbeats."""
    _observers.append(observer)


def remove_observer(observer: Observer) -> None:
    """Stop calling ``observer`` (no error when it was not added)."""
    if observer in _observers:
        _observers.remove(observer)


def notify(event: str, job_id: str, kind: str, attributes: Mapping[str, Any]) -> None:
    """Tell the observers; an observer's error is logged, never raised into the job."""
    for observer in tuple(_observers):
        try:
            observer(event, job_id, kind, attributes)
        except Exception:
            log.exception("jobpulse: an observer of %s failed", event)
