"""``jobpulse serve`` stops cleanly on SIGTERM (an orchestrator's stop): uvicorn's graceful
shutdown runs, the reader and the Redis client are closed, and the process exits 0 instead of
dying by the signal uvicorn used to re-raise. Open event streams and parked long polls are
drained as the shutdown starts: the stream ends cleanly, the long poll answers 304, and uvicorn
never has to cancel a request (no traceback, no "graceful shutdown exceeded")."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
from collections.abc import AsyncIterator

import httpx
import redis.asyncio as aioredis

from jobpulse import heartbeat
from jobpulse._provision import free_port
from tests.support import eventually

from .support import JOBPULSE, ROOT, env


async def test_sigterm_stops_serve_cleanly_with_exit_code_0(
    redis_url: str, ns: str, redis: aioredis.Redis
) -> None:
    async with _serving(redis_url, ns) as (proc, port):
        async with (
            heartbeat(redis, "served", namespace=ns, interval=0.5, ttl=10.0),
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http,
        ):
            assert (await _answer(http, "/jobs/served")).status_code == 200
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(30):
                code = await proc.wait()
        await _clean_exit(proc, code)


async def test_sigterm_drains_open_event_streams_and_long_polls(
    redis_url: str, ns: str, redis: aioredis.Redis
) -> None:
    async with _serving(redis_url, ns) as (proc, port):
        async with (
            # No beat after the first for 20 s: the job's version stays put while the poll parks.
            heartbeat(redis, "drained", namespace=ns, interval=20.0, ttl=60.0),
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http,
        ):
            first = await _answer(http, "/jobs/drained")
            assert first.status_code == 200
            etag = first.headers["etag"]
            # The long poll's connection is opened (and kept alive) before the stream takes the
            # first one, so the poll is a request on a live connection when the signal comes.
            warm = await asyncio.gather(http.get("/jobs/drained"), http.get("/jobs/drained"))
            assert [r.status_code for r in warm] == [200, 200]
            async with http.stream("GET", "/jobs/drained/events") as stream:
                lines = stream.aiter_lines()
                assert await anext(lines) == "retry: 2000"  # the stream is open
                parked = asyncio.ensure_future(
                    http.get("/jobs/drained?wait=30", headers={"if-none-match": etag})
                )
                await asyncio.sleep(0.5)  # the long poll is parked
                proc.send_signal(signal.SIGTERM)
                async with asyncio.timeout(30):
                    rest = [line async for line in lines]  # ends: the server ended the stream
                    polled = await parked
                    code = await proc.wait()
        assert ": connected" in rest
        assert polled.status_code == 304
        await _clean_exit(proc, code)


@contextlib.asynccontextmanager
async def _serving(
    redis_url: str, ns: str
) -> AsyncIterator[tuple[asyncio.subprocess.Process, int]]:
    """``jobpulse serve`` on a free port (stderr piped); killed at the end if still running."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        *JOBPULSE, "serve", "--port", str(port), "--redis", redis_url, "--namespace", ns,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT, env=env(),
    )  # fmt: skip
    try:
        yield proc, port
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _answer(http: httpx.AsyncClient, path: str) -> httpx.Response:
    """The first answer of the starting server to ``GET path``."""

    async def once() -> httpx.Response | None:
        with contextlib.suppress(httpx.TransportError):
            return await http.get(path)
        return None

    return await eventually(once, within=60, step=0.1)


async def _clean_exit(proc: asyncio.subprocess.Process, code: int) -> None:
    assert proc.stderr is not None
    errors = (await proc.stderr.read()).decode()
    assert code == 0, errors
    assert "Traceback" not in errors, errors
    assert "graceful shutdown exceeded" not in errors, errors
