"""Prometheus export (the ``jobpulse[prometheus]`` extra: ``prometheus_client``).

* :func:`scrape` / :func:`render`: the text format of a :class:`~jobpulse.metrics.Census` and
  of this process's worker counters (what the HTTP app's ``GET /metrics`` answers).
* :class:`WorkerCollector`: register it in a worker process's registry
  (``prometheus_client.REGISTRY.register(WorkerCollector())``) to export the beats, failures,
  lease losses, loop lag and unwritten final states of that process.

Metric names are listed in docs/operations.md; no label holds a job id.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from .._reader.census import Census, quantiles, take_census
from .._worker.stats import WORKER_STATS, WorkerStats

__all__ = ["CONTENT_TYPE", "WorkerCollector", "census_metrics", "render", "scrape"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The ``Content-Type`` of the text format."""


def census_metrics(census: Census) -> Iterator[Metric]:
    """The metric families of ``census``: jobs by state and kind, ages, the longest standstill,
    claims, sweeper."""
    jobs = GaugeMetricFamily(
        "jobpulse_jobs", "Running and stale jobs by kind.", labels=["state", "kind"]
    )
    heartbeat = GaugeMetricFamily(
        "jobpulse_job_heartbeat_age_seconds",
        "Seconds since the last beat, quantiles over a sample of the kind's running jobs.",
        labels=["kind", "quantile"],
    )
    progress = GaugeMetricFamily(
        "jobpulse_job_progress_age_seconds",
        "Seconds since done last changed, quantiles over a sample of the kind's running jobs.",
        labels=["kind", "quantile"],
    )
    oldest = GaugeMetricFamily(
        "jobpulse_oldest_job_age_seconds",
        "Seconds since the oldest running or stale attempt of the kind started.",
        labels=["kind"],
    )
    standstill = GaugeMetricFamily(
        "jobpulse_not_advancing_age_seconds",
        "Longest time done has stood still in a running job of the kind whose worker beats "
        "(alive but not advancing), read from the kind's oldest attempts.",
        labels=["kind"],
    )
    claims = CounterMetricFamily(
        "jobpulse_sweeper_claims", "Stale jobs claimed by sweepers, by kind.", labels=["kind"]
    )
    for entry in census.kinds:
        jobs.add_metric(["RUNNING", entry.kind], entry.running)
        jobs.add_metric(["STALE", entry.kind], entry.stale)
        for q, value in quantiles(entry.heartbeat_ages).items():
            heartbeat.add_metric([entry.kind, q], value)
        for q, value in quantiles(entry.progress_ages).items():
            progress.add_metric([entry.kind, q], value)
        if entry.oldest_age is not None:
            oldest.add_metric([entry.kind], entry.oldest_age)
        if entry.not_advancing_age is not None:
            standstill.add_metric([entry.kind], entry.not_advancing_age)
        claims.add_metric([entry.kind], entry.claims)
    yield from (jobs, heartbeat, progress, oldest, standstill, claims)
    if census.sweep_age is not None:
        yield GaugeMetricFamily(
            "jobpulse_sweeper_last_sweep_age_seconds",
            "Seconds since a sweeper last swept the namespace.",
            value=census.sweep_age,
        )
    yield GaugeMetricFamily(
        "jobpulse_index_entries", "Entries of the running-jobs index.", value=census.indexed
    )
    yield GaugeMetricFamily(
        "jobpulse_stale_candidates",
        "Index entries past their deadline (what the next sweep examines).",
        value=census.candidates,
    )
    yield GaugeMetricFamily(
        "jobpulse_census_truncated",
        "1 when a cap of the census was hit (counts are then lower bounds).",
        value=int(census.truncated),
    )
    yield GaugeMetricFamily(
        "jobpulse_census_commands", "Redis commands the last census sent.", value=census.commands
    )


def worker_metrics(stats: WorkerStats) -> Iterator[Metric]:
    """The metric families of this process's heartbeats."""
    yield CounterMetricFamily(
        "jobpulse_worker_beats", "Beats answered by Redis.", value=stats.beats
    )
    yield CounterMetricFamily(
        "jobpulse_worker_beat_failures",
        "Beats that got no answer or an error (each is retried).",
        value=stats.beat_failures,
    )
    yield CounterMetricFamily(
        "jobpulse_worker_beats_late", "Beats sent after they were due.", value=stats.beats_late
    )
    losses = CounterMetricFamily(
        "jobpulse_worker_lease_losses", "Leases lost, by cause.", labels=["cause"]
    )
    for cause in ("expired", "taken_over", "fenced_out"):
        losses.add_metric([cause], stats.lease_losses.get(cause, 0))
    yield losses
    yield CounterMetricFamily(
        "jobpulse_worker_final_writes_failed",
        "Final states that could not be written to Redis.",
        value=stats.final_writes_failed,
    )
    yield SummaryMetricFamily(
        "jobpulse_worker_loop_lag_seconds",
        "How late the ticker woke up on the event loop.",
        count_value=stats.loop_lag_count,
        sum_value=stats.loop_lag_sum,
    )
    yield GaugeMetricFamily(
        "jobpulse_worker_loop_lag_last_seconds",
        "The last measured loop lag.",
        value=stats.loop_lag,
    )


class WorkerCollector(Collector):
    """A ``prometheus_client`` collector of this process's worker counters.

    Args:
        stats: the counters to export (default: this process's).
    """

    def __init__(self, stats: WorkerStats | None = None) -> None:
        self._stats = WORKER_STATS if stats is None else stats

    def collect(self) -> Iterator[Metric]:
        """The worker metric families (called by the registry at each scrape)."""
        return worker_metrics(self._stats)


class _Fixed(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return iter(self._metrics)


def render(census: Census | None, stats: WorkerStats | None = WORKER_STATS) -> bytes:
    """The text format of ``census`` and of ``stats`` (either may be None to leave it out)."""
    metrics = [] if census is None else list(census_metrics(census))
    if stats is not None:
        metrics += worker_metrics(stats)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(metrics))
    return generate_latest(registry)


async def scrape(
    redis: Any,
    *,
    namespace: str = "jobpulse",
    index_shards: int = 1,
    worker: bool = True,
    max_kinds: int = 50,
    max_stale: int = 500,
    age_sample: int = 20,
) -> bytes:
    """Take a census (see :func:`~jobpulse.metrics.take_census`) and render it.

    Args:
        redis: a ``redis.asyncio.Redis`` or ``RedisCluster``.
        namespace: the jobs' namespace.
        index_shards: the workers' ``index_shards``.
        worker: also export this process's worker counters.
        max_kinds: most kinds read.
        max_stale: most stale candidates examined.
        age_sample: jobs sampled per kind for the age quantiles (and oldest jobs read per kind
            for the longest standstill).

    Returns:
        The Prometheus text format (``CONTENT_TYPE``).
    """
    census = await take_census(
        redis,
        namespace=namespace,
        index_shards=index_shards,
        max_kinds=max_kinds,
        max_stale=max_stale,
        age_sample=age_sample,
    )
    return render(census, WORKER_STATS if worker else None)
