"""The gateway: POST→202 latency, thousands of parked long polls on one app process, and what
a caching proxy (nginx) in front saves.

Three parts, against a private ``redis-server`` and app processes of their own (uvicorn,
``gateway_procs.serve``: a ``POST /start`` answered with ``accepted()`` and the jobpulse app
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
import os
import shutil
import sys
import time
from typing import Any

import orjson
import psutil

from .common import Probe, pct, private_redis
from .gateway_procs import Conn, app_process, nginx, workers

NAME = "gateway"
TITLE = "Gateway: POST→202, long polls, proxy cache"
ROWS = ((500, 2.0), (5000, 20.0))
"""The long-poll part of a full run: (parked polls, beat interval of the jobs). Every beat
wakes every poll of its job, so both rows offer 250 wakes/s: they differ in what is parked."""


def _reads(probe: Probe) -> int:
    """Status reads so far: HMGET calls, less the one each beat script makes (``INFO
    commandstats`` counts a script's own commands)."""
    cmds = probe.snapshot()["cmds"]
    scripts = cmds.get("evalsha", (0, 0))[0] + cmds.get("eval", (0, 0))[0]
    return int(cmds.get("hmget", (0, 0))[0] - scripts)


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
            with app_process(server.url, 0.5) as (port, _):
                posts = asyncio.run(_start_jobs(port, jobs, 0.5, 0.25))
            lps = []
            for n, (polls, interval) in enumerate(rows):
                # A fresh app process per row: nothing left over from the previous one.
                with (
                    app_process(server.url, 0.5) as (port, proc),
                    workers(server.url, f"lp{n}", jobs, 600, interval),
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
        app_process(redis_url, 1.0) as (a, _),
        app_process(redis_url, 1.0) as (b, _),
        workers(redis_url, "px", jobs, 2 * window + 15, 1.0),
    ):
        direct = asyncio.run(_pollers([a, b], probe, jobs, clients, 0.1, window))
        with nginx(a, b) as port:
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
    import json

    print(json.dumps(run(quick="--quick" in sys.argv), indent=1, default=str)[:4000])
