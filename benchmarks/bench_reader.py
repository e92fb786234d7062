"""What does reading status cost? ``StatusReader`` against a raw redis-py client, same run.

1. ``get()`` latency: p50/p99 of one ``get()`` with the cache off (``cache_ttl=0``: every call is
   the full read, HMGET + PTTL + TIME in one write, and the decode into ``JobStatus``), next to
   a raw ``HMGET`` of the same fields and a raw ``HMGET`` + ``PTTL`` pipeline (what a
   hand-written reader needs for the STALE verdict), interleaved call by call on one client
   (20,000 rounds, the order rotating every round); and a cached ``get()`` (default
   ``cache_ttl=0.5``). Goal: the uncached get's p99 within 10 % of raw HMGET's; the p50 ratio
   is reported beside it (steadier on a shared machine).
2. Polling load: 10,000 concurrent pollers on 100 jobs through one reader (``cache_ttl=0.5``),
   each calling ``get()`` every 50 ms for ``seconds``; Redis reads per second are counted by the
   server (``INFO commandstats``, ``cmdstat_hmget``; no workers run, so every HMGET is the
   reader's). Goal: at most 100 jobs / cache_ttl = 200 reads/s.
3. Watch latency: 1,000 watchers (10 on each of 100 jobs, and all 1,000 on one job) follow
   their streams through one reader; a writer on another client XADDs entries whose details
   carry ``perf_counter()``; each watcher records receive time minus that. Goal: p99 < 20 ms.
   All 1,000 on one job take 300 entries (300,000 deliveries): one entry's fan-out is 1,000
   deliveries, so the p99 of fewer entries is the single worst stall of the machine. Before and
   after, the same fan-out without Redis (``bench_fanout_floor``: 1,000 tasks each woken by a
   future of its own) measures what the loaded machine lets one event loop do.

Each scenario starts with ``gc.collect()``: the garbage of the one before (10,000 poller tasks)
is not the next one's cost; the collections a scenario's own allocations trigger stay in.

Run: ``python -m benchmarks.bench_reader [REDIS_URL]`` (without a URL it starts a private
redis-server; prints JSON). ``run(redis_url)`` wants a server of its own: commandstats are
server-wide and ``CONFIG RESETSTAT`` is sent.
"""

from __future__ import annotations

import asyncio
import gc
import os
import platform
import statistics
import time
from collections.abc import Awaitable
from typing import Any

import orjson
import redis.asyncio as aioredis

from jobpulse import StatusReader
from jobpulse._protocol.keys import KeySchema
from jobpulse._reader.status import ALL_FIELDS

from .common import pct, standalone_main

NS = "bench"


def summary_us(samples: list[float]) -> dict[str, float]:
    return {
        "p50_us": round(pct(samples, 50) * 1e6, 1),
        "p99_us": round(pct(samples, 99) * 1e6, 1),
        "mean_us": round(statistics.fmean(samples) * 1e6, 1),
    }


async def seed(client: aioredis.Redis, jobs: list[str]) -> None:
    """Realistic RUNNING snapshots, written directly (no worker traffic during measurements)."""
    schema = KeySchema(NS)
    now = int(time.time() * 1000)
    async with client.pipeline(transaction=False) as pipe:
        for job in jobs:
            keys = schema.job(job)
            pipe.hset(
                keys.state,
                mapping={
                    "status": "RUNNING", "stage": "transform", "done": 41_234, "total": 100_000,
                    "rate": "812.5", "eta_s": "72.3", "rss_bytes": 183_500_800, "cpu_s": "93.12",
                    "loop_lag_ms": "0.4", "seq": 120, "fence": 3, "attempt": 1,
                    "worker": "host-a:4242", "started_ms": now - 120_000, "heartbeat_ms": now,
                    "progress_ms": now, "finished_ms": "", "error": "",
                    "meta": '{"tenant":"acme","kind":"report"}',
                },
            )  # fmt: skip
            pipe.set(keys.alive, 1, px=3_600_000)
        await pipe.execute()


