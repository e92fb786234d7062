"""The gateway: POST→202 latency, thousands of parked long polls on one app process, and what
a caching proxy (nginx) in front saves.

Three parts, against a private ``redis-server`` and app processes of their own (uvicorn, this
module's ``serve`` command: a ``POST /start`` answered with ``accepted()`` and the jobpulse app
mounted at ``/jp``):

1. **POST→202.** Each of ``jobs`` short jobs is started by a ``POST /start`` whose handler
   enters ``heartbeat()`` in the background and returns ``accepted()`` once the lease is held;
   the client times each request, one after the other, on a raw keep-alive HTTP/1.1
   connection (so the figure is the server's, not an HTTP library's).
2. **Long polls.** ``polls`` clients on ``jobs`` jobs, each on a connection of its own, loop on
   ``GET /jp/jobs/{id}?wait=30`` with ``If-None-Match``. The jobs run in a worker process of
   their own and beat every ``interval`` s (every beat moves the version, and wakes every
   poll of the job). Each row has a fresh app process; the window opens once every client
   got its first answer and the backlog of that connection wave had time to drain. Redis
   reads/s are the ``HMGET`` calls of ``INFO commandstats`` over the window, less the one
   each beat script makes, divided by its length; the wake-up latency of a 200 is the
   client's receive time minus the snapshot's ``heartbeat_ms`` (the Redis server's clock, the
   same host); RSS is the app process's, sampled during the window (the largest); app CPU is
   its user + system time over the window.
3. **Proxy cache.** Two app processes (``cache_ttl=1``, so ``max-age=1,
   stale-while-revalidate=1``) behind nginx from Debian (``proxy_cache``, ``proxy_cache_lock``,
   ``proxy_cache_background_update``), against the same clients hitting the two apps directly,
   round robin. Skipped, and said so, when ``nginx`` is not installed.
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

import orjson
import psutil

from .common import Probe, pct, private_redis

NAME = "gateway"
TITLE = "Gateway: POST→202, long polls, proxy cache"
NS = "gw"
ROWS = ((500, 2.0), (5000, 20.0))
"""The long-poll part of a full run: (parked polls, beat interval of the jobs). Every beat
wakes every poll of its job, so both rows offer 250 wakes/s: they differ in what is parked."""


# -- the app under test (``python -m benchmarks.bench_gateway serve ...``) ------------------


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
def _workers(
    redis_url: str, prefix: str, jobs: int, seconds: float, interval: float
) -> Iterator[None]:
    cmd = [sys.executable, "-m", "benchmarks.bench_gateway", "work", redis_url, prefix,
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


def _reads(probe: Probe) -> int:
    """Status reads so far: HMGET calls, less the one each beat script makes (``INFO
    commandstats`` counts a script's own commands)."""
    cmds = probe.snapshot()["cmds"]
    scripts = cmds.get("evalsha", (0, 0))[0] + cmds.get("eval", (0, 0))[0]
    return int(cmds.get("hmget", (0, 0))[0] - scripts)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _app(redis_url: str, cache_ttl: float) -> Iterator[tuple[int, psutil.Process]]:
    port = _free_port()
    cmd = [sys.executable, "-m", "benchmarks.bench_gateway", "serve", redis_url, str(port),
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


async def _start_jobs(port: int, n: int, seconds: float, interval: float) -> list[float]:
    conn = Conn(port)
    latencies = []
    for i in range(n):
        t0 = time.perf_counter()
        status, _, _ = await conn.request(
            "POST", f"/start?id=job-{i}&seconds={seconds}&interval={interval}"
        )
        latencies.append((time.perf_counter() - t0) * 1000)
        assert status == 202, status
    conn.close()
    return latencies


# -- part 2: parked long polls -----------------------------------------------------------------


async def _long_polls(
    port: int, proc: psutil.Process, probe: Probe, jobs: int, polls: int, window: float,
    settle: float, interval: float, prefix: str,
) -> dict[str, Any]:  # fmt: skip
    stop = asyncio.Event()
    wakes: list[float] = []
    counts = {"200": 0, "304": 0, "other": 0}
    rss = [proc.memory_info().rss]
    connected = asyncio.Semaphore(500)  # connect in waves: the listen backlog is finite
    answered = 0
    everybody = asyncio.Event()

    async def client(i: int) -> None:
        nonlocal answered
        conn = Conn(port)
        path = f"/jp/jobs/{prefix}-{i % jobs}"
        async with connected:
            _, hdrs, _ = await conn.request("GET", path)
        etag = hdrs["etag"]
        answered += 1
        if answered == polls:
            everybody.set()
        try:
            while not stop.is_set():
                status, hdrs, body = await conn.request(
                    "GET", f"{path}?wait=30", {"if-none-match": etag}
                )
                now_ms = time.time() * 1000
                if status == 200:
                    etag = hdrs["etag"]
                if not measuring:
                    continue
                if status == 200:
                    counts["200"] += 1
                    wakes.append(now_ms - orjson.loads(body)["heartbeat_ms"])
                elif status == 304:
                    counts["304"] += 1
                else:
                    counts["other"] += 1
        finally:
            conn.close()

    measuring = False
    tasks = [asyncio.create_task(client(i)) for i in range(polls)]
    t_start = time.monotonic()
    # Every client connected and answered once (the app has worked through the wave of
    # connections), then a moment for the long polls to park: measure the steady state only.
    await asyncio.wait_for(everybody.wait(), 300)
    connect_s = time.monotonic() - t_start
    # A slow connection wave leaves a backlog of answers to work off: give it time to drain.
    await asyncio.sleep(max(settle, connect_s / 2))
    before = _reads(probe)
    measuring = True
    cpu0 = sum(proc.cpu_times()[:2])
    t0 = time.monotonic()
    while time.monotonic() - t0 < window:
        await asyncio.sleep(0.5)
        rss.append(proc.memory_info().rss)
    elapsed = time.monotonic() - t0
    cpu = sum(proc.cpu_times()[:2]) - cpu0
    measuring = False
    after = _reads(probe)
    stop.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "interval": interval,
        "polls": polls,
        "connect_s": connect_s,
        "offered_per_s": polls / interval,
        "cpu_share": cpu / elapsed,
        "cpu_ms_per_wake": 1000 * cpu / max(len(wakes), 1),
        "reads_per_s": (after - before) / elapsed,
        "wakes_per_s": len(wakes) / elapsed,
        "wake_p50_ms": pct(wakes, 50),
        "wake_p99_ms": pct(wakes, 99),
        "rss_mb": max(rss) / 2**20,
        "counts": counts,
    }


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
def _nginx(a: int, b: int) -> Iterator[int]:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    port = _free_port()
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


async def _pollers(
    ports: list[int], probe: Probe, jobs: int, clients: int, period: float, window: float
) -> dict[str, Any]:
    stop = asyncio.Event()
    sent = hits = 0

    async def client(i: int) -> None:
        nonlocal sent, hits
        conn = Conn(ports[i % len(ports)])
        try:
            while not stop.is_set():
                _, hdrs, _ = await conn.request("GET", f"/jp/jobs/px-{i % jobs}")
                sent += 1
                hits += hdrs.get("x-cache") == "HIT"
                await asyncio.sleep(period)
        finally:
            conn.close()

    tasks = [asyncio.create_task(client(i)) for i in range(clients)]
    await asyncio.sleep(1.0)
    before, sent0, hits0 = _reads(probe), sent, hits
    t0 = time.monotonic()
    await asyncio.sleep(window)
    elapsed = time.monotonic() - t0
    after = _reads(probe)
    stop.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "requests_per_s": (sent - sent0) / elapsed,
        "hit_ratio": (hits - hits0) / max(sent - sent0, 1),
        "reads_per_s": (after - before) / elapsed,
    }


