"""``jobpulse serve`` stops cleanly on SIGTERM (an orchestrator's stop): uvicorn's graceful
shutdown runs, the reader and the Redis client are closed, and the process exits 0 instead of
dying by the signal uvicorn used to re-raise. (An SSE stream still open at that moment is
cancelled by uvicorn after its 2 s graceful timeout: the stream does not watch for shutdown.)"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess

import httpx
import redis.asyncio as aioredis

from jobpulse import heartbeat
from jobpulse._provision import free_port
from tests.support import eventually

from .support import JOBPULSE, ROOT, env


async def test_sigterm_stops_serve_cleanly_with_exit_code_0(
    redis_url: str, ns: str, redis: aioredis.Redis
) -> None:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        *JOBPULSE, "serve", "--port", str(port), "--redis", redis_url, "--namespace", ns,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT, env=env(),
    )  # fmt: skip
    try:
        async with (
            heartbeat(redis, "served", namespace=ns, interval=0.5, ttl=10.0),
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http,
        ):

            async def answer() -> httpx.Response | None:
                with contextlib.suppress(httpx.TransportError):
                    return await http.get("/jobs/served")
                return None

            assert (await eventually(answer, within=60, step=0.1)).status_code == 200
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(30):
                code = await proc.wait()
        assert proc.stderr is not None
        errors = (await proc.stderr.read()).decode()
        assert code == 0, errors
        assert "Traceback" not in errors, errors
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
