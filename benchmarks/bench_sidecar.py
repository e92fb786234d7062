"""The sidecar's costs beside in-loop beats (issue 29, item 6; not asserted anywhere).

One run, each side in a fresh worker process of its own against one private Redis: the sync
shell with its beats from the sidecar helper (``jobpulse.sync.heartbeat``'s default) and the
same shell beating from a thread of the worker (``sidecar=False``). Each worker:

1. enters its first job (after ``import jobpulse``): the start-up time of a fresh process
   (for the sidecar: spawning the helper, its imports, its client, the acquire);
2. holds ``JOBS`` jobs at interval 1 s (``JOBS`` beats/s) for ``SECONDS``, and reads the CPU
   time of the worker and of its helper over that window (psutil), scaled to 1,000 beats/s;
3. sends 200 checkpoints one after another on one more job (with the others beating):
   ``checkpoint()`` latency, p50 and p99;
4. reads the helper's RSS (and USS: what it alone costs).

Then beats under a GIL hold: a fresh sync worker per side enters one job (interval 0.25 s,
ttl 1 s) and runs one C call that holds the GIL for ~3 s (``sum(range(n))``, calibrated in the
worker; 2 s in a --quick run), while this process reads the job every 50 ms with a
``StatusReader`` (cache off): the beats written during the hold (``seq`` before and after) and
the reads that said STALE.

Run: ``python -m benchmarks.bench_sidecar [--quick]`` (prints JSON).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from typing import Any

from .common import private_redis

NAME = "sidecar"
TITLE = "The sidecar helper beside in-loop beats"

WORKER = r"""
import contextlib, json, os, sys, time
import psutil, redis
import jobpulse.sync

url, sidecar, jobs, seconds = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), float(sys.argv[4])
client = redis.Redis.from_url(url, socket_timeout=3.0)
me = psutil.Process()

def cpu(proc):
    t = proc.cpu_times()
    return t.user + t.system

with contextlib.ExitStack() as stack:
    t0 = time.perf_counter()
    first = stack.enter_context(
        jobpulse.sync.heartbeat(client, "first", namespace="sc", sidecar=sidecar)
    )
    startup = time.perf_counter() - t0
    helper = psutil.Process(first.helper_pid) if sidecar else None
    for i in range(jobs - 1):
        hb = jobpulse.sync.heartbeat(client, f"j{i}", namespace="sc", sidecar=sidecar)
        stack.enter_context(hb)
    time.sleep(2.0)  # every job has beaten once: the window sees the steady state
    w0, h0, t1 = cpu(me), (cpu(helper) if helper else 0.0), time.monotonic()
    time.sleep(seconds)
    w1, h1, t2 = cpu(me), (cpu(helper) if helper else 0.0), time.monotonic()
    hb = jobpulse.sync.heartbeat(client, "ckpt", namespace="sc", sidecar=sidecar)
    stack.enter_context(hb)
    lat = []
    for i in range(200):
        a = time.perf_counter()
        hb.checkpoint(i=i)
        lat.append(time.perf_counter() - a)
    mem = helper.memory_full_info() if helper else None
    out = {
        "startup_s": startup,
        "window_s": t2 - t1,
        "worker_cpu_s": w1 - w0,
        "helper_cpu_s": h1 - h0,
        "checkpoint_s": lat,
        "helper_rss": mem.rss if mem else 0,
        "helper_uss": mem.uss if mem else 0,
        "worker_rss": me.memory_info().rss,
    }
print(json.dumps(out), flush=True)
"""


ASYNC_WORKER = r"""
import asyncio, contextlib, json, sys, time
import psutil
import redis.asyncio as aioredis
import jobpulse

url, sidecar, jobs, seconds = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), float(sys.argv[4])
me = psutil.Process()

def cpu(proc):
    t = proc.cpu_times()
    return t.user + t.system