async def bench_get(client: aioredis.Redis, n: int) -> dict[str, Any]:
    await seed(client, ["lat"])
    keys = KeySchema(NS).job("lat")
    uncached = StatusReader(client, namespace=NS, cache_ttl=0)
    cached = StatusReader(client, namespace=NS)
    fields = list(ALL_FIELDS)

    async def raw_hmget() -> None:
        await client.hmget(keys.state, fields)

    async def raw_pipeline() -> None:
        async with client.pipeline(transaction=False) as pipe:
            pipe.hmget(keys.state, fields)
            pipe.pttl(keys.alive)
            await pipe.execute()

    async def get_uncached() -> None:
        await uncached.get("lat")

    async def get_cached() -> None:
        await cached.get("lat")

    contenders = {
        "raw_hmget": raw_hmget,
        "raw_hmget_pttl_pipeline": raw_pipeline,
        "get_uncached": get_uncached,
        "get_cached": get_cached,
    }
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(200):  # warm-up: connections, scripts, caches
        for fn in contenders.values():
            await fn()
    # Interleaved call by call, the order rotating every round, so that every contender meets
    # the shared machine's noise (other processes, GC, the event loop's own work) alike.
    order = list(contenders.items())
    for i in range(n):
        k = i % len(order)
        for name, fn in order[k:] + order[:k]:
            t0 = time.perf_counter()
            await fn()
            samples[name].append(time.perf_counter() - t0)
    out: dict[str, Any] = {name: summary_us(s) for name, s in samples.items()}
    base = pct(samples["raw_hmget"], 50)
    out["get_uncached_p50_vs_raw_hmget"] = round(pct(samples["get_uncached"], 50) / base, 3)
    out["get_uncached_p99_vs_raw_hmget"] = round(
        pct(samples["get_uncached"], 99) / pct(samples["raw_hmget"], 99), 3
    )
    out["get_uncached_p50_vs_raw_pipeline"] = round(
        pct(samples["get_uncached"], 50) / pct(samples["raw_hmget_pttl_pipeline"], 50), 3
    )
    out["iterations"] = n
    return out


async def bench_pollers(
    client: aioredis.Redis, pollers: int, jobs: int, seconds: float, every: float
) -> dict[str, Any]:
    names = [f"poll-{i}" for i in range(jobs)]
    await seed(client, names)
    reader = StatusReader(client, namespace=NS, cache_ttl=0.5)
    stop = asyncio.Event()
    served = 0

    async def poll(job: str) -> None:
        nonlocal served
        while not stop.is_set():
            await reader.get(job)
            served += 1
            await asyncio.sleep(every)

    tasks = [asyncio.create_task(poll(names[i % jobs])) for i in range(pollers)]
    await asyncio.sleep(1.0)  # everyone running
    await client.config_resetstat()
    served_before = served
    t0 = time.perf_counter()
    await asyncio.sleep(seconds)
    stats = await client.info("commandstats")
    elapsed = time.perf_counter() - t0
    gets = served - served_before
    stop.set()
    await asyncio.gather(*tasks)
    hmget = int(stats.get("cmdstat_hmget", {}).get("calls", 0))
    return {
        "pollers": pollers,
        "jobs": jobs,
        "poll_every_s": every,
        "cache_ttl_s": 0.5,
        "seconds": round(elapsed, 2),
        "get_calls_per_s": round(gets / elapsed),
        "redis_reads_per_s": round(hmget / elapsed, 1),
        "goal_reads_per_s": jobs / 0.5,
    }


