"""A real uvicorn serving ``jobpulse.http.create_app`` on a free port, in a thread of its own.

The server thread runs its own event loop with its own Redis client and ``StatusReader``, so the
test's loop (or a sync browser test) talks to it over real TCP, like any HTTP client. ``call()``
runs a coroutine on the server's loop (e.g. to read the reader's statistics safely).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import redis.asyncio as aioredis
import uvicorn

from jobpulse._reader.reader import StatusReader
from jobpulse.http import create_app

T = TypeVar("T")


class ServerThread:
    """``with ServerThread(url, ns, keepalive=0.5) as server:`` — ``server.base_url`` answers."""

    def __init__(
        self, redis_url: str, namespace: str, *, reader_options: dict[str, Any] | None = None,
        **app_options: Any,
    ) -> None:  # fmt: skip
        self.redis_url = redis_url
        self.namespace = namespace
        self.reader_options = {
            "liveness_interval": 0.2,
            "watch_block": 0.5,
            **(reader_options or {}),
        }
        self.app_options = app_options
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.reader: StatusReader | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._server: uvicorn.Server | None = None
        self._thread = threading.Thread(target=self._run, name="uvicorn-test", daemon=True)
        self._failure: BaseException | None = None

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:
            self._failure = exc

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        client = aioredis.Redis.from_url(self.redis_url)
        try:
            async with StatusReader(
                client, namespace=self.namespace, **self.reader_options
            ) as reader:
                self.reader = reader
                app = create_app(reader, **self.app_options)
                config = uvicorn.Config(
                    app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1,
                    limit_concurrency=10_000, backlog=4096,
                )  # fmt: skip
                self._server = uvicorn.Server(config)
                await self._server.serve(sockets=[self.sock])
        finally:
            await client.aclose()

    def __enter__(self) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not (self._server is not None and self._server.started):
            if self._failure is not None:
                raise RuntimeError("the test server failed to start") from self._failure
            if time.monotonic() > deadline:
                raise TimeoutError("the test server did not start within 30 s")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._server.force_exit = True
        self._thread.join(timeout=15)
        with contextlib.suppress(OSError):
            self.sock.close()

    def call_sync(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Run ``fn()`` on the server's loop and wait for its result (from any thread)."""
        assert self.loop is not None
        future: Future[T] = asyncio.run_coroutine_threadsafe(_awaited(fn), self.loop)
        return future.result(timeout=30)

    async def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Run ``fn()`` on the server's loop, from another event loop."""
        assert self.loop is not None
        future = asyncio.run_coroutine_threadsafe(_awaited(fn), self.loop)
        return await asyncio.wrap_future(future)

    async def watchers(self) -> int:
        """Watchers attached to the server reader's watch hub now."""

        async def count() -> int:
            assert self.reader is not None
            return self.reader.statistics().watch.watchers

        return await self.call(count)


async def _awaited(fn: Callable[[], Awaitable[T]]) -> T:
    return await fn()
