"""``jobpulse serve`` and its operator token, as a real process: it refuses to bind beyond
loopback without a token (exit 64, before binding or reaching Redis) unless given
``--insecure``; with ``JOBPULSE_TOKEN`` set it serves on ``0.0.0.0`` and refuses a cancel that
does not carry the token (401), while the job runs on."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
from collections.abc import AsyncIterator

import httpx
import redis.asyncio as aioredis

from jobpulse import heartbeat
from jobpulse._provision import free_port
from tests.support import eventually, spawn_ready, stop

from .support import JOBPULSE, ROOT, cli, env

TOKEN = "cli-test-token-0123456789"


async def test_a_bind_beyond_loopback_without_a_token_is_refused(redis_url: str, ns: str) -> None:
    for host in ("0.0.0.0", "::"):
        port = free_port()
        result = await cli(
            "serve", "--host", host, "--port", str(port), "--redis", redis_url, "--namespace", ns,
            environ=env(JOBPULSE_TOKEN=""),
        )  # fmt: skip
        assert result.code == 64, result.err
        assert "refusing to serve" in result.err
        assert "--token" in result.err
        assert "--insecure" in result.err
        assert "Traceback" not in result.err
        with socket.socket() as probe:  # nothing was ever bound there
            assert probe.connect_ex(("127.0.0.1", port)) != 0


async def test_a_malformed_token_is_refused_without_repeating_it(redis_url: str) -> None:
    result = await cli("serve", "--token", "two words", "--redis", redis_url)
    assert result.code == 64
    assert "invalid --token" in result.err
    assert "two words" not in result.err


async def test_with_the_token_in_the_environment_a_cancel_needs_it(redis_url: str, ns: str) -> None:
    worker = spawn_ready("tests.integration.worker_proc", redis_url, ns, "served", "2.0")
    try:
        async with (
            _serving(redis_url, ns, "--host", "0.0.0.0", JOBPULSE_TOKEN=TOKEN) as port,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http,
        ):
            await _answer(http, "/jobs/served")
            refused = await http.post("/jobs/served/cancel")
            assert refused.status_code == 401
            assert (await http.get("/metrics")).status_code == 401
            status = (await http.get("/jobs/served")).json()
            assert (status["state"], status["cancel_requested"]) == ("RUNNING", False)
            bearer = {"authorization": f"Bearer {TOKEN}"}
            done = await http.post("/jobs/served/cancel", headers=bearer)
            assert done.json() == {"cancelled": True}
        assert worker.wait(timeout=30) != 0  # JobCancelled out of the worker's heartbeat
    finally:
        stop(worker)


async def test_insecure_serves_beyond_loopback_without_a_token(
    redis_url: str, ns: str, redis: aioredis.Redis
) -> None:
    async with (
        _serving(redis_url, ns, "--host", "0.0.0.0", "--insecure", JOBPULSE_TOKEN="") as port,
        heartbeat(redis, "open", namespace=ns, interval=0.5, ttl=10.0),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http,
    ):
        await _answer(http, "/jobs/open")
        assert (await http.post("/jobs/open/cancel?dry_run=1")).json() == {"allowed": True}


@contextlib.asynccontextmanager
async def _serving(redis_url: str, ns: str, *args: str, **environ: str) -> AsyncIterator[int]:
    """``jobpulse serve ARGS`` on a free port; killed at the end if still running."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        *JOBPULSE, "serve", "--port", str(port), "--redis", redis_url, "--namespace", ns, *args,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, env=env(**environ),
    )  # fmt: skip
    try:
        yield port
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _answer(http: httpx.AsyncClient, path: str) -> httpx.Response:
    async def once() -> httpx.Response | None:
        with contextlib.suppress(httpx.TransportError):
            return await http.get(path)
        return None

    return await eventually(once, within=60, step=0.1)
