"""The operator token (``create_app(token=...)``, ``jobpulse serve --token``) on a real uvicorn
server with a real worker process: without ``Authorization: Bearer <token>`` a cancel (and its
dry run) and ``GET /metrics`` answer 401 and the job goes on running, untouched; with it, the
cancel ends the job CANCELLED. Status, events and the job list stay readable without it."""

from __future__ import annotations

import httpx
import pytest
import redis.asyncio as aioredis

from jobpulse import JobState, StatusReader
from jobpulse.http import create_app

from ..support import spawn_ready, stop
from .http_server import ServerThread

TOKEN = "t0k3n-for-tests_only"


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def test_without_the_token_cancel_and_metrics_are_401_and_the_job_runs_on(
    redis: aioredis.Redis, redis_url: str, ns: str
) -> None:
    worker = spawn_ready("tests.integration.worker_proc", redis_url, ns, "guarded", "2.0")
    try:
        with ServerThread(redis_url, ns, token=TOKEN) as srv:
            async with httpx.AsyncClient(base_url=srv.base_url, timeout=30) as http:
                refused = [
                    await http.post("/jobs/guarded/cancel"),
                    await http.post("/jobs/guarded/cancel?dry_run=1"),
                    await http.post("/jobs/guarded/cancel", headers=bearer("wrong")),
                    await http.post("/jobs/guarded/cancel", headers={"authorization": TOKEN}),
                    await http.post(
                        "/jobs/guarded/cancel", headers={"authorization": f"Basic {TOKEN}"}
                    ),
                    await http.get("/metrics"),
                    await http.get("/metrics", headers=bearer(TOKEN + "x")),
                ]
                for response in refused:
                    assert response.status_code == 401, response.request.url
                    assert response.headers["www-authenticate"] == 'Bearer realm="jobpulse"'
                    assert response.json()["error"].startswith("unauthorized")
                    assert TOKEN not in response.text
                # reads need no token
                assert (await http.get("/jobs")).json()["jobs"][0]["job_id"] == "guarded"
                status = await http.get("/jobs/guarded")
                assert status.status_code == 200
                assert status.json()["state"] == "RUNNING"
                assert status.json()["cancel_requested"] is False  # nothing was written

                allowed = await http.post("/jobs/guarded/cancel?dry_run=1", headers=bearer(TOKEN))
                assert allowed.json() == {"allowed": True}
                scraped = await http.get("/metrics", headers=bearer(TOKEN))
                assert scraped.status_code == 200
                assert "jobpulse_jobs" in scraped.text
                # the scheme is case-insensitive (RFC 7235)
                done = await http.post(
                    "/jobs/guarded/cancel", headers={"authorization": f"bearer {TOKEN}"}
                )
                assert done.json() == {"cancelled": True}
        assert worker.wait(timeout=30) != 0  # JobCancelled out of the worker's heartbeat
        async with StatusReader(redis, namespace=ns, cache_ttl=0) as reader:
            assert (await reader.get("guarded")).state is JobState.CANCELLED
    finally:
        stop(worker)


async def test_a_malformed_token_is_refused_before_anything_is_served(
    redis: aioredis.Redis, ns: str
) -> None:
    async with StatusReader(redis, namespace=ns) as reader:
        for token, words in [
            ("", "empty"),
            ("two words", "without spaces"),
            ("line\nbreak", "without spaces"),
            ("caf\u00e9", "ASCII"),
        ]:
            with pytest.raises(ValueError, match=words) as caught:
                create_app(reader, token=token)
            if token:
                assert token not in str(caught.value)  # a secret is never repeated
        with pytest.raises(TypeError, match="token must be a str"):
            create_app(reader, token=b"bytes")  # type: ignore[arg-type]
        app = create_app(reader, token=TOKEN)
        assert TOKEN not in repr(app.state.jobpulse)
