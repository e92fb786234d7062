"""``GET /metrics`` and ``POST /jobs/{id}/cancel`` of a real uvicorn server, real workers."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator

import httpx
import pytest
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families
from starlette.requests import Request

from jobpulse import JobCancelled, JobState, StatusReader, Sweeper, heartbeat

from ..support import eventually, spawn_ready, stop
from .http_server import ServerThread


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def jobs(text: str, state: str, kind: str) -> float:
    return samples(text).get(("jobpulse_jobs", (("kind", kind), ("state", state))), -1.0)


@pytest.fixture
def server(redis_url: str, ns: str) -> Iterator[ServerThread]:
    with ServerThread(redis_url, ns) as srv:
        yield srv


async def test_gauges_follow_a_sigkilled_worker_and_the_sweepers_claim(
    redis: aioredis.Redis, redis_url: str, ns: str, server: ServerThread
) -> None:
    workers = [
        spawn_ready("tests.integration.worker_proc", redis_url, ns, f"w{i}", "1.0", "report")
        for i in range(3)
    ]
    try:
        async with httpx.AsyncClient(base_url=server.base_url) as http:

            async def scrape() -> str:
                response = await http.get("/metrics")
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/plain")
                return response.text

            first = await scrape()
            assert (jobs(first, "RUNNING", "report"), jobs(first, "STALE", "report")) == (3, 0)
            assert "w0" not in first
            assert "w1" not in first

            workers[0].send_signal(signal.SIGKILL)
            workers[0].wait()

            async def moved() -> str | None:
                text = await scrape()
                return text if jobs(text, "STALE", "report") == 1 else None

            text = await eventually(moved, within=15, step=0.2)
            assert jobs(text, "RUNNING", "report") == 2
            claims = ("jobpulse_sweeper_claims_total", (("kind", "report"),))
            assert samples(text)[claims] == 0

            claimed = await Sweeper(redis, namespace=ns).sweep()
            assert [job.job_id for job in claimed] == ["w0"]
            text = await scrape()
            assert (jobs(text, "RUNNING", "report"), jobs(text, "STALE", "report")) == (2, 0)
            assert samples(text)[claims] == 1
            assert samples(text)[("jobpulse_sweeper_last_sweep_age_seconds", ())] < 10
    finally:
        for proc in workers:
            stop(proc)


def test_metrics_and_cancel_go_through_authorize(redis_url: str, ns: str) -> None:
    def authorize(request: Request, job_id: str) -> bool:
        # reads allowed; no metrics; cancel only of jobs named "mine-..."
        if request.url.path == "/metrics":
            return False
        return request.method != "POST" or job_id.startswith("mine-")

    with (
        ServerThread(redis_url, ns, authorize=authorize) as srv,
        httpx.Client(base_url=srv.base_url) as http,
    ):
        assert http.get("/metrics").status_code == 403
        assert http.post("/jobs/other-1/cancel?dry_run=1").status_code == 403
        assert http.post("/jobs/mine-1/cancel?dry_run=1").json() == {"allowed": True}
        assert http.post("/jobs/bad%20id/cancel").status_code == 400
        refused = http.post("/jobs/mine-1/cancel")  # no such job
        assert refused.status_code == 409
        assert refused.json() == {"error": "job is not running", "state": "UNKNOWN"}


async def test_a_post_cancel_ends_the_job_cancelled(
    redis: aioredis.Redis, ns: str, server: ServerThread
) -> None:
    started = asyncio.Event()

    async def body() -> None:
        async with heartbeat(redis, "c1", namespace=ns, interval=0.2, ttl=5.0):
            started.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(body())
    await started.wait()
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        response = await http.post("/jobs/c1/cancel")
    assert response.status_code == 200
    assert response.json() == {"cancelled": True}
    with pytest.raises(JobCancelled):
        await asyncio.wait_for(task, 10)
    async with StatusReader(redis, namespace=ns, cache_ttl=0) as reader:
        assert (await reader.get("c1")).state is JobState.CANCELLED


async def test_a_cancel_of_a_stale_job_is_409_with_its_state_and_records_nothing(
    redis: aioredis.Redis, redis_url: str, ns: str, server: ServerThread
) -> None:
    # The worker is gone: a recorded request would wait for a worker that may never beat again,
    # and a 200 would tell the operator the job is being stopped.
    worker = spawn_ready("tests.integration.worker_proc", redis_url, ns, "s1", "1.0")
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    stop(worker)
    async with StatusReader(redis, namespace=ns, cache_ttl=0) as reader:

        async def stale() -> bool:
            return (await reader.get("s1")).state is JobState.STALE

        await eventually(stale, within=15, step=0.1)
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            response = await http.post("/jobs/s1/cancel")
        assert response.status_code == 409
        assert response.json()["state"] == "STALE"
        status = await reader.get("s1")
        assert (status.state, status.cancel_requested) == (JobState.STALE, False)
