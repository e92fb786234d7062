"""The HTTP app over a single Redis and over a real Redis Cluster: JSON status with its ETag,
the job list from 3 index shards spread over the masters, and SSE of a job to its end."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis
import uvicorn
from redis.asyncio.cluster import RedisCluster

from jobpulse import heartbeat
from jobpulse._reader.reader import StatusReader
from jobpulse.http import create_app
from tests.integration.http_server import ServerThread
from tests.integration.test_http import frames
from tests.support import connect, eventually, url_of

AnyRedis = aioredis.Redis | RedisCluster


class AnyServerThread(ServerThread):
    """``ServerThread`` whose reader's client comes from :func:`tests.support.connect`, so a
    ``cluster:`` URL gives it a ``RedisCluster``."""

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        client = await connect(self.redis_url)
        try:
            async with StatusReader(
                client, namespace=self.namespace, **self.reader_options
            ) as reader:
                self.reader = reader
                app = create_app(reader, **self.app_options)
                config = uvicorn.Config(app, log_level="warning", lifespan="off",
                                        timeout_graceful_shutdown=1)  # fmt: skip
                self._server = uvicorn.Server(config)
                await self._server.serve(sockets=[self.sock])
        finally:
            await client.aclose()


@pytest.fixture
async def http(client: AnyRedis, ns: str) -> AsyncIterator[httpx.AsyncClient]:
    with AnyServerThread(url_of(client), ns, index_shards=3) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as c:
            yield c


async def test_status_list_and_events_over_http(
    http: httpx.AsyncClient, client: AnyRedis, ns: str
) -> None:
    jobs = [f"h{i}" for i in range(6)]
    opts = {"namespace": ns, "interval": 0.05, "index_every": 1, "index_shards": 3}
    hbs = [heartbeat(client, j, total=4, **opts) for j in jobs]
    for hb in hbs:
        await hb.__aenter__()
    try:
        hbs[0].progress.advance(2)
        await hbs[0].checkpoint(row=2)

        async def advanced() -> bool:
            return bool((await http.get(f"/jobs/{jobs[0]}")).json()["done"] == 2)

        await eventually(advanced, within=20)
        r = await http.get(f"/jobs/{jobs[0]}")
        assert r.json()["state"] == "RUNNING"
        again = await http.get(f"/jobs/{jobs[0]}", headers={"If-None-Match": r.headers["etag"]})
        assert again.status_code in (200, 304)  # 304 unless a beat changed the snapshot
        listed = await http.get("/jobs")
        assert listed.status_code == 200
        assert {j["job_id"] for j in listed.json()["jobs"]} == set(jobs)
        assert (await http.get("/jobs/nope")).status_code == 404
    finally:
        for hb in hbs:
            await hb.__aexit__(None, None, None)
    kinds = []
    async with http.stream("GET", f"/jobs/{jobs[0]}/events") as response:
        assert response.status_code == 200
        async for frame in frames(response):
            kinds.append(frame.event)
    assert kinds[0] == "start"
    assert "checkpoint" in kinds
    assert kinds[-1] == "end"
