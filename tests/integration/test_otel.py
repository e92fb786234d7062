"""jobpulse.metrics.otel with the OpenTelemetry SDK's in-memory reader and exporter."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from jobpulse import StatusReader, heartbeat
from jobpulse.metrics.otel import (
    OtelMetrics,
    enable_span_events,
    extract_trace,
    inject_trace,
    link_to,
)


def points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, Any], float]]]:
    data = reader.get_metrics_data()
    out: dict[str, list[tuple[dict[str, Any], float]]] = {}
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    out.setdefault(metric.name, []).append(
                        (dict(point.attributes or {}), point.value)  # type: ignore[union-attr]
                    )
    return out


@pytest.fixture
def tracer_provider() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


async def test_instruments_report_jobs_by_kind_and_the_worker_counters(
    redis: aioredis.Redis, ns: str
) -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    otel = OtelMetrics(redis, meter=provider.get_meter("test"), namespace=ns)
    try:
        opts = {"namespace": ns, "kind": "report", "interval": 0.1, "ttl": 1.0}
        async with heartbeat(redis, "o1", **opts), heartbeat(redis, "o2", **opts):
            await asyncio.sleep(0.3)
            await otel.refresh()
            got = points(reader)
        jobs = {(a["state"], a["kind"]): v for a, v in got["jobpulse.jobs"]}
        assert jobs == {("RUNNING", "report"): 2, ("STALE", "report"): 0}
        assert got["jobpulse.worker.beats"][0][1] > 0
        assert {a["cause"] for a, _ in got["jobpulse.worker.lease_losses"]} == {
            "expired", "taken_over", "fenced_out",
        }  # fmt: skip
        ages = {a["quantile"] for a, _ in got["jobpulse.job.heartbeat_age"]}
        assert ages == {"0.5", "0.9", "0.99", "1"}
        assert [a for a, _ in got["jobpulse.job.oldest_age"]] == [{"kind": "report"}]
        standstill = got["jobpulse.job.not_advancing_age"]  # neither job ever advanced
        assert standstill == [({"kind": "report"}, otel.census.kinds[0].not_advancing_age)]
        for name, series in got.items():  # no attribute ever holds a job id
            assert all("o1" not in map(str, a.values()) for a, _ in series), name
    finally:
        provider.shutdown()


async def test_stage_changes_and_checkpoints_become_events_on_the_current_span(
    redis: aioredis.Redis,
    ns: str,
    tracer_provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = tracer_provider
    tracer = provider.get_tracer("test")
    disable = enable_span_events()
    try:
        with tracer.start_as_current_span("request"):
            async with heartbeat(redis, "s1", namespace=ns, kind="etl", interval=0.1) as hb:
                hb.set_stage("load")
                await hb.checkpoint(offset=10, part={"a": 1})
    finally:
        disable()
    async with heartbeat(redis, "s2", namespace=ns) as hb:  # disabled: no events, no error
        hb.set_stage("quiet")
    [span] = exporter.get_finished_spans()
    events = [(e.name, dict(e.attributes or {})) for e in span.events]
    assert events == [
        ("jobpulse.stage", {"jobpulse.job_id": "s1", "jobpulse.kind": "etl",
                            "jobpulse.stage": "load"}),
        ("jobpulse.checkpoint", {"jobpulse.job_id": "s1", "jobpulse.kind": "etl",
                                 "jobpulse.offset": 10, "jobpulse.part": "{'a': 1}"}),
    ]  # fmt: skip


async def test_a_reader_links_a_job_to_the_request_that_started_it(
    redis: aioredis.Redis,
    ns: str,
    tracer_provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, _ = tracer_provider
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("POST /reports") as request_span:
        meta = inject_trace({"user": "u1"})
    assert meta["user"] == "u1"
    async with (
        heartbeat(redis, "t1", namespace=ns, meta=meta),
        StatusReader(redis, namespace=ns) as reader,
    ):
        status = await reader.get("t1")
    link = link_to(status)
    assert link is not None
    assert link.context.trace_id == request_span.get_span_context().trace_id
    assert link.context.span_id == request_span.get_span_context().span_id
    assert extract_trace(None) is not None
    assert link_to(dataclasses.replace(status, meta={"user": "u1"})) is None
