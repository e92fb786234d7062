"""Beats per second on a 3-master Redis Cluster against one Redis, in the same run.

One process runs N jobs under ``heartbeat()`` with a short interval (so the ticker, not the
interval, limits the rate) first against a single private redis-server, then against a private
3-master cluster (no replicas: the same number of server processes doing the work that matters),
and counts beats written per second and the client's CPU seconds per 1,000 beats.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from jobpulse import JobHeartbeat, heartbeat
from jobpulse._provision import LocalCluster, RedisServer

NAME = "cluster"
TITLE = "Redis Cluster: beats/s on three masters against one"


async def _window(
    client: Any, n: int, interval: float, warmup: float, seconds: float
) -> dict[str, float]:
    release = asyncio.Event()
    beats: list[JobHeartbeat] = []
    entered = asyncio.Semaphore(50)  # enter 50 at a time, as a draining/starting worker would

    async def job(i: int) -> None:
        async with entered:
            hb = heartbeat(
                client, f"c{i}", namespace="bench", interval=interval, ttl=max(2.0, 20 * interval)
            )
            await hb.__aenter__()
        beats.append(hb)
        try:
            await release.wait()
        finally:
            async with entered:
                await hb.__aexit__(None, None, None)

    tasks = [asyncio.create_task(job(i)) for i in range(n)]
    while len(beats) < n:
        await asyncio.sleep(0.05)
    await asyncio.sleep(warmup)
    w0 = sum(b.statistics().beats_written for b in beats)
    c0, t0 = time.process_time(), time.perf_counter()
    await asyncio.sleep(seconds)
    w1 = sum(b.statistics().beats_written for b in beats)
    c1, t1 = time.process_time(), time.perf_counter()
    release.set()
    await asyncio.gather(*tasks)
    rate = (w1 - w0) / (t1 - t0)
    return {"beats_per_s": rate, "cpu_s_per_1000_beats": (c1 - c0) / max(w1 - w0, 1) * 1000}


async def _single(url: str, **kw: float) -> dict[str, float]:
    client = aioredis.Redis.from_url(url)
    try:
        return await _window(client, **kw)  # type: ignore[arg-type]
    finally:
        await client.aclose()


async def _cluster(url: str, **kw: float) -> dict[str, float]:
    client = RedisCluster.from_url(url)
    await client.initialize()
    try:
        return await _window(client, **kw)  # type: ignore[arg-type]
    finally:
        await client.aclose()


def run(quick: bool = False) -> dict[str, Any]:
    n = 500 if quick else 2000
    kw = {"n": n, "interval": 0.02, "warmup": 1.0, "seconds": 2.0 if quick else 5.0}
    with RedisServer() as server:
        single = asyncio.run(_single(server.url, **kw))
    with LocalCluster(masters=3, replicas=0) as cluster:
        clustered = asyncio.run(_cluster(cluster.url, **kw))
    ratio = clustered["beats_per_s"] / single["beats_per_s"]
    rows = [
        ["beats/s (one client process)", f"{single['beats_per_s']:,.0f}",
         f"{clustered['beats_per_s']:,.0f}", f"{ratio:.2f}"],
        ["client CPU s per 1,000 beats", f"{single['cpu_s_per_1000_beats']:.3f}",
         f"{clustered['cpu_s_per_1000_beats']:.3f}",
         f"{clustered['cpu_s_per_1000_beats'] / single['cpu_s_per_1000_beats']:.2f}"],
    ]  # fmt: skip
    return {
        "name": NAME,
        "title": TITLE,
        "issue": "7",
        "method": (
            f"{n} jobs beat every {kw['interval']} s from one process (saturating its ticker) for "
            f"{kw['seconds']:.0f} s after a {kw['warmup']:.0f} s warm-up, first on one private "
            "redis-server, then on a private 3-master cluster (no replicas) on the same machine; "
            "beats written per second and the client process's CPU seconds per 1,000 beats."
        ),
        "tables": [
            {
                "title": "One Redis vs a 3-master cluster (baseline: one Redis, same run)",
                "columns": ["figure", "one Redis", "3-master cluster", "ratio"],
                "rows": rows,
                "note": (
                    "On this 2-core machine the client process and the servers share the cores, "
                    "so the cluster cannot show its server-side headroom; what it shows is the "
                    "client cost of a cluster pipeline (split per node, one round trip per node "
                    "per chunk)."
                ),
            }
        ],
        "data": {"single": single, "cluster": clustered, **kw},
    }


def main() -> None:
    print(json.dumps(run(quick=True), indent=1))


if __name__ == "__main__":
    main()
