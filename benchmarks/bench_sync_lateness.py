"""Sync beat lateness beside CPU-bound Python threads (issue 13; not asserted anywhere).

One sync job (``jobpulse.sync.heartbeat``, interval 1 s, ttl 6 s) runs in this process while
N pure-Python busy threads fight for the GIL (N = 0, 2, 4). Another process's view is what
matters, so a reader (a separate process, cache off) reads the job's ``heartbeat_age`` every
50 ms: with beats on time it stays below the interval; lateness is what exceeds it. Also
reported: the beat thread's own wake-up lag (``WORKER_STATS``, mean). ``--quick``: 8 s per row.

Run: ``python -m benchmarks.bench_sync_lateness [--quick]`` (prints JSON rows).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
from typing import Any

import redis

import jobpulse.sync
from jobpulse._worker.stats import WORKER_STATS

from .common import private_redis

READER = """
import json, sys, time
import redis
from jobpulse.sync import StatusReader
url, seconds = sys.argv[1], float(sys.argv[2])
reader = StatusReader(redis.Redis.from_url(url), namespace="lat", cache_ttl=0.0)
ages, states = [], set()
end = time.monotonic() + seconds
while time.monotonic() < end:
    status = reader.get("job")
    states.add(status.state.name)
    if status.heartbeat_age is not None:
        ages.append(status.heartbeat_age)
    time.sleep(0.05)
print(json.dumps({"ages": ages, "states": sorted(states)}))
"""


def _spin(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():
        x += 1


def row(url: str, threads: int, seconds: float) -> dict[str, Any]:
    client = redis.Redis.from_url(url, socket_timeout=3.0)
    stop = threading.Event()
    spinners = [threading.Thread(target=_spin, args=(stop,)) for _ in range(threads)]
    lag_sum, lag_count = WORKER_STATS.loop_lag_sum, WORKER_STATS.loop_lag_count
    with jobpulse.sync.heartbeat(
        client, "job", namespace="lat", interval=1.0, ttl=6.0, sidecar=False
    ) as hb:
        for t in spinners:
            t.start()
        reader = subprocess.run(
            [sys.executable, "-c", READER, url, str(seconds)],
            capture_output=True,
            text=True,
            check=True,
        )
        stop.set()
        beats = hb.statistics().beats_written
    for t in spinners:
        t.join()
    client.close()
    seen = json.loads(reader.stdout)
    ages = sorted(seen["ages"])
    lags = WORKER_STATS.loop_lag_count - lag_count
    return {
        "cpu_threads": threads,
        "seconds": seconds,
        "beats_written": beats,
        "reads": len(ages),
        "states_seen": seen["states"],
        "heartbeat_age_p50_s": round(statistics.median(ages), 3),
        "heartbeat_age_p99_s": round(ages[int(len(ages) * 0.99) - 1], 3),
        "heartbeat_age_max_s": round(ages[-1], 3),
        "lateness_max_s": round(max(0.0, ages[-1] - 1.0), 3),
        "wake_lag_mean_ms": round(1000 * (WORKER_STATS.loop_lag_sum - lag_sum) / max(lags, 1), 2),
    }


def main(argv: list[str]) -> None:
    seconds = 8.0 if "--quick" in argv else 30.0
    with private_redis() as server:
        for threads in (0, 2, 4):
            print(json.dumps(row(server.url, threads, seconds)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
