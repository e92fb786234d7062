"""The processes of ``bench_gateway``: the app under test (``serve``), the jobs' worker
(``work``), nginx in front, and a minimal keep-alive HTTP/1.1 client.

``python -m benchmarks.gateway_procs serve REDIS_URL PORT CACHE_TTL`` and
``python -m benchmarks.gateway_procs work REDIS_URL PREFIX JOBS SECONDS INTERVAL`` are what
:func:`app_process` and :func:`workers` start.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

NS = "gw"

# -- the app under test (``serve``) ------------------


def serve(redis_url: str, port: int, cache_ttl: float) -> None:
    import redis.asyncio as aioredis
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Mount, Route

    from jobpulse import StatusReader, heartbeat
    from jobpulse.http import accepted, create_app

    async def main() -> None:
        client = aioredis.Redis.from_url(redis_url, max_connections=200)
        jobs: set[asyncio.Task[None]] = set()

        async def job(job_id: str, seconds: float, interval: float, ready: Any) -> None:
            async with heartbeat(
                client, job_id, namespace=NS, total=1000, interval=interval, ttl=4 * interval
            ) as hb:
                ready.set_result(None)
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    await asyncio.sleep(0.1)
                    hb.progress.advance()

        async def start(request: Request) -> Response:
            q = request.query_params
            job_id = q["id"]
            ready = asyncio.get_running_loop().create_future()
            task = asyncio.create_task(
                job(job_id, float(q["seconds"]), float(q["interval"]), ready)
            )
            jobs.add(task)
            task.add_done_callback(jobs.discard)
            await ready
            return accepted(request, job_id, mount="/jp")

        async with StatusReader(client, namespace=NS, cache_ttl=cache_ttl) as reader:
            app = Starlette(
                routes=[
                    Route("/start", start, methods=["POST"]),
                    Mount("/jp", create_app(reader, max_waiters=20_000)),
                ]
            )
            config = uvicorn.Config(
                app, host="127.0.0.1", port=port, log_level="warning", lifespan="off",
                backlog=8192, timeout_keep_alive=120,
            )  # fmt: skip
            await uvicorn.Server(config).serve()

    # uvicorn re-raises the SIGINT that stopped it once it has shut down cleanly.
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())


def work(redis_url: str, prefix: str, jobs: int, seconds: float, interval: float) -> None:
    """The long-poll part's jobs, in a process of their own (as workers are): ``jobs``
    heartbeats advancing every 0.1 s, started spread over one interval (so their beats are,
    as those of jobs started by independent requests); prints ``ready`` once every lease is
    held."""
    import redis.asyncio as aioredis

    from jobpulse import heartbeat

    async def job(client: Any, i: int, ready: asyncio.Event, started: list[int]) -> None:
        await asyncio.sleep(i * interval / jobs)
        async with heartbeat(
            client,
            f"{prefix}-{i}",
            namespace=NS,
            total=1000,
            interval=interval,
            ttl=4 * interval,
        ) as hb:
            started.append(i)
            if len(started) == jobs:
                ready.set()
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                await asyncio.sleep(0.1)
                hb.progress.advance()

    async def main() -> None:
        client = aioredis.Redis.from_url(redis_url)
        ready = asyncio.Event()
        started: list[int] = []
        tasks = [asyncio.create_task(job(client, i, ready, started)) for i in range(jobs)]
        await ready.wait()
        print("ready", flush=True)
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            # Let every job write its final state before the client closes.
            await asyncio.shield(asyncio.gather(*tasks, return_exceptions=True))
            await client.aclose()

    # SIGINT cancels the jobs (they end CANCELLED and free their shared memory).
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())


@contextlib.contextmanager
def workers(
    redis_url: str, prefix: str, jobs: int, seconds: float, interval: float
) -> Iterator[None]:
    cmd = [sys.executable, "-m", "benchmarks.gateway_procs", "work", redis_url, prefix,
           str(jobs), str(seconds), str(interval)]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=Path(__file__).resolve().parent.parent, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the bench workers did not start")
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def app_process(redis_url: str, cache_ttl: float) -> Iterator[tuple[int, psutil.Process]]:
    port = free_port()
    cmd = [sys.executable, "-m", "benchmarks.gateway_procs", "serve", redis_url, str(port),
           str(cache_ttl)]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parent.parent)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the gateway app did not start")
            time.sleep(0.05)
        yield port, psutil.Process(proc.pid)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- a minimal keep-alive HTTP/1.1 client (httpx costs more CPU than the server measured) -----


class Conn:
    def __init__(self, port: int) -> None:
        self.port = port
        self.r: asyncio.StreamReader | None = None
        self.w: asyncio.StreamWriter | None = None

    async def request(
        self, method: str, path: str, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        if self.w is None:
            self.r, self.w = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.r is not None
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.w.write(f"{method} {path} HTTP/1.1\r\nhost: bench\r\ncontent-length: 0\r\n{extra}\r\n"
                     .encode())  # fmt: skip
        head = await self.r.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        hdrs = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
        if "content-length" in hdrs:
            body = await self.r.readexactly(int(hdrs["content-length"]))
        elif hdrs.get("transfer-encoding") == "chunked":
            parts = []
            while size := int((await self.r.readline()).strip(), 16):
                parts.append(await self.r.readexactly(size))
                await self.r.readline()
            await self.r.readline()
            body = b"".join(parts)
        else:
            body = b""
        if hdrs.get("connection") == "close":
            self.close()
        return status, hdrs, body

    def close(self) -> None:
        if self.w is not None:
            self.w.close()
        self.r = self.w = None


# -- part 3: nginx proxy cache ---------------------------------------------------------------

_NGINX = """
{user}worker_processes 1; daemon off; pid {d}/nginx.pid; error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fcgi;
  uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
  proxy_cache_path {d}/cache keys_zone=jobpulse:10m;
  upstream apps {{ server 127.0.0.1:{a}; server 127.0.0.1:{b}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://apps;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_cache jobpulse;
      proxy_cache_lock on;
      proxy_cache_background_update on;
      proxy_cache_use_stale updating;
      add_header X-Cache $upstream_cache_status;
    }}
  }}
}}
"""


@contextlib.contextmanager
def nginx(a: int, b: int) -> Iterator[int]:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        conf = Path(d) / "nginx.conf"
        # A root master runs its worker as nobody, who could not write the cache in this dir.
        user = "user root;\n" if os.geteuid() == 0 else ""
        conf.write_text(_NGINX.format(d=d, a=a, b=b, port=port, user=user))
        proc = subprocess.Popen([nginx, "-c", str(conf), "-p", d, "-e", f"{d}/error.log"])
        try:
            deadline = time.monotonic() + 10
            while True:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        "nginx did not start: " + (Path(d) / "error.log").read_text()
                    )
                time.sleep(0.05)
            yield port
        finally:
            proc.send_signal(signal.SIGQUIT)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    elif sys.argv[1:2] == ["work"]:
        work(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6]))
