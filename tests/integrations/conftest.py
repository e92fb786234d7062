"""Fixtures for the queue integration tests: real worker processes of each queue on the real
Redis, a queue name of the test's own (under its namespace), everything cleaned up after."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import redis.asyncio as aioredis

from tests.support import ROOT, spawn_ready, stop


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """``spawn(module, *args)`` starts a worker process (``python -m module``) and returns once
    it printed ``ready``; every process still running is killed at the end of the test."""
    procs: list[subprocess.Popen[str]] = []

    def start(module: str, *args: str) -> subprocess.Popen[str]:
        proc = spawn_ready(module, *args)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        stop(proc)


@pytest.fixture
async def queue_keys(redis: aioredis.Redis, ns: str) -> AsyncIterator[None]:
    """Drop the keys the queues wrote for this test's jobs (their ids all contain ``ns``)."""
    yield
    with contextlib.suppress(Exception):
        keys = [k async for k in redis.scan_iter(match=f"*{ns}*", count=1000)]
        if keys:
            await redis.delete(*keys)
        await redis.zrem("arq:abort", *[f"{ns}-{n}" for n in range(10)])


@pytest.fixture
def session_procs() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """``start(argv, env)`` runs a command that starts processes of its own (a queue's CLI and
    its worker children) in a new session; every process of that session is SIGKILLed at the
    end of the test."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