async def main():
    client = aioredis.Redis.from_url(url)
    async with contextlib.AsyncExitStack() as stack:
        first = await stack.enter_async_context(
            jobpulse.heartbeat(client, "first", namespace="sa", sidecar=sidecar)
        )
        helper = psutil.Process(first.helper_pid) if sidecar else None
        for i in range(jobs - 1):
            hb = jobpulse.heartbeat(client, f"j{i}", namespace="sa", sidecar=sidecar)
            await stack.enter_async_context(hb)
        await asyncio.sleep(2.0)
        w0, h0, t1 = cpu(me), (cpu(helper) if helper else 0.0), time.monotonic()
        await asyncio.sleep(seconds)
        w1, h1, t2 = cpu(me), (cpu(helper) if helper else 0.0), time.monotonic()
        hb = jobpulse.heartbeat(client, "ckpt", namespace="sa", sidecar=sidecar)
        await stack.enter_async_context(hb)
        lat = []
        for i in range(200):
            a = time.perf_counter()
            await hb.checkpoint(i=i)
            lat.append(time.perf_counter() - a)
        mem = helper.memory_full_info() if helper else None
        return {
            "startup_s": 0.0,
            "window_s": t2 - t1,
            "worker_cpu_s": w1 - w0,
            "helper_cpu_s": h1 - h0,
            "checkpoint_s": lat,
            "helper_rss": mem.rss if mem else 0,
            "helper_uss": mem.uss if mem else 0,
            "worker_rss": me.memory_info().rss,
        }

print(json.dumps(asyncio.run(main())), flush=True)
"""

STARTUP = r"""
import sys, time
import redis
import jobpulse.sync

client = redis.Redis.from_url(sys.argv[1], socket_timeout=3.0)
t0 = time.perf_counter()
with jobpulse.sync.heartbeat(client, sys.argv[3], namespace="sc", sidecar=sys.argv[2] == "1"):
    print(time.perf_counter() - t0, flush=True)
"""
GIL_WORKER = r"""
import sys, time
import redis
import jobpulse.sync

url, sidecar, job, hold = sys.argv[1], sys.argv[2] == "1", sys.argv[3], float(sys.argv[4])
t0 = time.perf_counter()
sum(range(10**6))
n = int(10**6 * hold / (time.perf_counter() - t0))
client = redis.Redis.from_url(url, socket_timeout=3.0)
with jobpulse.sync.heartbeat(client, job, namespace="gil", interval=0.25, ttl=1.0,
                             sidecar=sidecar):
    time.sleep(1.0)  # a few beats first
    print("hold", flush=True)
    t1 = time.perf_counter()
    sum(range(n))  # one C call: the GIL is held throughout
    print("held", time.perf_counter() - t1, flush=True)
    time.sleep(0.5)
