"""What does a Prometheus scrape cost? ``GET /metrics``'s census at n running jobs.

The namespace is seeded with the real ``acquire.lua`` (pipelined, 5,000 jobs per pipeline) and
the index writes a worker makes at acquire (running-jobs index, per-kind index, kinds): n
running jobs spread over 5 kinds, of which 10 are stale (their liveness key expired, their
index deadline passed), for n = 1,000 and 100,000. One scrape = ``take_census()`` (default
caps: 50 kinds, 500 stale candidates, 20 sampled jobs per kind) plus rendering the Prometheus
text with ``prometheus_client``; timed as the median of ``repeats``, with the Redis commands
and the server time they took (``INFO commandstats``, the ``INFO`` itself left out).

Run: ``python -m benchmarks --only metrics`` (a private redis-server; prints nothing else).
"""

from __future__ import annotations

import asyncio
import secrets
import statistics
import time
import zlib
from typing import Any

import redis.asyncio as aioredis

from jobpulse._protocol.keys import KeySchema
from jobpulse._protocol.scripts import SCRIPTS
from jobpulse.metrics import take_census
from jobpulse.metrics.prometheus import render

TITLE = "Prometheus scrape cost"
SIZES = (1_000, 100_000)
KINDS = ("report", "etl", "video", "email", "inference")
STALE = 10
CHUNK = 5_000


async def seed(
    client: aioredis.Redis, ns: str, ids: list[str], *, ttl_ms: int, horizon_ms: int
) -> None:
    """Start ``ids`` as a worker does at acquire: acquire.lua, then the three index writes."""
    schema = KeySchema(ns)
    await client.script_load(SCRIPTS.acquire.text)
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start : start + CHUNK]
        kinds = [KINDS[zlib.crc32(job.encode()) % len(KINDS)] for job in chunk]
        pipe = client.pipeline(transaction=False)
        for job, kind in zip(chunk, kinds, strict=True):
            args = [secrets.token_hex(8), ttl_ms, 100, "bench:1", 100, "", "", kind]
            pipe.execute_command("EVALSHA", SCRIPTS.acquire.sha, 4, *schema.job(job).all(), *args)
        replies = await pipe.execute()
        pipe = client.pipeline(transaction=False)
        for job, kind, reply in zip(chunk, kinds, replies, strict=True):
            now = int(reply[5])
            pipe.zadd(schema.index_for(job), {job: now + horizon_ms})
            pipe.zadd(schema.kind_index(kind), {job: now})
            pipe.zadd(schema.kinds(), {kind: now + horizon_ms})
        await pipe.execute()


async def _commandstats(client: aioredis.Redis) -> dict[str, tuple[int, int]]:
    info = await client.info("commandstats")
    return {k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"])) for k, v in info.items()}


async def scrape_cost(client: aioredis.Redis, n: int, repeats: int) -> dict[str, Any]:
    ns = f"metrics{n}"
    await seed(client, ns, [f"run-{i}" for i in range(n - STALE)], ttl_ms=3_600_000,
               horizon_ms=3_600_000)  # fmt: skip
    await seed(client, ns, [f"dead-{i}" for i in range(STALE)], ttl_ms=1, horizon_ms=0)
    await asyncio.sleep(0.05)  # the dead jobs' liveness keys expire
    census = await take_census(client, namespace=ns)  # warm-up
    times, server_usec, commands = [], [], []
    for _ in range(repeats):
        before = await _commandstats(client)
        t0 = time.perf_counter()
        census = await take_census(client, namespace=ns)
        render(census, None)
        times.append(time.perf_counter() - t0)
        after = await _commandstats(client)
        diff = {k: (c - before.get(k, (0, 0))[0], u - before.get(k, (0, 0))[1])
                for k, (c, u) in after.items() if k != "info"}  # fmt: skip
        server_usec.append(sum(u for _, u in diff.values()))
        commands.append(sum(c for c, _ in diff.values()))
    running = sum(k.running for k in census.kinds)
    stale = sum(k.stale for k in census.kinds)
    assert (running, stale) == (n - STALE, STALE), (running, stale)
    return {
        "running_jobs": n,
        "kinds": len(census.kinds),
        "scrape_ms_median": round(statistics.median(times) * 1000, 2),
        "server_usec_median": statistics.median(server_usec),
        "commands": statistics.median(commands),
        "census_commands": census.commands,
        "round_trips": census.round_trips,
    }


async def _run(redis_url: str, repeats: int, sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        return [await scrape_cost(client, n, repeats) for n in sizes]
    finally:
        await client.aclose()


def run(redis_url: str, *, quick: bool = False) -> dict[str, Any]:
    """Measure a scrape at 1,000 and 100,000 running jobs (``quick``, the CI smoke run: 1,000
    only, 5 repeats; else 20)."""
    rows = asyncio.run(_run(redis_url, 5 if quick else 20, SIZES[:1] if quick else SIZES))
    columns = ["running jobs", "kinds", "scrape (census + render)", "Redis server time",
               "commands / scrape", "round trips"]  # fmt: skip
    return {
        "title": TITLE,
        "method": " ".join((__doc__ or "").split("\n\n")[1].split()),
        "tables": [
            {
                "title": "One scrape of `GET /metrics`'s census (median)",
                "columns": columns,
                "rows": [_row(r) for r in rows],
            }
        ],
        "data": rows,
        "issue": 16,
    }


def _row(r: dict[str, Any]) -> list[Any]:
    return [
        f"{r['running_jobs']:,}",
        r["kinds"],
        f"{r['scrape_ms_median']} ms",
        f"{r['server_usec_median']} µs",
        r["commands"],
        r["round_trips"],
    ]