# -- the run ---------------------------------------------------------------------------------


def run(quick: bool = False) -> dict[str, Any]:
    jobs, window, settle = (5, 2.0, 1.0) if quick else (50, 15.0, 3.0)
    rows = ((200, 1.0),) if quick else ROWS
    with private_redis() as server:
        probe = Probe(server.port)
        try:
            with _app(server.url, 0.5) as (port, _):
                posts = asyncio.run(_start_jobs(port, jobs, 0.5, 0.25))
            lps = []
            for n, (polls, interval) in enumerate(rows):
                # A fresh app process per row: nothing left over from the previous one.
                with (
                    _app(server.url, 0.5) as (port, proc),
                    _workers(server.url, f"lp{n}", jobs, 600, interval),
                ):
                    lps.append(asyncio.run(_long_polls(
                        port, proc, probe, jobs, polls, window, settle, interval, f"lp{n}"
                    )))  # fmt: skip
            proxy = _proxy(server.url, probe, quick)
        finally:
            probe.close()
    return _result(jobs, window, posts, lps, proxy)


def _proxy(redis_url: str, probe: Probe, quick: bool) -> dict[str, Any] | str:
    if shutil.which("nginx") is None and not os.path.exists("/usr/sbin/nginx"):
        print("#   gateway: nginx is not installed: proxy-cache part skipped", flush=True)
        return "nginx is not installed (apt-get install -y nginx): the proxy-cache part is skipped"
    jobs, clients, window = (5, 50, 1.5) if quick else (10, 400, 8.0)
    with (
        _app(redis_url, 1.0) as (a, _),
        _app(redis_url, 1.0) as (b, _),
        _workers(redis_url, "px", jobs, 2 * window + 15, 1.0),
    ):
        direct = asyncio.run(_pollers([a, b], probe, jobs, clients, 0.1, window))
        with _nginx(a, b) as port:
            cached = asyncio.run(_pollers([port], probe, jobs, clients, 0.1, window))
    return {"jobs": jobs, "clients": clients, "direct": direct, "nginx": cached}


