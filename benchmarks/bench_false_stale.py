"""False STALE verdicts while both cores are saturated (issue 9 item 6, second half).

A worker process runs JOBS live jobs under default heartbeats (interval 1 s, ttl 6 s) while one
busy-loop process per core burns the CPU at the same priority; a reader process asks
``StatusReader.get()`` (cache off) for every job every 100 ms. Every STALE answer about a job
whose worker is alive is a false verdict. ``--soak`` runs 10 minutes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from .common import private_redis

NAME = "false_stale"
TITLE = "False STALE verdicts under CPU saturation"
JOBS = 50
WORKER = """
import asyncio, sys
import redis.asyncio as aioredis
from jobpulse import heartbeat

async def main(url, n):
    client = aioredis.Redis.from_url(url)
    async def job(i, ready):
        async with heartbeat(client, f"live-{i}", namespace="fs") as hb:
            ready.set()
            while True:
                hb.progress.advance()
                await asyncio.sleep(0.1)
    events = [asyncio.Event() for _ in range(n)]
    tasks = [asyncio.create_task(job(i, events[i])) for i in range(n)]
    for e in events:
        await e.wait()
    print("ready", flush=True)
    await asyncio.gather(*tasks)

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""
READER = """
import asyncio, json, sys, time
import redis.asyncio as aioredis
from jobpulse import StatusReader, JobState

async def main(url, n, seconds):
    client = aioredis.Redis.from_url(url)
    reader = StatusReader(client, namespace="fs", cache_ttl=0)
    reads = stale = other = 0
    worst_age = 0.0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for i in range(n):
            st = await reader.get(f"live-{i}")
            reads += 1
            if st.state is JobState.STALE:
                stale += 1
            elif st.state is not JobState.RUNNING:
                other += 1
            if st.heartbeat_age is not None:
                worst_age = max(worst_age, st.heartbeat_age)
        await asyncio.sleep(0.1)
    print(json.dumps({"reads": reads, "stale": stale, "not_running": other,
                      "max_heartbeat_age_s": worst_age}), flush=True)

asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
"""
BURN = "while True: pass"


def run(quick: bool = False, soak: bool = False) -> dict[str, Any]:
    seconds = 600.0 if soak else (3.0 if quick else 30.0)
    cores = os.cpu_count() or 2
    with private_redis() as server:
        worker = subprocess.Popen([sys.executable, "-c", WORKER, server.url, str(JOBS)],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True)  # fmt: skip
        assert worker.stdout is not None
        worker.stdout.readline()
        burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(cores)]
        try:
            t0 = time.monotonic()
            out = subprocess.run(
                [sys.executable, "-c", READER, server.url, str(JOBS), str(seconds)],
                capture_output=True, text=True, timeout=seconds + 120, check=True,
            ).stdout  # fmt: skip
            elapsed = time.monotonic() - t0
        finally:
            for p in burners:
                p.kill()
                p.wait()
            worker.kill()
            worker.wait()
    res = json.loads(out.strip().splitlines()[-1])
    kind = "the --soak run" if soak else "not the 10-minute soak: that is --soak"
    ok = res["stale"] == 0
    return {
        "name": NAME,
        "title": TITLE,
        "issue": 9,
        "method": (
            f"A worker process holds {JOBS} live jobs under default heartbeats (interval 1 s, ttl "
            f"6 s) while {cores} busy-loop processes (one per core) burn the CPU; a reader process "
            f"calls `StatusReader.get()` with the cache off for every job every 100 ms for "
            f"{seconds:.0f} s ({kind}). "
            "Every STALE answer is false: the workers were alive throughout."
        ),
        "tables": [
            {
                "title": f"{seconds:.0f} s with every core saturated",
                "columns": ["figure", "value", "goal", "met"],
                "rows": [
                    ["status reads", f"{res['reads']:,}", "", ""],
                    ["false STALE verdicts", str(res["stale"]), "0", "yes" if ok else "no"],
                    ["other non-RUNNING answers", str(res["not_running"]), "0", ""],
                    [
                        "worst heartbeat age seen (s)",
                        f"{res['max_heartbeat_age_s']:.2f}",
                        "< ttl = 6",
                        "yes" if res["max_heartbeat_age_s"] < 6 else "no",
                    ],
                    ["wall time (s)", f"{elapsed:.0f}", "", ""],
                ],
                "note": "The baseline of the heartbeat age is the interval (1 s): an age near 1 s "
                "means the beats kept their schedule under the burn.",
            }
        ],
        "plots": [],
        "data": {**res, "seconds": seconds, "jobs": JOBS, "burners": cores, "soak": soak},
        "goals": {f"zero false STALE ({seconds:.0f} s)": ok},
    }


def main() -> None:
    print(json.dumps(run(quick=True)["tables"], indent=1))


if __name__ == "__main__":
    main()
