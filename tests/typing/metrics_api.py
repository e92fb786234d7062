"""User-style code for jobpulse.metrics, checked by ``mypy --strict`` (not collected by pytest)."""

from __future__ import annotations

import prometheus_client
import redis.asyncio as aioredis

from jobpulse import StatusReader, heartbeat
from jobpulse.metrics import Census, KindCensus, WorkerStats, take_census, worker_stats
from jobpulse.metrics.otel import OtelMetrics, enable_span_events, inject_trace, link_to
from jobpulse.metrics.prometheus import CONTENT_TYPE, WorkerCollector, scrape


async def stale_reports(client: aioredis.Redis) -> int:
    census: Census = await take_census(client, namespace="jobpulse", max_kinds=10, age_sample=5)
    report: list[KindCensus] = [k for k in census.kinds if k.kind == "report"]
    return sum(k.stale for k in report)


async def metrics_page(client: aioredis.Redis) -> tuple[str, bytes]:
    return CONTENT_TYPE, await scrape(client, namespace="jobpulse", worker=False)


def export_worker_counters() -> int:
    prometheus_client.REGISTRY.register(WorkerCollector())
    stats: WorkerStats = worker_stats()
    return stats.beats + stats.beat_failures + stats.lease_losses.get("expired", 0)


async def traced_job(client: aioredis.Redis) -> bool:
    otel = OtelMetrics(client, namespace="jobpulse")
    await otel.refresh()
    disable = enable_span_events()
    async with heartbeat(client, "report-2", kind="report", meta=inject_trace({"user": 7})):
        pass
    disable()
    async with StatusReader(client) as reader:
        return link_to(await reader.get("report-2")) is not None