def _result(
    jobs: int, window: float, posts: list[float], lps: list[dict[str, Any]],
    proxy: dict[str, Any] | str,
) -> dict[str, Any]:  # fmt: skip
    tables = [
        {
            "title": f"POST→202 over {len(posts)} jobs (handler enters heartbeat(), then "
            "returns accepted())",
            "columns": ["p50 ms", "p99 ms", "max ms"],
            "rows": [[f"{pct(posts, 50):.1f}", f"{pct(posts, 99):.1f}", f"{max(posts):.1f}"]],
        },
        {
            "title": f"Parked long polls on {jobs} jobs, one app process "
            f"({window:g} s window per row, after every client connected)",
            "columns": [
                "parked polls",
                "connect s",
                "jobs beat every",
                "wakes/s offered",
                "wakes/s served",
                "app CPU",
                "app CPU ms / wake",
                "Redis HMGET/s",
                "wake p50 ms",
                "wake p99 ms",
                "app RSS MB",
                "200 / 304 / other",
            ],
            "rows": [
                [
                    f"{lp['polls']:,}",
                    f"{lp['connect_s']:.0f}",
                    f"{lp['interval']:g} s",
                    f"{lp['offered_per_s']:,.0f}",
                    f"{lp['wakes_per_s']:,.0f}",
                    f"{lp['cpu_share']:.0%}",
                    f"{lp['cpu_ms_per_wake']:.2f}",
                    f"{lp['reads_per_s']:,.1f}",
                    f"{lp['wake_p50_ms']:.0f}",
                    f"{lp['wake_p99_ms']:.0f}",
                    f"{lp['rss_mb']:.0f}",
                    " / ".join(str(lp["counts"][k]) for k in ("200", "304", "other")),
                ]
                for lp in lps
            ],
            "note": "A wake is a 200 answering a parked request; its latency runs from the "
            "beat's write (heartbeat_ms, Redis server time) to the client reading the answer, "
            "so it includes the hub's read cadence (wait_interval 0.25 s, through the reader's "
            "0.5 s cache) and the queueing of all wakes on one process. Offered = polls / beat "
            "interval (every beat wakes every poll of its job). App CPU is the app process's "
            "user + system time over the window: the CPU cost per wake does not depend on how "
            "loaded the shared machine is; the latencies do (see the load average above).",
        },
    ]
    if isinstance(proxy, dict):
        paths = (("two apps, direct", proxy["direct"]), ("nginx in front", proxy["nginx"]))
        rows = [
            [
                name,
                f"{r['requests_per_s']:,.0f}",
                f"{r['hit_ratio']:.1%}",
                f"{r['reads_per_s']:.1f}",
            ]
            for name, r in paths
        ]
        tables.append({
            "title": f"Proxy cache: {proxy['clients']} clients polling {proxy['jobs']} jobs every "
            "0.1 s, two app processes (reader cache_ttl 1 s → max-age=1)",
            "columns": ["path", "requests/s", "cache hits", "Redis HMGET/s"],
            "rows": rows,
            "note": "Measured with a real nginx (Debian's package) in front, proxy_cache with "
            "proxy_cache_lock and background updates. Each app process's reader already "
            "collapses its polls to about one read per job per cache_ttl; the proxy collapses "
            "the processes (and takes the requests off the apps).",
        })  # fmt: skip
    result: dict[str, Any] = {
        "name": NAME,
        "title": TITLE,
        "issue": 17,
        "method": " ".join((__doc__ or "").split("\n\n", 1)[1].split()),
        "tables": tables,
        "goals": {"POST→202 p99 < 100 ms": pct(posts, 99) < 100},
        "data": {"posts_ms": posts, "long_poll": lps, "proxy": proxy},
    }
    if isinstance(proxy, str):
        result["skipped"] = proxy
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    elif sys.argv[1:2] == ["work"]:
        work(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6]))
    else:
        import json

        print(json.dumps(run(quick="--quick" in sys.argv), indent=1, default=str)[:4000])
