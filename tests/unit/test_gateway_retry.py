"""The ``Retry-After`` rule and ``Cache-Control`` of status responses (pure, no Redis)."""

from __future__ import annotations

import random

import pytest

from jobpulse import JobState, JobStatus
from jobpulse.http.longpoll import parse_wait
from jobpulse.http.retry import base_delay, cache_control, retry_after


def running(age: float, eta: float | None = None) -> JobStatus:
    return JobStatus(
        job_id="j", state=JobState.RUNNING, started_ms=1_000_000,
        server_ms=1_000_000 + int(age * 1000), eta=eta,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("age", "base"),
    [(0, 0.5), (0.49, 0.5), (0.5, 0.75), (1.25, 1.125), (2.4, 1.6875), (6.6, 3.796875),
     (10.4, 5.0), (3600, 5.0)],
)  # fmt: skip
def test_the_base_is_the_seed_backoff_step_at_the_jobs_age(age: float, base: float) -> None:
    assert base_delay(age) == base


def test_retry_after_is_whole_seconds_within_bounds_and_spread() -> None:
    rng = random.Random(7)
    for age in (0, 1, 3, 5, 8, 12, 60, 3600):
        values = [retry_after(running(age), rng) for _ in range(2000)]
        assert all(v is not None and 1 <= v <= 5 for v in values)
    # d = 2.53 * (1 ± 0.1) at age 5: randomised rounding gives 2 and 3 and a mean near d.
    values = [retry_after(running(5.0), rng) or 0 for _ in range(4000)]
    assert set(values) == {2, 3}
    assert 2.4 < sum(values) / len(values) < 2.66
    # the cap: 5 s, never more
    assert {retry_after(running(3600), rng) for _ in range(2000)} == {4, 5}


def test_a_near_eta_shortens_retry_after() -> None:
    rng = random.Random(1)
    assert {retry_after(running(3600, eta=0.2), rng) for _ in range(500)} == {1}
    assert max(retry_after(running(3600, eta=2.0), rng) or 0 for _ in range(500)) <= 3


@pytest.mark.parametrize(
    "state", [JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.LOST,
              JobState.UNKNOWN],
)  # fmt: skip
def test_no_retry_after_when_the_job_will_not_change(state: JobState) -> None:
    assert retry_after(JobStatus(job_id="j", state=state), random.Random()) is None


def test_stale_gets_a_retry_after() -> None:
    status = JobStatus(job_id="j", state=JobState.STALE)
    assert retry_after(status, random.Random()) == 1


def test_cache_control() -> None:
    run = running(1)
    done = JobStatus(job_id="j", state=JobState.COMPLETED)
    unknown = JobStatus(job_id="j", state=JobState.UNKNOWN)
    assert cache_control(run, ttl=0.5, terminal_ttl=5, stale=1) == (
        "max-age=0, stale-while-revalidate=1"
    )
    assert cache_control(run, ttl=2.9, terminal_ttl=5, stale=0.2) == (
        "max-age=2, stale-while-revalidate=1"
    )
    assert cache_control(done, ttl=0.5, terminal_ttl=5, stale=0) == "max-age=5"
    assert cache_control(unknown, ttl=0.5, terminal_ttl=5, stale=1) == "no-store"


@pytest.mark.parametrize(
    ("text", "value"),
    [("30", 30.0), ("0", 0.0), ("2.5", 2.5), ("3600", 30.0), ("-1", None), ("abc", None),
     ("nan", None), ("inf", None), ("", None)],
)  # fmt: skip
def test_parse_wait(text: str, value: float | None) -> None:
    assert parse_wait(text, 30.0) == value
