"""The Prometheus rendering of a census and of the worker counters (no Redis), and the core's
independence from the metrics libraries."""

from __future__ import annotations

import subprocess
import sys

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from jobpulse.metrics import Census, KindCensus, WorkerStats
from jobpulse.metrics.prometheus import WorkerCollector, render


def parsed(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_a_census_renders_jobs_ages_and_claims_by_kind() -> None:
    census = Census(
        kinds=(
            KindCensus("report", running=3, stale=1, oldest_age=42.0,
                       heartbeat_ages=(0.1, 0.2, 0.3, 5.0), progress_ages=(1.0,), claims=7),
            KindCensus("", running=1),
        ),
        indexed=5, candidates=1, sweep_age=2.5, commands=30, round_trips=3,
    )  # fmt: skip
    got = parsed(render(census, None))
    assert got[("jobpulse_jobs", (("kind", "report"), ("state", "RUNNING")))] == 3
    assert got[("jobpulse_jobs", (("kind", "report"), ("state", "STALE")))] == 1
    assert got[("jobpulse_jobs", (("kind", ""), ("state", "STALE")))] == 0
    assert got[("jobpulse_job_heartbeat_age_seconds", (("kind", "report"), ("quantile", "1")))] == 5
    assert (
        got[("jobpulse_job_progress_age_seconds", (("kind", "report"), ("quantile", "0.5")))] == 1
    )
    assert got[("jobpulse_oldest_job_age_seconds", (("kind", "report"),))] == 42
    assert ("jobpulse_oldest_job_age_seconds", (("kind", ""),)) not in got  # no job: no age
    assert got[("jobpulse_sweeper_claims_total", (("kind", "report"),))] == 7
    assert got[("jobpulse_sweeper_last_sweep_age_seconds", ())] == 2.5
    assert got[("jobpulse_census_commands", ())] == 30
    assert not any(name.startswith("jobpulse_worker") for name, _ in got)


def test_worker_collector_exports_the_counters_of_the_process() -> None:
    stats = WorkerStats(beats=10, beat_failures=2, beats_late=1, final_writes_failed=1)
    stats.lost("fenced_out")
    stats.lagged(0.25)
    stats.lagged(0.75)
    registry = CollectorRegistry()
    registry.register(WorkerCollector(stats))
    got = parsed(generate_latest(registry))
    assert got[("jobpulse_worker_beats_total", ())] == 10
    assert got[("jobpulse_worker_beat_failures_total", ())] == 2
    assert got[("jobpulse_worker_beats_late_total", ())] == 1
    assert got[("jobpulse_worker_lease_losses_total", (("cause", "fenced_out"),))] == 1
    assert got[("jobpulse_worker_lease_losses_total", (("cause", "expired"),))] == 0
    assert got[("jobpulse_worker_final_writes_failed_total", ())] == 1
    assert got[("jobpulse_worker_loop_lag_seconds_count", ())] == 2
    assert got[("jobpulse_worker_loop_lag_seconds_sum", ())] == 1.0
    assert got[("jobpulse_worker_loop_lag_last_seconds", ())] == 0.75


def test_the_core_and_the_http_app_import_no_metrics_library() -> None:
    # (redis-py itself may import opentelemetry when it is installed: not checked here)
    code = (
        "import sys, jobpulse, jobpulse.http, jobpulse.metrics; "
        "mods = ('prometheus_client', 'jobpulse.metrics.prometheus', 'jobpulse.metrics.otel'); "
        "print(sorted(m for m in mods if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
