"""Issue 19's goals after the beat diet, each measured beside the seed and the peers in the same
run, and what a beat's server time is made of.

1. Server µs per beat of one job (`INFO commandstats`, top-level commands the client sent),
   back to back and paced (a beat every 20 ms), jobpulse's public `heartbeat()` (back to back:
   `interval=1e-5`, the next beat leaves as soon as the previous one is answered, as the seed's
   loop does; its index refresh and every-10th stream entry included) vs the seed's beat vs
   BullMQ's `job.updateProgress`
   + `job.extendLock` (`benchmarks/bullmq.py`); bytes in + out per beat from the same windows.
2. Redis CPU µs per update with 1,000 jobs at once at 1 Hz: `used_cpu_sys + used_cpu_user`
   delta of the private server divided by the updates (`benchmarks/load.py`).
3. Live jobs at 1 Hz per Redis core, at saturation: as many client processes as it takes (or
   as the two cores allow) drive one private server flat out; updates/s counted by the server
   (commandstats) over the server's CPU seconds (INFO) in the same window.
4. Heartbeat client CPU per 1,000 beats/s at 2,000 and 10,000 jobs at 1 Hz, minus the CPU of the
   same job bodies run without a heartbeat; raw pipelined hiredis (`floor`) as the floor.
5. What a beat's server time is made of (ablation): variants of a script, each run on a private
   server against a realistic snapshot (18 fields), pipelined (hot caches) and one call per
   round trip with a 1 ms idle gap (cold caches, as a lone job's beats are); `usec_per_call`
   of `INFO commandstats`; the real `beat.lua` per job in batches of 1 and 64.

The read, watch and `ProgressCell` rows come from the `read`, `reader` and `progress`
benchmarks of the same run (`merge()` in `benchmarks/goals_report.py`, called by the report).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

from . import bullmq
from .common import Probe, UpdateCost, median, private_redis, ratio
from .goals_report import NAME, PACE, SATURATE, SCRIPT_CMDS, TITLE, build, merge
from .seed import SeedJob

__all__ = ["NAME", "TITLE", "merge", "run"]

NS = "goals"
_IDS = iter(range(1_000_000))  # job ids as long as bench_beat's ("job-000001"): equal bytes


# -- 1. one job: server µs and bytes per beat -----------------------------------------------


def _per_beat(cost: UpdateCost, beats: int) -> dict[str, float]:
    per = cost.per(beats)
    return {
        "beats": beats,
        "server_us": per["server_us"],
        "bytes": per["bytes_in"] + per["bytes_out"],
        "round_trips": per["round_trips"],
        "inner_calls": per["inner_calls"],
    }


async def _jobpulse_one(url: str, probe: Probe, pace: float, seconds: float) -> dict[str, float]:
    """One job under the public `heartbeat()`; pace 0 means back to back (interval 1e-5: the
    next beat is due before the previous one is answered, so it leaves on the reply)."""
    import redis.asyncio as aioredis

    from jobpulse import heartbeat

    client = aioredis.Redis.from_url(url)
    interval = pace or 1e-5
    async with heartbeat(
        client,
        f"one-{next(_IDS):06d}",
        namespace=NS,
        interval=interval,
        ttl=6.0,
        total=1_000_000_000,
    ) as hb:
        stop = asyncio.Event()

        async def body() -> None:  # progress moves between beats, as a computation's would
            while not stop.is_set():
                hb.progress.advance()
                await asyncio.sleep(interval / 3)

        task = asyncio.create_task(body())
        await asyncio.sleep(max(0.5, 12 * interval))  # past the first index refresh
        b0 = hb.statistics().beats_sent
        with UpdateCost(probe) as cost:
            await asyncio.sleep(seconds)
        b1 = hb.statistics().beats_sent
        stop.set()
        await task
    await client.aclose()
    return _per_beat(cost, b1 - b0)


async def _seed_one(url: str, probe: Probe, pace: float, count: int) -> dict[str, float]:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    async with SeedJob(client, f"one-{next(_IDS):06d}", interval=3600.0) as job:
        for _ in range(5):
            await job.beat()  # scripts loaded, connection warm
        with UpdateCost(probe) as cost:
            for _ in range(count):
                job.progress += 1
                await job.beat()
                if pace:
                    await asyncio.sleep(pace)
    await client.aclose()
    return _per_beat(cost, count)


def _bullmq_one(peer: bullmq.NodePeer, probe: Probe, pace: float, count: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("progress", "lock", "both"):
        probe.reset()
        n = peer.ask(f"{kind} {count} {pace * 1000:.0f}")["updates"]
        snap = probe.snapshot()
        us = sum(snap["cmds"].get(c, (0, 0))[1] for c in SCRIPT_CMDS)
        out[kind] = {"server_us": us / n, "bytes": (snap["net_in"] + snap["net_out"]) / n}
    return out


def single_job(url: str, port: int, probe: Probe, quick: bool) -> dict[str, Any]:
    rounds = 1 if quick else 3
    seconds = {0.0: 0.5 if quick else 2.0, PACE: 1.0 if quick else 5.0}
    runs: dict[str, dict[str, list[Any]]] = {
        mode: {"jobpulse": [], "seed": [], "bullmq": []} for mode in ("back_to_back", "paced")
    }
    peer: bullmq.NodePeer | None = None
    bull_skip = ""
    if not quick:
        try:
            peer = bullmq.NodePeer(port, 1)
        except bullmq.Unavailable as exc:
            bull_skip = str(exc)
    else:
        bull_skip = "full run only"
    try:
        for r in range(rounds):
            for pace, mode in ((0.0, "back_to_back"), (PACE, "paced")):
                jp = asyncio.run(_jobpulse_one(url, probe, pace, seconds[pace]))
                count = max(50, int(jp["beats"])) if pace == 0 else int(seconds[pace] / PACE)
                sd = asyncio.run(_seed_one(url, probe, pace, count))
                runs[mode]["jobpulse"].append(jp)
                runs[mode]["seed"].append(sd)
                if peer is not None:
                    runs[mode]["bullmq"].append(_bullmq_one(peer, probe, pace, count))
            del r
    finally:
        if peer is not None:
            peer.__exit__()
    out: dict[str, Any] = {"runs": runs, "bullmq_skipped": bull_skip}
    for mode, by in runs.items():
        out[mode] = {
            impl: {k: median([x[k] for x in xs]) for k in ("server_us", "bytes")}
            for impl, xs in by.items()
            if xs and impl != "bullmq"
        }
        if by["bullmq"]:
            out[mode]["bullmq"] = {
                kind: {
                    k: median([x[kind][k] for x in by["bullmq"]]) for k in ("server_us", "bytes")
                }
                for kind in ("progress", "lock", "both")
            }
    return out


# -- 2 and 4. load processes at 1 Hz --------------------------------------------------------


def load_child(
    impl: str, url: str, n: int, interval: float, warmup: float, window: float
) -> dict[str, Any]:
    from .bench_throughput import child

    return child(impl, url, n, interval, warmup, window, timeout=300)


def client_cpu(url: str, sizes: list[int], warmup: float, window: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in sizes:
        row = {
            impl: load_child(impl, url, n, 1.0, warmup + (2 if n >= 10_000 else 0), window)
            for impl in ("jobpulse", "bodies", "floor")
        }
        jp, bodies, floor = row["jobpulse"], row["bodies"], row["floor"]
        net = None
        if "failed" not in jp and "failed" not in bodies and jp["rate"]:
            net = (
                100 * (jp["cpu_core_fraction"] - bodies["cpu_core_fraction"]) / (jp["rate"] / 1000)
            )
        row["jobpulse_net_pct_per_1k"] = net
        row["floor_pct_per_1k"] = floor.get("cpu_pct_per_1k")
        out[str(n)] = row
    return out


# -- 3. saturation: live jobs at 1 Hz per Redis core -----------------------------------------


class _Loader:
    """A `benchmarks.load` process run flat out (interval 0) until killed."""

    def __init__(self, impl: str, url: str, n: int) -> None:
        cmd = [sys.executable, "-m", "benchmarks.load", impl, url, str(n), "0", "1", "600"]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        self.ready = threading.Event()
        self.tail: list[str] = []
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if line.strip() == "ready":
                self.ready.set()
            self.tail = [*self.tail[-5:], line.rstrip()]
        self.ready.set()  # exited: never wait forever

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _server_cpu(probe: Probe) -> float:
    info = probe.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _window(probe: Probe, design: str, seconds: float) -> dict[str, float]:
    _, cmds, per_update = SATURATE[design]
    probe.reset()
    c0, t0 = _server_cpu(probe), time.monotonic()
    time.sleep(seconds)
    c1, t1 = _server_cpu(probe), time.monotonic()
    snap = probe.snapshot()
    updates = sum(snap["cmds"].get(c, (0, 0))[0] for c in cmds) / per_update
    core = (c1 - c0) / (t1 - t0)
    rate = updates / (t1 - t0)
    return {"updates_per_s": rate, "server_core": core, "per_core": ratio(rate, core)}


def saturate(design: str, max_procs: int, seconds: float) -> dict[str, Any]:
    """Add client processes one at a time until the server uses ≥ 90 % of a core, or one more
    process no longer raises updates/s by 5 % (the clients, not Redis, are then the limit)."""
    steps: list[dict[str, Any]] = []
    n = SATURATE[design][0]
    with private_redis() as server:
        probe = Probe(server.port)
        for procs in range(1, max_procs + 1):
            loaders: list[Any] = []
            try:
                if design == "bullmq":
                    for _ in range(procs):
                        peer = bullmq.NodePeer(server.port, n)
                        loaders.append(peer)
                        peer.ask("load")
                else:
                    loaders = [_Loader(design, server.url, n) for _ in range(procs)]
                    for ld in loaders:
                        ld.ready.wait(120)
                    dead = [ld.tail for ld in loaders if ld.proc.poll() is not None]
                    if dead:
                        steps.append({"procs": procs, "failed": " / ".join(dead[0])[-200:]})
                        break
                time.sleep(2.0)  # settle: every process past its setup and warm-up
                step = {"procs": procs, "jobs": n * procs, **_window(probe, design, seconds)}
            finally:
                for ld in loaders:
                    if isinstance(ld, bullmq.NodePeer):
                        with contextlib.suppress(Exception):
                            ld.ask("stop")
                        ld.__exit__()
                    else:
                        ld.stop()
            steps.append(step)
            print(
                f"#     {design} x{procs}: {step['updates_per_s']:,.0f}/s, server "
                f"{100 * step['server_core']:.0f} % of a core",
                flush=True,
            )
            prev = steps[-2] if len(steps) > 1 else None
            if step["server_core"] >= 0.9 or (
                prev and step["updates_per_s"] < 1.05 * prev.get("updates_per_s", 0)
            ):
                break
        probe.close()
    good = [s for s in steps if "failed" not in s]
    best = max(good, key=lambda s: s["updates_per_s"]) if good else None
    return {"steps": steps, "best": best}


# -- 5. ablation: where a beat's server time goes ----------------------------------------------

_SNAPSHOT = {"status": "RUNNING", "stage": "", "done": "100", "total": "1000000000",
             "rate": "9.999", "eta_s": "0", "rss_bytes": "52781056", "cpu_s": "0.28",
             "loop_lag_ms": "0", "seq": "1", "fence": "1796096775961107", "attempt": "1",
             "worker": "vm:9129", "started_ms": "1796096775961", "heartbeat_ms": "1796096786011",
             "progress_ms": "1796096786011", "meta": "", "kind": ""}  # fmt: skip
_ARGS = ["tok123456789", "1796096775961107", "6000", "2", "12345678", "12345", "1000000000",
         "stage-a", "123.4", "55.2", "123456789", "12.34", "0.3", "x", "y"]  # fmt: skip
_HSET11 = ", ".join(f"'f{i}', ARGV[{i + 1}]" for i in range(11))
VARIANTS = {  # name -> script body (4 keys, the 15 arguments above)
    "empty script (4 keys, 15 args)": "return 1",
    "+ TIME": "redis.call('TIME') return 1",
    "+ GET alive": "redis.call('GET', KEYS[3]) return 1",
    "+ GET + PEXPIRE alive": "redis.call('GET', KEYS[3]) redis.call('PEXPIRE', KEYS[3], 6000) "
    "return 1",
    "+ SET alive PX": "redis.call('SET', KEYS[3], 5, 'PX', 6000) return 1",
    "+ HMGET of 3 fields": "redis.call('HMGET', KEYS[1], 'seq', 'cancel', 'done') return 1",
    "+ HSET of 2 fields": "redis.call('HSET', KEYS[1], 'seq', ARGV[4], 'done', ARGV[6]) return 1",
    "+ HSET of 11 fields": f"redis.call('HSET', KEYS[1], {_HSET11}) return 1",
    "reply: a 4-element array instead of 1 integer": "return {1, 0, 1700000000000, 12345}",
}


def ablation(quick: bool) -> dict[str, Any]:
    import redis

    from jobpulse._protocol import calls
    from jobpulse._protocol.keys import KeySchema, alive_value

    out: dict[str, Any] = {"variants": {}, "beat": {}}
    with private_redis() as server:
        client = redis.Redis.from_url(server.url)
        jobs = [KeySchema("abl").job(f"job-{i:06d}").all() for i in range(64)]

        def reset() -> None:
            pipe = client.pipeline(transaction=False)
            for keys in jobs:
                pipe.delete(keys[0])
                pipe.hset(keys[0], mapping=_SNAPSHOT)
                pipe.set(keys[2], alive_value("tok123456789", 1796096775961107, 1))
            pipe.execute()
            client.config_resetstat()

        def timed(commands: list[list[Any]], gap: bool, per_call: int) -> float:
            reset()
            pipe = client.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)
                if gap:
                    pipe.execute()
                    time.sleep(0.001)
            pipe.execute()
            stats = client.info("commandstats")["cmdstat_evalsha"]
            return float(stats["usec"]) / (stats["calls"] * per_call)

        n_hot, n_gap = (2000, 200) if quick else (20000, 1000)
        for name, body in VARIANTS.items():
            sha = client.script_load(body)
            command = ["EVALSHA", sha, len(jobs[0]), *jobs[0], *_ARGS]
            out["variants"][name] = {
                "hot": timed([command] * n_hot, False, 1),
                "cold": timed([command] * n_gap, True, 1),
            }
        client.script_load(calls.SCRIPTS.beat.text)

        def beat(keys: Any, seq: int, n_fields: int) -> tuple[Any, list[Any]]:
            names = calls.BEAT_FIELDS[8 - n_fields :]
            fields = dict(zip(names, _ARGS[13 - n_fields : 13], strict=True))
            segment = calls.beat_segment(
                token="tok123456789", fence=1796096775961107, ttl_ms=6000, seq=seq, fields=fields
            )
            return keys, segment

        for n_fields in (8, 3, 0):
            cmds = [calls.beat_command([beat(jobs[0], s, n_fields)]) for s in range(2, n_hot + 2)]
            gaps = [calls.beat_command([beat(jobs[0], s, n_fields)]) for s in range(2, n_gap + 2)]
            out["beat"][f"beat.lua, 1 job, {n_fields} fields sent"] = {
                "hot": timed(cmds, False, 1),
                "cold": timed(gaps, True, 1),
            }
        batches = n_hot // 64
        cmds = [calls.beat_command([beat(k, s, 3) for k in jobs]) for s in range(2, batches + 2)]
        gaps = [calls.beat_command([beat(k, s, 3) for k in jobs]) for s in range(2, 52)]
        out["beat"]["beat.lua, a batch of 64 jobs, 3 fields each (per job)"] = {
            "hot": timed(cmds, False, 64),
            "cold": timed(gaps, True, 64),
        }
        client.close()
    return out


# -- run --------------------------------------------------------------------------------------


def run(quick: bool = False) -> dict[str, Any]:
    data: dict[str, Any] = {"quick": quick}
    with private_redis() as server:
        probe = Probe(server.port)
        probe.calibrate()
        data["single"] = single_job(server.url, server.port, probe, quick)
        probe.close()
        warmup, window = (1.0, 1.5) if quick else (3.0, 8.0)
        n_cpu = 200 if quick else 1000
        data["cpu_per_update"] = {
            impl: load_child(impl, server.url, n_cpu, 1.0, warmup, window)
            for impl in ("jobpulse", "seed")
        }
        data["cpu_per_update"]["jobs"] = n_cpu
        data["client_cpu"] = client_cpu(
            server.url, [500] if quick else [2000, 10_000], warmup, window
        )
    data["capacity"] = {}
    if quick:
        data["capacity_skipped"] = "full run only"
    else:
        for design in SATURATE:
            if design == "bullmq":
                try:
                    bullmq.ensure_installed()
                except bullmq.Unavailable as exc:
                    data["capacity"][design] = {"skipped": str(exc)}
                    continue
            data["capacity"][design] = saturate(design, 4, 5.0)
    data["ablation"] = ablation(quick)
    data["bullmq_version"] = bullmq.version()
    data["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    return build(data, method=" ".join((__doc__ or "").split("\n\n", 1)[1].split()))


def main() -> None:
    print(json.dumps(run(quick="--quick" in sys.argv)["tables"], indent=1))


if __name__ == "__main__":
    main()
