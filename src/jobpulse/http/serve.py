"""``serve()``: run the HTTP app with uvicorn against one Redis (``jobpulse serve``)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .._protocol.keys import check_namespace
from .auth import check_token, exposure_error

__all__ = ["serve", "serve_async"]


async def serve_async(
    redis_url: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    namespace: str = "jobpulse",
    *,
    sock: socket.socket | None = None,
    keepalive: float = 15.0,
    index_shards: int = 1,
    log_level: str = "info",
    token: str | None = None,
    insecure: bool = False,
) -> None:
    """Serve the app until told to stop (SIGINT / SIGTERM); see :func:`serve`.

    A signal starts uvicorn's graceful shutdown: open event streams end at once (clients
    reconnect elsewhere with their ``Last-Event-ID``) and parked long polls answer 304; the
    reader and the Redis client are then closed and the function returns.

    Args:
        redis_url: ``redis://`` URL of the server holding the jobs.
        host: interface to listen on.
        port: port to listen on (ignored when ``sock`` is given).
        namespace: the jobs' namespace.
        sock: an already bound socket to serve on instead of ``host``/``port``.
        keepalive: seconds between SSE keep-alive comments.
        index_shards: the workers' ``index_shards``.
        log_level: uvicorn's log level.
        token: the operator token cancels and ``/metrics`` require (see :func:`serve`).
        insecure: serve beyond loopback without a token.

    Raises:
        ValueError: ``host`` (or ``sock``'s address) is beyond loopback and there is no token
            nor ``insecure``; or the token is malformed.
    """
    import redis.asyncio as aioredis
    import uvicorn

    from .._reader.reader import StatusReader
    from .app import create_app

    check_namespace(namespace)
    check_token(token)
    bound = host if sock is None else str(sock.getsockname()[0])
    refusal = exposure_error(bound, token=token, insecure=insecure)
    if refusal is not None:
        raise ValueError(refusal)
    client = aioredis.Redis.from_url(redis_url)
    try:
        async with StatusReader(client, namespace=namespace) as reader:
            app = create_app(reader, token=token, keepalive=keepalive, index_shards=index_shards)
            config = uvicorn.Config(
                app, host=host, port=port, log_level=log_level, lifespan="off",
                timeout_graceful_shutdown=2,
            )  # fmt: skip
            server = _server_class(uvicorn.Server, app.state.jobpulse.drain)(config)
            await server.serve(sockets=None if sock is None else [sock])
    finally:
        await client.aclose()


def _server_class(base: Any, drain: Callable[[], None]) -> Any:
    """uvicorn's ``Server`` stopping on SIGINT / SIGTERM *without* re-raising the signal, and
    draining the app (``drain``) as it starts to shut down.

    uvicorn re-raises the signal once its graceful shutdown is over, which kills the process by
    the signal's default action before ``serve_async`` has closed its reader and Redis client.
    Here the signals only ask the server to stop (a second SIGINT forces it), and ``serve()``
    returns normally: ``jobpulse serve`` exits 0 after a clean shutdown.
    """

    class Server(base):  # type: ignore[misc]
        def handle_exit(self, sig: int, frame: Any) -> None:
            drain()  # streams and long polls end now: the graceful shutdown has nothing to cut
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self.handle_exit, sig, None)
            try:
                yield
            finally:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)

    return Server


def serve(
    redis_url: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    namespace: str = "jobpulse",
    *,
    keepalive: float = 15.0,
    index_shards: int = 1,
    log_level: str = "info",
    token: str | None = None,
    insecure: bool = False,
) -> None:
    """Run the dashboard and the JSON / SSE endpoints with uvicorn; blocks until stopped.

    With ``token``, ``POST /jobs/{id}/cancel`` and ``GET /metrics`` answer 401 unless the request
    carries ``Authorization: Bearer <token>`` (the dashboard takes it from its URL fragment,
    ``/#token=...``). Without one, ``serve`` refuses to bind beyond loopback unless ``insecure``.

    Args:
        redis_url: ``redis://`` URL of the server holding the jobs.
        host: interface to listen on.
        port: port to listen on.
        namespace: the jobs' namespace.
        keepalive: seconds between SSE keep-alive comments.
        index_shards: the workers' ``index_shards``.
        log_level: uvicorn's log level.
        token: the operator token (printable ASCII without spaces), or None.
        insecure: bind beyond loopback (``0.0.0.0``, a public address) without a token.

    Raises:
        InvalidJobId: ``namespace`` is invalid.
        ValueError: ``host`` is beyond loopback without a token nor ``insecure``, or the token
            is malformed; raised before anything is bound.
    """
    asyncio.run(
        serve_async(
            redis_url,
            host,
            port,
            namespace,
            keepalive=keepalive,
            index_shards=index_shards,
            log_level=log_level,
            token=token,
            insecure=insecure,
        )
    )


if __name__ == "__main__":  # python -m jobpulse.http.serve URL [HOST PORT NAMESPACE]
    import os
    import sys

    args = sys.argv[1:]
    serve(
        args[0],
        args[1] if len(args) > 1 else "127.0.0.1",
        int(args[2]) if len(args) > 2 else 8000,
        args[3] if len(args) > 3 else "jobpulse",
        token=os.environ.get("JOBPULSE_TOKEN") or None,
    )
