"""OpenTelemetry export (the ``jobpulse[otel]`` extra: ``opentelemetry-api`` only).

The application configures the SDK (providers, readers, exporters); jobpulse only uses the API:

* :class:`OtelMetrics`: the census and the worker counters as observable instruments
  (``jobpulse.jobs{state,kind}``, ages, sweeper claims, ``jobpulse.worker.*``). The census is
  read by :meth:`OtelMetrics.refresh` (async; :meth:`OtelMetrics.run` calls it periodically),
  and the SDK's collection only reads what was last refreshed, so an export never waits on Redis.
* :func:`enable_span_events`: stage changes and checkpoints become events on the span that is
  current where ``set_stage()`` / ``checkpoint()`` is called.
* :func:`inject_trace` / :func:`extract_trace` / :func:`link_to`: the W3C trace context of the
  request that started a job, carried in the job's ``meta`` under ``"otel"``, so a reader can
  link the job to that request.

No metric attribute holds a job id (span events do: a span is one request, not a time series).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry import metrics, propagate, trace
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Meter, Observation

from .._protocol.errors import tolerate_faults
from .._reader.census import Census, quantiles, take_census
from .._reader.status import JobStatus
from .._worker.stats import WORKER_STATS, WorkerStats, add_observer, remove_observer

__all__ = [
    "META_KEY",
    "OtelMetrics",
    "enable_span_events",
    "extract_trace",
    "inject_trace",
    "link_to",
]

META_KEY = "otel"
"""The key of ``meta`` that holds the trace context (``{"traceparent": ..., ...}``)."""


class OtelMetrics:
    """jobpulse's metrics as OpenTelemetry observable instruments.

    Args:
        redis: a ``redis.asyncio.Redis`` or ``RedisCluster`` to take the census from, or None
            to export only this process's worker counters.
        meter: the meter to create instruments on (default: ``get_meter("jobpulse")`` of the
            global provider).
        namespace: the jobs' namespace.
        index_shards: the workers' ``index_shards``.
        stats: the worker counters (default: this process's).
    """

    def __init__(
        self,
        redis: Any = None,
        *,
        meter: Meter | None = None,
        namespace: str = "jobpulse",
        index_shards: int = 1,
        stats: WorkerStats | None = None,
    ) -> None:
        self._redis = redis
        self._namespace = namespace
        self._index_shards = index_shards
        self._stats = WORKER_STATS if stats is None else stats
        self.census: Census | None = None
        """The census last read by :meth:`refresh` (None before the first)."""
        m = meter if meter is not None else metrics.get_meter("jobpulse")
        s = self._stats
        counters: list[tuple[str, str, Callable[[], int]]] = [
            ("jobpulse.worker.beats", "Beats answered by Redis.", lambda: s.beats),
            ("jobpulse.worker.beat_failures", "Beats that failed.", lambda: s.beat_failures),
            ("jobpulse.worker.beats_late", "Beats sent after due.", lambda: s.beats_late),
            (
                "jobpulse.worker.final_writes_failed",
                "Final states not written.",
                lambda: s.final_writes_failed,
            ),
        ]
        for name, description, read in counters:
            m.create_observable_counter(name, [_one(read)], unit="1", description=description)
        m.create_observable_counter(
            "jobpulse.worker.lease_losses", [self._losses], unit="1", description="Leases lost."
        )
        m.create_observable_gauge(
            "jobpulse.worker.loop_lag", [_one(lambda: s.loop_lag)], unit="s",
            description="The last measured lateness of the ticker on the event loop.",
        )  # fmt: skip
        if redis is None:
            return
        m.create_observable_gauge(
            "jobpulse.jobs", [self._jobs], unit="1", description="Running and stale jobs."
        )
        m.create_observable_gauge(
            "jobpulse.job.heartbeat_age", [self._ages("heartbeat_ages")], unit="s",
            description="Seconds since the last beat (quantiles over a sample).",
        )  # fmt: skip
        m.create_observable_gauge(
            "jobpulse.job.progress_age", [self._ages("progress_ages")], unit="s",
            description="Seconds since done last changed (quantiles over a sample).",
        )  # fmt: skip
        m.create_observable_gauge(
            "jobpulse.job.oldest_age", [self._oldest], unit="s",
            description="Seconds since the oldest running or stale attempt started.",
        )  # fmt: skip
        m.create_observable_gauge(
            "jobpulse.job.not_advancing_age", [self._standstill], unit="s",
            description="Longest time done has stood still in a running job whose worker "
            "beats (alive but not advancing), read from the kind's oldest attempts.",
        )  # fmt: skip
        m.create_observable_counter(
            "jobpulse.sweeper.claims", [self._claims], unit="1", description="Jobs claimed."
        )

    async def refresh(self) -> Census:
        """Take a census now (three round trips) for the next collection, and return it."""
        self.census = await take_census(
            self._redis, namespace=self._namespace, index_shards=self._index_shards
        )
        return self.census

    async def run(self, interval: float = 15.0) -> None:
        """:meth:`refresh` every ``interval`` seconds until cancelled (a Redis fault is kept
        quiet: the last census stays and the next refresh tries again)."""
        while True:
            with tolerate_faults(lambda _: None):
                await self.refresh()
            await asyncio.sleep(interval)

    # -- callbacks (run by the SDK at collection; no I/O) --

    def _losses(self, options: CallbackOptions) -> Iterable[Observation]:
        for cause in ("expired", "taken_over", "fenced_out"):
            yield Observation(self._stats.lease_losses.get(cause, 0), {"cause": cause})

    def _jobs(self, options: CallbackOptions) -> Iterable[Observation]:
        for entry in self.census.kinds if self.census else ():
            yield Observation(entry.running, {"state": "RUNNING", "kind": entry.kind})
            yield Observation(entry.stale, {"state": "STALE", "kind": entry.kind})

    def _ages(self, field: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            for entry in self.census.kinds if self.census else ():
                for q, value in quantiles(getattr(entry, field)).items():
                    yield Observation(value, {"kind": entry.kind, "quantile": q})

        return callback

    def _oldest(self, options: CallbackOptions) -> Iterable[Observation]:
        for entry in self.census.kinds if self.census else ():
            if entry.oldest_age is not None:
                yield Observation(entry.oldest_age, {"kind": entry.kind})

    def _standstill(self, options: CallbackOptions) -> Iterable[Observation]:
        for entry in self.census.kinds if self.census else ():
            if entry.not_advancing_age is not None:
                yield Observation(entry.not_advancing_age, {"kind": entry.kind})

    def _claims(self, options: CallbackOptions) -> Iterable[Observation]:
        for entry in self.census.kinds if self.census else ():
            yield Observation(entry.claims, {"kind": entry.kind})


def _one(read: Callable[[], float]) -> Callable[[CallbackOptions], Iterable[Observation]]:
    return lambda options: [Observation(read())]


def enable_span_events() -> Callable[[], None]:
    """Add a span event for every stage change (``jobpulse.stage``) and checkpoint
    (``jobpulse.checkpoint``) of this process's heartbeats, on the span current where
    ``set_stage()`` / ``checkpoint()`` is called (nothing when no span is recording).

    Returns:
        A function that turns the events off again.
    """

    def observer(event: str, job_id: str, kind: str, attributes: Mapping[str, Any]) -> None:
        span = trace.get_current_span()
        if not span.is_recording():
            return
        attrs: dict[str, Any] = {"jobpulse.job_id": job_id, "jobpulse.kind": kind}
        for key, value in attributes.items():
            ok = isinstance(value, str | bool | int | float)
            attrs[f"jobpulse.{key}"] = value if ok else str(value)
        span.add_event(f"jobpulse.{event}", attrs)

    add_observer(observer)
    return lambda: remove_observer(observer)


def inject_trace(
    meta: Mapping[str, Any] | None = None, *, context: Context | None = None
) -> dict[str, Any]:
    """A copy of ``meta`` carrying the current trace context under ``"otel"``.

    Pass the result as ``heartbeat(..., meta=inject_trace(meta))`` where the request that starts
    the job is traced; readers get it back from ``JobStatus.meta``.

    Args:
        meta: the job's metadata (not changed).
        context: the context to inject (default: the current one).
    """
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=context)
    out = dict(meta or {})
    if carrier:
        out[META_KEY] = carrier
    return out


def extract_trace(meta: Mapping[str, Any] | None) -> Context:
    """The trace context carried in a job's ``meta`` (an empty context when there is none)."""
    carrier = (meta or {}).get(META_KEY)
    return propagate.extract(carrier if isinstance(carrier, Mapping) else {})


def link_to(status: JobStatus) -> trace.Link | None:
    """A span link from a job's status to the request that started it, or None if its ``meta``
    carries no trace context: ``tracer.start_span("poll", links=[link_to(status)])``."""
    meta = status.meta if isinstance(status.meta, Mapping) else None
    span = trace.get_current_span(extract_trace(meta))
    context = span.get_span_context()
    return trace.Link(context) if context.is_valid else None
