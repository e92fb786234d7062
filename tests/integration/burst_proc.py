"""A worker process that starts a burst of jobs at once on one asyncio client (defaults):
``python -m tests.integration.burst_proc URL NS COUNT HOLD``.

``COUNT`` tasks each run ``async with jobpulse.heartbeat(client, "burst-<i>", namespace=NS)``,
all created in one step; each body waits until every job of the burst has entered (or failed
to), then holds
``HOLD`` seconds more (past ``ttl``, so every lease must have been renewed) and ends. Prints
``outcomes {...}`` (JSON: what leaving each ``async with`` raised, ``ok`` for nothing, else
the type and the lease-loss cause, with counts), ``stats {...}`` (the process's worker stats)
and ``phases {...}`` (seconds until every job had entered and until every job had ended).
"""

from __future__ import annotations

import asyncio
import collections
import json
import sys
import time

import redis.asyncio as aioredis

import jobpulse
from jobpulse import LeaseLost
from jobpulse._worker.stats import WORKER_STATS


class Burst:
    def __init__(self, count: int, hold: float) -> None:
        self.count, self.hold = count, hold
        self.entered = 0
        self.all_in = asyncio.Event()
        self.started = time.monotonic()
        self.all_in_after = 0.0

    def arrived(self) -> None:
        """One more job entered, or failed to: the last one lets every body go on."""
        self.entered += 1
        if self.entered == self.count:
            self.all_in_after = time.monotonic() - self.started
            self.all_in.set()

    async def job(self, client: aioredis.Redis, ns: str, i: int) -> str:
        inside = False
        try:
            async with jobpulse.heartbeat(client, f"burst-{i}", namespace=ns):
                inside = True
                self.arrived()
                await self.all_in.wait()
                await asyncio.sleep(self.hold)
        except LeaseLost as exc:
            return f"LeaseLost {exc.cause.name}"
        except Exception as exc:  # reported, not raised: the test names what happened
            return type(exc).__name__
        finally:
            if not inside:
                self.arrived()
        return "ok"

    async def report(self) -> None:
        """Every 5 s on stderr: how far the burst is (read when a test fails)."""
        while True:
            await asyncio.sleep(5)
            at = time.monotonic() - self.started
            print(
                f"{at:.0f}s entered={self.entered} beats={WORKER_STATS.beats} "
                f"late={WORKER_STATS.beats_late} lag={WORKER_STATS.loop_lag:.2f} "
                f"lost={WORKER_STATS.lease_losses}",
                file=sys.stderr,
                flush=True,
            )


async def main(url: str, ns: str, count: int, hold: float) -> None:
    client = aioredis.Redis.from_url(url)
    burst = Burst(count, hold)
    tasks = [asyncio.ensure_future(burst.job(client, ns, i)) for i in range(count)]
    report = asyncio.ensure_future(burst.report())
    results = await asyncio.gather(*tasks)
    report.cancel()
    ended = time.monotonic() - burst.started
    print("outcomes", json.dumps(collections.Counter(results)), flush=True)
    stats = {
        "beats": WORKER_STATS.beats,
        "beats_late": WORKER_STATS.beats_late,
        "beat_failures": WORKER_STATS.beat_failures,
        "lease_losses": WORKER_STATS.lease_losses,
        "loop_lag_last": WORKER_STATS.loop_lag,
    }
    print("stats", json.dumps(stats), flush=True)
    print("phases", json.dumps({"all_in": burst.all_in_after, "all_ended": ended}), flush=True)
    await client.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
