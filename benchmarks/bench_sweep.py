"""What does recovery cost? Sweep time and Redis commands at n running jobs, and index upkeep
per beat.

1. Sweep cost: the namespace is seeded directly (one pipeline per 5,000 jobs: snapshot Hash,
   liveness key, index entry) with n RUNNING jobs of which 10 are stale, for n = 1,000, 10,000
   and 100,000. One ``Sweeper.sweep()`` is timed (median of ``repeats``, fresh stale jobs each
   time) with the Redis commands and round trips it sent and the server time they took
   (``INFO commandstats``). For contrast, one full ``SCAN`` of the jobs' keys at the same n:
   what a sweeper without an index would pay on every sweep.
2. Index upkeep: ``jobs`` real heartbeats run for ``seconds``; ``INFO commandstats`` counts the
   ``EVALSHA`` (beats) and ``ZADD`` (index refresh) the server received, for ``index_every``
   1 and 10 (the default).

3. Soak (``--soak SECONDS``): 50 live jobs while busy processes burn every core, three
   sweepers sweeping every 50 ms: the number of live jobs claimed must stay 0.

Run: ``python benchmarks/bench_sweep.py [--soak 60]`` (starts a private redis-server; prints
JSON).
``run(redis_url)`` wants a server of its own: commandstats are server-wide.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from typing import Any

import redis.asyncio as aioredis

from jobpulse import StaleJob, Sweeper, heartbeat
from jobpulse._protocol.keys import KeySchema
from jobpulse._provision import RedisServer

SIZES = (1_000, 10_000, 100_000)
STALE = 10
CHUNK = 5_000


async def _commandstats(client: aioredis.Redis) -> dict[str, tuple[int, int]]:
    info = await client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"])) for name, v in info.items()
    }


def _diff(
    after: dict[str, tuple[int, int]], before: dict[str, tuple[int, int]]
) -> dict[str, dict[str, int]]:
    out = {}
    for name, (calls, usec) in after.items():
        c0, u0 = before.get(name, (0, 0))
        if calls - c0:
            out[name] = {"calls": calls - c0, "usec": usec - u0}
    return out


async def _seed(client: aioredis.Redis, ns: str, ids: list[str], *, stale: bool) -> None:
    """Write jobs as live (liveness key, future deadline) or dead workers leave them."""
    schema = KeySchema(ns)
    seconds, _ = await client.time()
    now_ms = seconds * 1000
    for start in range(0, len(ids), CHUNK):
        pipe = client.pipeline(transaction=False)
        scores = {}
        for job_id in ids[start : start + CHUNK]:
            keys = schema.job(job_id)
            pipe.hset(
                keys.state,
                mapping={
                    "status": "RUNNING",
                    "stage": "work",
                    "done": 1,
                    "seq": 2,
                    "fence": 1,
                    "attempt": 1,
                    "worker": "bench",
                    "heartbeat_ms": now_ms,
                    "checkpoint": '{"offset":1}',
                },
            )
            pipe.set(keys.fence, 1)
            if stale:
                scores[job_id] = now_ms - 60_000
            else:
                pipe.set(keys.alive, 1, px=3_600_000)
                scores[job_id] = now_ms + 3_600_000
        pipe.zadd(schema.index(0), scores)
        await pipe.execute()


async def sweep_cost(client: aioredis.Redis, n: int, repeats: int) -> dict[str, Any]:
    ns = f"bench{n}"
    await _seed(client, ns, [f"run-{i}" for i in range(n - STALE)], stale=False)
    sweeper = Sweeper(client, namespace=ns)
    await sweeper.sweep()  # warm-up: scripts loaded, connection open
    times, idle_times, server_usec, commands, round_trips = [], [], [], [], []
    for r in range(repeats):
        await _seed(client, ns, [f"stale-{r}-{i}" for i in range(STALE)], stale=True)
        before_stats, before = sweeper.statistics(), await _commandstats(client)
        t0 = time.perf_counter()
        claimed = await sweeper.sweep()
        times.append(time.perf_counter() - t0)
        assert len(claimed) == STALE, len(claimed)
        diff = _diff(await _commandstats(client), before)
        diff.pop("info", None)
        server_usec.append(sum(v["usec"] for v in diff.values()))
        after_stats = sweeper.statistics()
        commands.append(after_stats.commands - before_stats.commands)
        round_trips.append(after_stats.round_trips - before_stats.round_trips)
        t0 = time.perf_counter()
        assert await sweeper.sweep() == []
        idle_times.append(time.perf_counter() - t0)
    zrange = diff.get("zrange", diff.get("zrangebyscore", {"calls": 1, "usec": 0}))
    t0 = time.perf_counter()
    scanned = 0
    async for _ in client.scan_iter(match=f"{ns}:*:alive", count=1000):
        scanned += 1
    scan_s = time.perf_counter() - t0
    await client.flushdb()
    return {
        "running_jobs": n,
        "stale": STALE,
        "sweep_ms_median": round(statistics.median(times) * 1000, 3),
        "idle_sweep_ms_median": round(statistics.median(idle_times) * 1000, 3),
        "server_usec_median": statistics.median(server_usec),
        "zrangebyscore_usec": round(zrange["usec"] / zrange["calls"], 1),
        "commands_per_sweep": statistics.median(commands),
        "round_trips_per_sweep": statistics.median(round_trips),
        "scan_baseline_ms": round(scan_s * 1000, 1),
        "scan_found": scanned,
    }


async def index_upkeep(
    client: aioredis.Redis, url: str, jobs: int, seconds: float, index_every: int
) -> dict[str, Any]:
    ns = f"upkeep{index_every}"
    worker = aioredis.Redis.from_url(url)
    stop = asyncio.Event()
    entered = 0
    all_in = asyncio.Event()
    gate = asyncio.Semaphore(50)  # the client's pool is bounded: enter 50 at a time

    async def one(i: int) -> None:
        nonlocal entered
        opts = {"namespace": ns, "interval": 0.1, "ttl": 1.0, "index_every": index_every}
        await gate.acquire()
        try:
            async with heartbeat(worker, f"job-{i}", **opts):
                gate.release()
                entered += 1
                if entered == jobs:
                    all_in.set()
                await stop.wait()
                await gate.acquire()  # and leave 50 at a time
        finally:
            gate.release()

    try:
        async with asyncio.TaskGroup() as tg:
            for i in range(jobs):
                tg.create_task(one(i))
            await all_in.wait()
            before = await _commandstats(client)
            await asyncio.sleep(seconds)
            diff = _diff(await _commandstats(client), before)
            stop.set()
    finally:
        await worker.aclose()
    await client.flushdb()
    beats = diff.get("evalsha", {}).get("calls", 0)
    zadds = diff.get("zadd", {}).get("calls", 0)
    return {
        "jobs": jobs,
        "interval": 0.1,
        "index_every": index_every,
        "seconds": seconds,
        "beats": beats,
        "zadd": zadds,
        "zadd_per_beat": round(zadds / beats, 4) if beats else None,
        "commands_per_beat": round((beats + zadds) / beats, 4) if beats else None,
        "beat_usec": round(diff["evalsha"]["usec"] / beats, 2) if beats else None,
        "zadd_usec": round(diff["zadd"]["usec"] / zadds, 2) if zadds else None,
        "index_usec_per_beat": round(diff["zadd"]["usec"] / beats, 2) if zadds else None,
    }


async def soak(client: aioredis.Redis, url: str, seconds: float, jobs: int = 50) -> dict[str, Any]:
    """Live jobs while every core is burnt by busy processes, swept every 50 ms by 3 sweepers:
    how many live jobs were claimed (must be 0) over ``seconds``."""
    ns = "soak"
    burners = [
        await asyncio.create_subprocess_exec(sys.executable, "-c", "while True: pass")
        for _ in range(os.cpu_count() or 2)
    ]
    claimed: list[str] = []
    worker = aioredis.Redis.from_url(url)
    sweepers = [Sweeper(client, namespace=ns) for _ in range(3)]
    stop = asyncio.Event()
    lost: list[str] = []

    async def one(i: int) -> None:
        try:
            opts = {"namespace": ns, "interval": 0.2, "ttl": 2.0, "index_every": 1}
            async with heartbeat(worker, f"job-{i}", **opts) as hb:
                while not stop.is_set():
                    hb.progress.advance()
                    await asyncio.sleep(0.01)
        except Exception as exc:
            lost.append(repr(exc))

    def on_stale(job: StaleJob) -> None:
        claimed.append(job.job_id)

    try:
        async with (
            sweepers[0].run(period=0.05, on_stale=on_stale),
            sweepers[1].run(period=0.05, on_stale=on_stale),
            sweepers[2].run(period=0.05, on_stale=on_stale),
            asyncio.TaskGroup() as tg,
        ):
            for i in range(jobs):
                tg.create_task(one(i))
            await asyncio.sleep(seconds)
            stop.set()
    finally:
        for proc in burners:
            proc.kill()
            await proc.wait()
        await worker.aclose()
    await client.flushdb()
    return {
        "jobs": jobs,
        "seconds": seconds,
        "burners": len(burners),
        "sweeps": sum(s.statistics().sweeps for s in sweepers),
        "claimed": len(claimed),
        "worker_errors": lost,
    }


async def _run(
    redis_url: str,
    repeats: int,
    upkeep_seconds: float,
    soak_seconds: float,
    sizes: tuple[int, ...] = SIZES,
) -> dict[str, Any]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.flushdb()
        out: dict[str, Any] = {"benchmark": "sweep"}
        out["sweep"] = [await sweep_cost(client, n, repeats) for n in sizes]
        out["index_upkeep"] = [
            await index_upkeep(client, redis_url, 500, upkeep_seconds, every) for every in (1, 10)
        ]
        if soak_seconds > 0:
            out["soak"] = await soak(client, redis_url, soak_seconds)
    finally:
        await client.aclose()
    return out


def run(
    redis_url: str,
    *,
    repeats: int = 20,
    upkeep_seconds: float = 5.0,
    soak_seconds: float = 0.0,
    quick: bool = False,
) -> dict[str, Any]:
    """Run the measurements against ``redis_url`` (a server of its own: it is flushed and its
    commandstats are read) and return the results as a dict. ``soak_seconds`` > 0 adds the
    CPU-saturated soak; ``quick`` (the CI smoke run) stops at 10,000 jobs with short windows."""
    if quick:
        return asyncio.run(_run(redis_url, 5, 1.0, 0.0, SIZES[:2]))
    return asyncio.run(_run(redis_url, repeats, upkeep_seconds, soak_seconds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--upkeep-seconds", type=float, default=5.0)
    parser.add_argument("--soak", type=float, default=0.0, help="seconds of CPU-saturated soak")
    opts = parser.parse_args()
    with RedisServer() as server:
        result = run(
            server.url,
            repeats=opts.repeats,
            upkeep_seconds=opts.upkeep_seconds,
            soak_seconds=opts.soak,
        )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
