"""Metrics of jobpulse: a census of the running jobs by kind, and this process's worker counters.

The core needs no metrics library. :func:`take_census` reads Redis at a bounded cost (three
round trips, a number of commands that does not grow with the number of jobs); the worker
counters are one process-wide :class:`WorkerStats`. Two adapters export them, each in an extra:

* :mod:`jobpulse.metrics.prometheus` (``jobpulse[prometheus]``): the text format, a
  ``prometheus_client`` collector for worker processes; ``GET /metrics`` of the HTTP app.
* :mod:`jobpulse.metrics.otel` (``jobpulse[otel]``, ``opentelemetry-api`` only): the same as
  instruments, span events, and trace context carried in a job's ``meta``.

No label ever holds a job id: labels are ``kind``, ``state``, ``cause`` and ``quantile``.
"""

from __future__ import annotations

from .._reader.census import Census as Census
from .._reader.census import KindCensus as KindCensus
from .._reader.census import take_census as take_census
from .._worker.stats import WORKER_STATS
from .._worker.stats import WorkerStats as WorkerStats

__all__ = ("Census", "KindCensus", "WorkerStats", "take_census", "worker_stats")


def worker_stats() -> WorkerStats:
    """The counters of this process's heartbeats (one object per process, updated in place)."""
    return WORKER_STATS