async def bench_watch(
    redis_url: str, client: aioredis.Redis, watchers: int, jobs: int, entries: int
) -> dict[str, Any]:
    names = [f"w{jobs}-{i}" for i in range(jobs)]
    schema = KeySchema(NS)
    writer = aioredis.Redis.from_url(redis_url)
    latencies: list[float] = []
    async with StatusReader(client, namespace=NS, watch_queue=10_000) as reader:

        async def follow(job: str) -> None:
            async for event in reader.watch(job):
                if event.details and "sent" in event.details:
                    latencies.append(time.perf_counter() - event.details["sent"])

        tasks = [asyncio.create_task(follow(names[i % jobs])) for i in range(watchers)]
        while reader.statistics().watch.watchers < watchers:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        for i in range(entries):
            job = names[i % jobs]
            details = orjson.dumps({"sent": time.perf_counter()}).decode()
            await writer.xadd(schema.events(job), {"kind": "beat", "seq": i, "details": details})
            await asyncio.sleep(0.01)
        for job in names:
            await writer.xadd(schema.events(job), {"kind": "end", "status": "COMPLETED"})
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        xreads = reader.statistics().watch.xreads
    await writer.aclose()
    return {
        "watchers": watchers,
        "jobs": jobs,
        "entries": entries,
        "deliveries": len(latencies),
        "xread_calls": xreads,
        "p50_ms": round(pct(latencies, 50) * 1000, 2),
        "p99_ms": round(pct(latencies, 99) * 1000, 2),
        "max_ms": round(max(latencies) * 1000, 2),
    }


async def bench_fanout_floor(watchers: int, entries: int) -> dict[str, Any]:
    """The floor of any fan-out in one event loop, measured beside the watch scenario: one
    producer hands ``entries`` timestamps, 10 ms apart, to ``watchers`` tasks, each waiting on
    a future of its own (the least one event loop can do: no Redis, no decoding, no queue). Its
    p99 is what the loaded machine lets a single event loop do at that moment; read the watch
    figures against it."""
    loop = asyncio.get_running_loop()
    waiting: list[asyncio.Future[float | None] | None] = [None] * watchers
    latencies: list[float] = []

    async def consume(i: int) -> None:
        while True:
            waiting[i] = future = loop.create_future()
            sent = await future
            if sent is None:
                return
            latencies.append(time.perf_counter() - sent)

    tasks = [asyncio.create_task(consume(i)) for i in range(watchers)]
    await asyncio.sleep(0.2)
    for stamp in [*range(entries), None]:
        sent = None if stamp is None else time.perf_counter()
        for future in waiting:
            if future is not None and not future.done():
                future.set_result(sent)
        await asyncio.sleep(0.01)
    await asyncio.gather(*tasks)
    return {
        "watchers": watchers,
        "entries": entries,
        "deliveries": len(latencies),
        "p50_ms": round(pct(latencies, 50) * 1000, 2),
        "p99_ms": round(pct(latencies, 99) * 1000, 2),
        "max_ms": round(max(latencies) * 1000, 2),
    }


async def _collected(step: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    gc.collect()
    return await step


async def _run(redis_url: str, quick: bool) -> dict[str, Any]:
    client = aioredis.Redis.from_url(redis_url, max_connections=200)
    try:
        await client.flushall()
        # Each scenario starts from a collected heap (the previous one's garbage is not its
        # cost; the collections its own allocations trigger stay in its figures).
        fresh = _collected
        watchers, events = (100, 30) if quick else (1000, 300)
        pollers = 2_000 if quick else 10_000
        return {
            "machine": {
                "python": platform.python_version(),
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                "redis": (await client.info("server"))["redis_version"],
            },
            "get_latency": await fresh(bench_get(client, 1000 if quick else 20_000)),
            "pollers": await fresh(
                bench_pollers(client, pollers, 100, 1.5 if quick else 10.0, 0.05)
            ),
            # (--quick, CI's smoke run: a tenth of the watchers and events)
            "fanout_floor_before": await fresh(bench_fanout_floor(watchers, events)),
            "watch_1000_on_100_jobs": await fresh(
                bench_watch(redis_url, client, watchers, 100, events)
            ),
            "watch_1000_on_1_job": await fresh(bench_watch(redis_url, client, watchers, 1, events)),
            "fanout_floor_after": await fresh(bench_fanout_floor(watchers, events)),
        }
    finally:
        await client.aclose()


def run(redis_url: str, quick: bool = False) -> dict[str, Any]:
    """Run the reader benchmarks against ``redis_url`` (a server of the benchmark's own)."""
    return asyncio.run(_run(redis_url, quick))


def main() -> None:
    standalone_main(run)


if __name__ == "__main__":
    main()
