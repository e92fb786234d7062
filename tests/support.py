"""Helpers shared by the tests (no fixtures here: those live in conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


async def eventually(
    predicate: Callable[[], Awaitable[T]], within: float = 10.0, step: float = 0.02
) -> T:
    """Await ``predicate()`` until it returns a truthy value, and return that value.

    Raises TimeoutError after ``within`` seconds: the condition never held.
    """
    async with asyncio.timeout(within):
        while True:
            value = await predicate()
            if value:
                return value
            await asyncio.sleep(step)


class Monitor:
    """Collects what Redis MONITOR shows, over a raw connection of its own.

    ``commands()`` gives the lowercased name of every top-level command (those a script ran are
    tagged ``[db lua]`` by Redis and left out). Use as ``async with Monitor(port) as mon:``.
    """

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.host, self.port = host, port
        self.lines: list[str] = []
        self._task: asyncio.Task[None] | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> Monitor:
        reader, self._writer = await asyncio.open_connection(self.host, self.port)
        self._writer.write(b"MONITOR\r\n")
        assert (await reader.readline()).strip() == b"+OK"
        self._task = asyncio.create_task(self._collect(reader))
        return self

    async def _collect(self, reader: asyncio.StreamReader) -> None:
        while line := await reader.readline():
            self.lines.append(line.decode(errors="replace"))

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        assert self._writer is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._writer.close()
        await self._writer.wait_closed()

    def commands(self) -> list[str]:
        return [
            line.split('"')[1].lower()
            for line in list(self.lines)
            if " lua]" not in line and '"' in line
        ]


def url_of(client: object) -> str:
    """A URL a worker process can open with :func:`connect` to reach what ``client`` reaches:
    ``cluster:redis://host:port/0`` for a ``RedisCluster``, ``redis://host:port/db`` else."""
    from redis.asyncio.cluster import RedisCluster

    if isinstance(client, RedisCluster):
        node = client.get_default_node()
        return f"cluster:redis://{node.host}:{node.port}/0"
    kw = client.connection_pool.connection_kwargs  # type: ignore[attr-defined]
    return f"redis://{kw['host']}:{kw['port']}/{kw.get('db', 0)}"


async def connect(url: str) -> Any:
    """A ``redis.asyncio`` client for a URL of :func:`url_of` (a cluster client for
    ``cluster:`` URLs, initialized before it is shared by concurrent tasks)."""
    import redis.asyncio as aioredis
    from redis.asyncio.cluster import RedisCluster

    if url.startswith("cluster:"):
        return await RedisCluster.from_url(url.removeprefix("cluster:")).initialize()
    return aioredis.Redis.from_url(url)


ROOT = Path(__file__).resolve().parents[1]


def spawn_ready(module: str, *args: str, stdin: bool = False) -> subprocess.Popen[str]:
    """Start ``python -m module *args`` from the repository root; return once it printed a line
    starting with ``ready`` (a real process: tests SIGKILL or SIGSTOP it)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("ready"), line
    return proc


def spawn_worker(url: str, ns: str, job: str, ttl: float) -> subprocess.Popen[str]:
    """A worker process holding the heartbeat of ``job`` forever (worker_proc.py)."""
    return spawn_ready("tests.integration.worker_proc", url, ns, job, str(ttl))


def stop(proc: subprocess.Popen[str]) -> None:
    """Kill the process (if it still runs), reap it and close its pipes."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()
