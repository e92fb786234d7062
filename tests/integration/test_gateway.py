"""The gateway side over real uvicorn and real Redis: ``accepted()`` (202 + Location), the
``Retry-After`` bounds, ``Cache-Control``, the long poll (``?wait=``: 200 on a version move,
304 after ``wait``, 503 past the waiter bound, 400 for a bad ``wait``) and the ``poll()`` client.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route

from jobpulse import heartbeat, request_cancel
from jobpulse._reader.reader import StatusReader
from jobpulse.http import PollError, accepted, create_app, poll
from jobpulse.http.accept import status_path
from tests.integration.http_server import ServerThread
from tests.support import eventually

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "LOST"}


class GatewayServer(ServerThread):
    """A service with ``POST /reports?seconds=S`` (a job of S seconds under ``heartbeat()``,
    answered with ``accepted()``) and the jobpulse app mounted at ``/jp``."""

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        client = aioredis.Redis.from_url(self.redis_url)
        jobs: set[asyncio.Task[None]] = set()

        async def job(job_id: str, seconds: float, started: asyncio.Future[None]) -> None:
            steps = 20
            async with heartbeat(
                client, job_id, namespace=self.namespace, total=steps, interval=0.25, ttl=2
            ) as hb:
                started.set_result(None)
                for _ in range(steps):
                    await asyncio.sleep(seconds / steps)
                    hb.progress.advance()

        async def start(request: Request) -> Response:
            job_id = f"report-{secrets.token_hex(4)}"
            started = asyncio.get_running_loop().create_future()
            task = asyncio.create_task(job(job_id, float(request.query_params["seconds"]), started))
            jobs.add(task)
            task.add_done_callback(jobs.discard)
            await started
            return accepted(request, job_id, mount="/jp")

        try:
            async with StatusReader(
                client, namespace=self.namespace, **self.reader_options
            ) as reader:
                self.reader = reader
                app = Starlette(routes=[
                    Route("/reports", start, methods=["POST"]),
                    Mount("/jp", create_app(reader, **self.app_options)),
                ])  # fmt: skip
                self.jobpulse = app.routes[1].app  # type: ignore[attr-defined]
                config = uvicorn.Config(app, log_level="warning", lifespan="off")
                self._server = uvicorn.Server(config)
                await self._server.serve(sockets=[self.sock])
        finally:
            for task in jobs:
                task.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
            await client.aclose()

    async def parked(self) -> int:
        """Long polls parked in the jobpulse app now."""

        async def count() -> int:
            return int(self.jobpulse.state.jobpulse.longpoll.statistics().parked)

        return await self.call(count)


@pytest.fixture
async def gateway(
    redis_url: str, ns: str
) -> AsyncIterator[tuple[GatewayServer, httpx.AsyncClient]]:
    with GatewayServer(redis_url, ns, max_waiters=3, wait_interval=0.05) as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=30) as c:
            yield srv, c


def _retry_after(response: httpx.Response) -> int | None:
    value = response.headers.get("retry-after")
    return None if value is None else int(value)


async def test_post_answers_202_and_poll_follows_location_to_completed(
    gateway: tuple[GatewayServer, httpx.AsyncClient],
) -> None:
    _, c = gateway
    r = await c.post("/reports", params={"seconds": 5})
    assert r.status_code == 202
    job_id = r.json()["job_id"]
    location = r.headers["location"]
    assert location == f"/jp/jobs/{job_id}"
    assert r.json() == {"job_id": job_id, "status": location, "events": f"{location}/events"}
    assert r.headers["retry-after"] == "1"
    assert r.headers["cache-control"] == "no-store"

    seen: list[tuple[str, int | None]] = []

    async def plain_poller() -> None:
        while True:
            s = await c.get(location)
            assert s.status_code == 200
            state = s.json()["state"]
            seen.append((state, _retry_after(s)))
            if state in TERMINAL:
                return
            await asyncio.sleep(0.1)

    final, _ = await asyncio.gather(poll(location, client=c, wait=2, timeout=60), plain_poller())
    assert final["job_id"] == job_id
    assert final["state"] == "COMPLETED"
    assert final["done"] == 20
    running = [ra for state, ra in seen if state == "RUNNING"]
    assert len(running) > 10
    assert all(ra is not None and 1 <= ra <= 5 for ra in running), running
    assert seen[-1] == ("COMPLETED", None)


@pytest.mark.parametrize("job_id", ["etl/2024:x", "x/events"])
async def test_the_location_of_an_id_with_slashes_names_its_status(
    gateway: tuple[GatewayServer, httpx.AsyncClient], redis: aioredis.Redis, ns: str, job_id: str
) -> None:
    _, c = gateway
    async with heartbeat(redis, job_id, namespace=ns, interval=30, ttl=60):
        scope = {"type": "http", "root_path": "", "path": "/", "headers": []}
        location = status_path(Request(scope), job_id, mount="/jp")
        r = await c.get(location)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert r.json()["job_id"] == job_id


async def test_status_headers_running_and_terminal(
    gateway: tuple[GatewayServer, httpx.AsyncClient], redis: aioredis.Redis, ns: str
) -> None:
    _, c = gateway
    async with heartbeat(redis, "hdr", namespace=ns, interval=30, ttl=60):
        r = await c.get("/jp/jobs/hdr")
        assert r.headers["cache-control"] == "max-age=0, stale-while-revalidate=1"
        assert 1 <= int(r.headers["retry-after"]) <= 5
        again = await c.get("/jp/jobs/hdr", headers={"If-None-Match": r.headers["etag"]})
        assert again.status_code == 304
        assert 1 <= int(again.headers["retry-after"]) <= 5
    ended = await _settled(c, "/jp/jobs/hdr")
    assert "retry-after" not in ended.headers
    assert ended.headers["cache-control"] == "max-age=5, stale-while-revalidate=1"
    missing = await c.get("/jp/jobs/no-such-job", params={"wait": 1})
    assert missing.status_code == 404
    assert missing.headers["cache-control"] == "no-store"


async def test_long_poll_returns_the_new_version_when_done_moves(
    gateway: tuple[GatewayServer, httpx.AsyncClient], redis: aioredis.Redis, ns: str
) -> None:
    srv, c = gateway
    # A 30 s beat interval: no beat happens during the test unless forced, so the only
    # version move is the one the test makes.
    async with heartbeat(redis, "lp", namespace=ns, total=10, interval=30, ttl=60) as hb:
        first = await c.get("/jp/jobs/lp")
        etag = first.headers["etag"]
        assert first.json()["done"] == 0
        waiting = asyncio.create_task(
            c.get("/jp/jobs/lp", params={"wait": 30}, headers={"If-None-Match": etag})
        )
        await eventually(lambda: _equals(srv.parked(), 1))
        hb.progress.set(7)
        await hb.checkpoint(note="moved")
        moved = await waiting
    assert moved.status_code == 200
    assert moved.json()["done"] == 7
    assert moved.json()["seq"] > first.json()["seq"]
    assert moved.headers["etag"] != etag
    assert moved.headers["cache-control"] == "no-store"
    assert await srv.parked() == 0


async def test_long_poll_returns_when_a_cancel_is_requested(
    gateway: tuple[GatewayServer, httpx.AsyncClient], redis: aioredis.Redis, ns: str
) -> None:
    srv, c = gateway
    # A cancel request sets a flag without a new seq; the ETag shows it, so the long poll must.
    async with heartbeat(redis, "cx", namespace=ns, interval=30, ttl=60):
        etag = (await c.get("/jp/jobs/cx")).headers["etag"]
        waiting = asyncio.create_task(
            c.get("/jp/jobs/cx", params={"wait": 30}, headers={"If-None-Match": etag})
        )
        await eventually(lambda: _equals(srv.parked(), 1))
        await request_cancel(redis, "cx", namespace=ns)
        moved = await waiting
        assert moved.status_code == 200
        assert moved.json()["cancel_requested"] is True
        assert moved.headers["etag"] == etag.removesuffix('"') + '.cancel"'


async def test_long_poll_answers_304_after_wait_without_a_change(
    gateway: tuple[GatewayServer, httpx.AsyncClient], redis: aioredis.Redis, ns: str
) -> None:
    _, c = gateway
    async with heartbeat(redis, "idle", namespace=ns, interval=30, ttl=60):
        first = await c.get("/jp/jobs/idle")
        etag = first.headers["etag"]
        t0 = time.monotonic()
        r = await c.get("/jp/jobs/idle", params={"wait": 1}, headers={"If-None-Match": etag})
        elapsed = time.monotonic() - t0
        assert r.status_code == 304
        assert r.headers["etag"] == etag
        assert 1 <= int(r.headers["retry-after"]) <= 5
        assert elapsed >= 1.0
        # Without If-None-Match there is nothing to wait past: answered at once.
        plain = await c.get("/jp/jobs/idle", params={"wait": 30})
        assert plain.status_code == 200
        assert plain.headers["etag"] == etag
    # A terminal job will not move: a long poll on it is answered at once.
    ended = await _settled(c, "/jp/jobs/idle")
    tag = ended.headers["etag"]
    r = await c.get("/jp/jobs/idle", params={"wait": 30}, headers={"If-None-Match": tag})
    assert r.status_code == 304
    assert "retry-after" not in r.headers


async def test_long_poll_is_refused_with_503_past_the_waiter_bound(
    gateway: tuple[GatewayServer, httpx.AsyncClient], redis: aioredis.Redis, ns: str
) -> None:
    srv, c = gateway  # max_waiters=3
    async with heartbeat(redis, "crowd", namespace=ns, interval=30, ttl=60) as hb:
        etag = (await c.get("/jp/jobs/crowd")).headers["etag"]
        headers = {"If-None-Match": etag}
        parked = [
            asyncio.create_task(c.get("/jp/jobs/crowd", params={"wait": 30}, headers=headers))
            for _ in range(3)
        ]
        await eventually(lambda: _equals(srv.parked(), 3))
        refused = await c.get("/jp/jobs/crowd", params={"wait": 30}, headers=headers)
        assert refused.status_code == 503
        assert refused.json() == {"error": "too many waiting requests"}
        assert 1 <= int(refused.headers["retry-after"]) <= 5
        await hb.checkpoint()
        answers = await asyncio.gather(*parked)
    assert [a.status_code for a in answers] == [200, 200, 200]


async def test_a_client_that_goes_away_unparks_its_long_poll_at_once(
    gateway: tuple[GatewayServer, httpx.AsyncClient], redis: aioredis.Redis, ns: str
) -> None:
    srv, c = gateway
    async with heartbeat(redis, "gone", namespace=ns, interval=30, ttl=60):
        etag = (await c.get("/jp/jobs/gone")).headers["etag"]
        _, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(
            f"GET /jp/jobs/gone?wait=30 HTTP/1.1\r\nhost: x\r\nif-none-match: {etag}\r\n\r\n"
            .encode()
        )  # fmt: skip
        await writer.drain()
        await eventually(lambda: _equals(srv.parked(), 1))
        writer.close()
        await writer.wait_closed()
        await eventually(lambda: _equals(srv.parked(), 0))


@pytest.mark.parametrize("wait", ["abc", "-1", "nan", "inf", ""])
async def test_a_bad_wait_is_400(
    gateway: tuple[GatewayServer, httpx.AsyncClient], redis: aioredis.Redis, ns: str, wait: str
) -> None:
    _, c = gateway
    async with heartbeat(redis, "badwait", namespace=ns, interval=30, ttl=60):
        r = await c.get("/jp/jobs/badwait", params={"wait": wait})
    assert r.status_code == 400
    assert r.json() == {"error": "invalid wait: seconds, a number >= 0"}


async def test_wait_above_max_wait_is_cut_to_it(
    redis_url: str, redis: aioredis.Redis, ns: str
) -> None:
    with ServerThread(redis_url, ns, max_wait=1) as srv:
        async with (
            httpx.AsyncClient(base_url=srv.base_url, timeout=30) as c,
            heartbeat(redis, "cap", namespace=ns, interval=30, ttl=60),
        ):
            etag = (await c.get("/jobs/cap")).headers["etag"]
            r = await c.get("/jobs/cap", params={"wait": 3600}, headers={"If-None-Match": etag})
            assert r.status_code == 304


async def test_poll_raises_poll_error_for_a_missing_job(
    gateway: tuple[GatewayServer, httpx.AsyncClient],
) -> None:
    _, c = gateway
    with pytest.raises(PollError, match="no such job") as caught:
        await poll("/jp/jobs/never-started", client=c, timeout=10)
    assert caught.value.status_code == 404


async def test_poll_times_out_with_a_clear_error(
    gateway: tuple[GatewayServer, httpx.AsyncClient], redis: aioredis.Redis, ns: str
) -> None:
    srv, _ = gateway
    async with heartbeat(redis, "slow", namespace=ns, interval=30, ttl=60):
        with pytest.raises(TimeoutError, match=r"did not settle within 0\.5 s"):
            await poll(f"{srv.base_url}/jp/jobs/slow", wait=5, timeout=0.5)


async def _settled(c: httpx.AsyncClient, path: str) -> httpx.Response:
    """The status once the reader's cache shows COMPLETED (it may serve RUNNING for 0.5 s)."""

    async def read() -> httpx.Response | None:
        r = await c.get(path)
        return r if r.json()["state"] == "COMPLETED" else None

    return await eventually(read)


async def _equals(value: Any, expected: Any) -> bool:
    return bool(await value == expected)