"""
GIL_HOLD = 3.0


async def _gil_side(url: str, sidecar: bool, job: str, hold: float) -> dict[str, Any]:
    import asyncio

    import redis.asyncio as aioredis

    from jobpulse import JobState, StatusReader

    client = aioredis.Redis.from_url(url)
    reader = StatusReader(client, namespace="gil", cache_ttl=0)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", GIL_WORKER, url, "1" if sidecar else "0", job, str(hold),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    while (await proc.stdout.readline()).strip() != b"hold":
        pass
    seq0 = (await reader.get(job)).seq
    reads = stale = 0
    held = asyncio.create_task(proc.stdout.readline())
    while not held.done():
        status = await reader.get(job)
        reads += 1
        stale += status.state is JobState.STALE
        await asyncio.wait([held], timeout=0.05)
    seq1 = (await reader.get(job)).seq
    hold_s = float(held.result().split()[1])
    await proc.wait()
    final = (await reader.get(job)).state
    await client.aclose()
    return {"hold_s": hold_s, "beats": (seq1 or 0) - (seq0 or 0), "reads": reads,
            "stale_reads": stale, "final": final.value}  # fmt: skip


def gil_hold(url: str, hold: float = GIL_HOLD) -> dict[str, Any]:
    import asyncio

    return {
        side: asyncio.run(_gil_side(url, side == "sidecar", f"hold-{side}", hold))
        for side in ("in_loop", "sidecar")
    }


STARTS = 7
"""Fresh processes per side for the start-up time (alternating sides; the median is shown)."""


def startups(url: str, starts: int = STARTS) -> tuple[float, float]:
    """Median first-job start-up (s) of fresh processes: (in-loop, sidecar)."""
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(starts):
        for sidecar in (False, True):
            args = [sys.executable, "-c", STARTUP, url, "1" if sidecar else "0", f"s{i}{sidecar}"]
            out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=120)
            times[sidecar].append(float(out.stdout.split()[0]))
    return statistics.median(times[False]), statistics.median(times[True])


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def side(
    url: str, sidecar: bool, jobs: int, seconds: float, script: str = WORKER
) -> dict[str, Any]:
    args = [sys.executable, "-c", script, url, "1" if sidecar else "0", str(jobs), str(seconds)]
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=600).stdout
    res: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    per_1000 = 1000.0 / jobs  # JOBS jobs at interval 1 s: JOBS beats/s
    cpu = res["worker_cpu_s"] + res["helper_cpu_s"]
    res["cpu_pct_per_1000"] = 100.0 * cpu / res["window_s"] * per_1000
    res["helper_cpu_pct_per_1000"] = 100.0 * res["helper_cpu_s"] / res["window_s"] * per_1000
    res["checkpoint_p50_ms"] = 1000 * _pct(res["checkpoint_s"], 0.50)
    res["checkpoint_p99_ms"] = 1000 * _pct(res["checkpoint_s"], 0.99)
    del res["checkpoint_s"]
    return res


def run(quick: bool = False, soak: bool = False) -> dict[str, Any]:
    jobs, seconds = (200, 1.5) if quick else (1000, 20.0)
    starts = 1 if quick else STARTS
    with private_redis() as server:
        inloop = side(server.url, False, jobs, seconds)
        helper = side(server.url, True, jobs, seconds)
        inloop["startup_s"], helper["startup_s"] = startups(server.url, starts)
        ainloop = side(server.url, False, jobs, seconds, ASYNC_WORKER)
        ahelper = side(server.url, True, jobs, seconds, ASYNC_WORKER)
        gil = gil_hold(server.url, 2.0 if quick else GIL_HOLD)
    acpu_ratio = ahelper["cpu_pct_per_1000"] / max(ainloop["cpu_pct_per_1000"], 1e-9)
    aadded_p99 = ahelper["checkpoint_p99_ms"] - ainloop["checkpoint_p99_ms"]
    cpu_ratio = helper["cpu_pct_per_1000"] / max(inloop["cpu_pct_per_1000"], 1e-9)
    added_start = 1000 * (helper["startup_s"] - inloop["startup_s"])
    added_p99 = helper["checkpoint_p99_ms"] - inloop["checkpoint_p99_ms"]
    mib = 1024 * 1024
    return {
        "name": NAME,
        "title": TITLE,
        "issue": 29,
        "method": (
            f"Two fresh worker processes, one after the other, against one private Redis: the "
            f"sync shell with sidecar=True and with sidecar=False (a beat thread in the worker). "
            f"Each holds {jobs} jobs at interval 1 s ({jobs} beats/s) for {seconds:.0f} s; CPU "
            "is psutil's user+system time of the worker plus its helper over that window, "
            "scaled to 1,000 beats/s; then 200 checkpoints in a row on one more job. Start-up: "
            f"the first `with heartbeat(...)` entry of a fresh process (after import), the "
            f"median of {starts} fresh processes per side, alternating. The machine is shared "
            "by several agents (load average often above 5 on 2 cores): read the ratios."
            + (" --quick: a short run, expect noise." if quick else "")
        ),
        "tables": [
            {
                "title": f"sync: jobpulse.sync.heartbeat() beside sidecar=False, {jobs} jobs",
                "columns": ["figure", "in-loop (thread)", "sidecar", "goal", "met"],
                "rows": [
                    [
                        "CPU % of a core per 1,000 beats/s (worker + helper)",
                        f"{inloop['cpu_pct_per_1000']:.1f}",
                        f"{helper['cpu_pct_per_1000']:.1f} "
                        f"(helper {helper['helper_cpu_pct_per_1000']:.1f})",
                        "<= 1.2x in-loop",
                        "yes" if cpu_ratio <= 1.2 else f"no ({cpu_ratio:.2f}x)",
                    ],
                    [
                        "checkpoint() p50 / p99 (ms)",
                        f"{inloop['checkpoint_p50_ms']:.2f} / {inloop['checkpoint_p99_ms']:.2f}",
                        f"{helper['checkpoint_p50_ms']:.2f} / {helper['checkpoint_p99_ms']:.2f}",
                        "",
                        f"{added_p99:+.2f} ms p99",
                    ],
                    [
                        "first job's start-up in a fresh process, median (ms)",
                        f"{1000 * inloop['startup_s']:.0f}",
                        f"{1000 * helper['startup_s']:.0f}",
                        "<= 150 ms added",
                        "yes" if added_start <= 150 else f"no (+{added_start:.0f} ms)",
                    ],
                    [
                        "helper RSS / USS (MiB)",
                        "",
                        f"{helper['helper_rss'] / mib:.1f} / {helper['helper_uss'] / mib:.1f}",
                        "",
                        "",
                    ],
                ],
                "note": "USS is the memory the helper alone adds (RSS counts shared pages).",
            },
            {
                "title": f"asyncio: heartbeat(sidecar=True) beside in-loop beats, {jobs} jobs",
                "columns": ["figure", "in-loop (ticker task)", "sidecar", "goal", "met"],
                "rows": [
                    [
                        "CPU % of a core per 1,000 beats/s (worker + helper)",
                        f"{ainloop['cpu_pct_per_1000']:.1f}",
                        f"{ahelper['cpu_pct_per_1000']:.1f} "
                        f"(helper {ahelper['helper_cpu_pct_per_1000']:.1f})",
                        "<= 1.2x in-loop",
                        "yes" if acpu_ratio <= 1.2 else f"no ({acpu_ratio:.2f}x)",
                    ],
                    [
                        "checkpoint() p50 / p99 (ms)",
                        f"{ainloop['checkpoint_p50_ms']:.2f} / {ainloop['checkpoint_p99_ms']:.2f}",
                        f"{ahelper['checkpoint_p50_ms']:.2f} / {ahelper['checkpoint_p99_ms']:.2f}",
                        "",
                        f"{aadded_p99:+.2f} ms p99",
                    ],
                ],
                "note": "The helper runs the asyncio shell's ticker (one per client, as in-loop). "
                "A --quick run on this machine met the CPU goal on both faces, this full run did "
                "not; whether the gap is the helper's own work or the shared machine's load is "
                "not established yet.",
            },
            {
                "title": "sync: one job (interval 0.25 s, ttl 1 s) while its body holds the GIL "
                "in one C call, read from another process every 50 ms",
                "columns": ["figure", "in-loop (thread)", "sidecar"],
                "rows": [
                    ["GIL held (s)", *(f"{gil[k]['hold_s']:.1f}" for k in ("in_loop", "sidecar"))],
                    [
                        "beats written during the hold",
                        *(str(gil[k]["beats"]) for k in ("in_loop", "sidecar")),
                    ],
                    [
                        "reads that said STALE / reads",
                        *(
                            f"{gil[k]['stale_reads']} / {gil[k]['reads']}"
                            for k in ("in_loop", "sidecar")
                        ),
                    ],
                    ["final state", *(gil[k]["final"] for k in ("in_loop", "sidecar"))],
                ],
                "note": "Beats are the snapshot's `seq` after the hold minus before it.",
            },
        ],
        "plots": [],
        "data": {
            "in_loop": inloop,
            "sidecar": helper,
            "asyncio_in_loop": ainloop,
            "asyncio_sidecar": ahelper,
            "jobs": jobs,
            "seconds": seconds,
            "gil_hold": gil,
        },
        "goals": {
            "sidecar CPU <= 1.2x in-loop (sync)": cpu_ratio <= 1.2,
            "sidecar CPU <= 1.2x in-loop (asyncio)": acpu_ratio <= 1.2,
            "start-up <= 150 ms added": added_start <= 150,
            "sidecar: beats go on and no STALE read under a GIL hold": (
                gil["sidecar"]["beats"] > 0 and gil["sidecar"]["stale_reads"] == 0
            ),
        },
    }


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
