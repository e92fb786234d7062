"""Stale detection latency after SIGKILL (issue 9 item 6, first half).

Worker processes each run one job under ``heartbeat(ttl=TTL)``; once a job's first beats are
in, its process is SIGKILLed at a random point of the beat cycle and a reader polls the job's
``alive`` key (``PTTL``, every 5 ms) until it is gone, which is when every reader sees STALE.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from typing import Any

import redis

from .common import pct, private_redis

NAME = "stale"
TITLE = "Stale detection latency after SIGKILL"
NS = "stale"
TTL = 2.0
INTERVAL = 0.5
WORKER = """
import asyncio, sys
import redis.asyncio as aioredis
from jobpulse import heartbeat

async def main(url, job, ttl, interval):
    client = aioredis.Redis.from_url(url)
    async with heartbeat(client, job, namespace="stale", ttl=ttl, interval=interval) as hb:
        print("ready", flush=True)
        while True:
            hb.progress.advance()
            await asyncio.sleep(0.05)

asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])))
"""


def _one_round(url: str, batch: int, round_no: int) -> list[float]:
    client = redis.Redis.from_url(url)
    procs = []
    for i in range(batch):
        job = f"kill-{round_no}-{i}"
        p = subprocess.Popen([sys.executable, "-c", WORKER, url, job, str(TTL), str(INTERVAL)],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True)  # fmt: skip
        procs.append((job, p))
    for _, p in procs:
        assert p.stdout is not None
        p.stdout.readline()  # "ready": the lease is held
    time.sleep(2 * INTERVAL)  # a few beats in
    # Kill each at its own random point of the beat cycle; poll every killed job's alive key
    # (one pipelined PTTL each 5 ms) until it is gone.
    now = time.monotonic()
    plan = sorted((now + i * 0.1 + random.uniform(0, INTERVAL), job, p)
                  for i, (job, p) in enumerate(procs))  # fmt: skip
    killed: dict[str, float] = {}
    latencies = []
    deadline = now + 10 * TTL
    while (plan or killed) and time.monotonic() < deadline:
        t = time.monotonic()
        while plan and plan[0][0] <= t:
            _, job, p = plan.pop(0)
            os.kill(p.pid, signal.SIGKILL)
            killed[job] = time.monotonic()
        if killed:
            pipe = client.pipeline(transaction=False)
            jobs = list(killed)
            for job in jobs:
                pipe.pttl(f"{NS}:{{{job}}}:alive")
            seen = time.monotonic()
            for job, left in zip(jobs, pipe.execute(), strict=True):
                if left == -2:
                    latencies.append(seen - killed.pop(job))
        time.sleep(0.005)
    for _, p in procs:
        p.wait()
    client.close()
    return latencies


def run(quick: bool = False) -> dict[str, Any]:
    kills = 10 if quick else 50
    batch = 10
    latencies: list[float] = []
    with private_redis() as server:
        for r in range((kills + batch - 1) // batch):
            latencies += _one_round(server.url, min(batch, kills - len(latencies)), r)
    bound = TTL + 0.5
    p50, p99, worst = pct(latencies, 50), pct(latencies, 99), max(latencies)
    ok = worst <= bound
    return {
        "name": NAME,
        "title": TITLE,
        "issue": 9,
        "method": (
            f"{kills} worker processes (in batches of {batch}) each run one job under "
            f"`heartbeat(ttl={TTL}, interval={INTERVAL})`; after a few beats each is SIGKILLed "
            "at a "
            "random point of its beat cycle and the harness polls `PTTL` of the job's `alive` key "
            "every 5 ms until it is gone (from then on every reader reports STALE). The latency "
            "is kill to absence; the baseline is the ttl itself (the ratio column)."
        ),
        "tables": [
            {
                "title": f"Kill to STALE over {kills} SIGKILLs "
                f"(ttl {TTL} s, interval {INTERVAL} s)",
                "columns": ["figure", "seconds", "ratio to ttl", "goal", "met"],
                "rows": [
                    ["min", f"{min(latencies):.3f}", f"{min(latencies) / TTL:.2f}", "", ""],
                    ["p50", f"{p50:.3f}", f"{p50 / TTL:.2f}", "", ""],
                    [
                        "p99",
                        f"{p99:.3f}",
                        f"{p99 / TTL:.2f}",
                        f"≤ ttl + 0.5 = {bound}",
                        "yes" if p99 <= bound else "no",
                    ],
                    [
                        "max",
                        f"{worst:.3f}",
                        f"{worst / TTL:.2f}",
                        f"≤ {bound}",
                        "yes" if ok else "no",
                    ],
                ],
                "note": "Detection can never beat ttl - interval (the key was refreshed at most "
                "one interval before the kill); Redis expires the key on access, so a reader sees "
                "it gone at once after its PTTL runs out.",
            }
        ],
        "plots": [
            {
                "file": "stale_latency.png",
                "kind": "hist",
                "title": f"Kill → STALE ({kills} SIGKILLs, ttl {TTL} s)",
                "xlabel": "seconds from SIGKILL until the alive key is gone",
                "values": latencies,
                "bins": 20,
                "vlines": [(TTL, "ttl"), (bound, "goal")],
            }
        ],
        "data": {"latencies_s": latencies, "ttl": TTL, "interval": INTERVAL},
        "goals": {"detection within ttl + 0.5 s": ok},
    }


def main() -> None:
    import json

    print(json.dumps(run(quick=True)["tables"], indent=1))


if __name__ == "__main__":
    main()
