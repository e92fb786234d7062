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
3. Live jobs at 1 Hz per Redis core: redis-server pinned alone on one CPU, client processes on
   the other, added one at a time while they raise updates/s (or until Redis reaches 90 % of its
   core); updates/s counted by the clients over the server's CPU seconds (INFO) in the same
   window, i.e. 1 core / server CPU per update (why: see ``benchmarks/goals28.py``). BullMQ:
   every job's ``updateProgress`` then one ``extendLocks`` of all jobs per round; BullMQ's
   server CPU per update at 1,000 jobs at 1 Hz (progress, lock renewal, both) beside row 2.
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
import shutil
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


def _per_beat(cost: UpdateCost, beats: int, cpu_s: float) -> dict[str, float]:
    per = cost.per(beats)
    return {
        "beats": beats,
        "server_us": per["server_us"],
        "server_cpu_us": 1e6 * cpu_s / max(beats, 1),
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
        c0 = _server_cpu(probe)  # outside the byte counters' window (INFO's reply is long)
        with UpdateCost(probe) as cost:
            await asyncio.sleep(seconds)
        c1 = _server_cpu(probe)
        b1 = hb.statistics().beats_sent
        stop.set()
        await task
    await client.aclose()
    return _per_beat(cost, b1 - b0, c1 - c0)


async def _seed_one(url: str, probe: Probe, pace: float, count: int) -> dict[str, float]:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    async with SeedJob(client, f"one-{next(_IDS):06d}", interval=3600.0) as job:
        for _ in range(5):
            await job.beat()  # scripts loaded, connection warm
        c0 = _server_cpu(probe)
        with UpdateCost(probe) as cost:
            for _ in range(count):
                job.progress += 1
                await job.beat()
                if pace:
                    await asyncio.sleep(pace)
        c1 = _server_cpu(probe)
    await client.aclose()
    return _per_beat(cost, count, c1 - c0)


def _bullmq_one(peer: bullmq.NodePeer, probe: Probe, pace: float, count: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("progress", "lock"):
        probe.reset()
        n = peer.ask(f"{kind} {count} {pace * 1000:.0f}")["updates"]
        snap = probe.snapshot()
        us = sum(snap["cmds"].get(c, (0, 0))[1] for c in SCRIPT_CMDS)
        out[kind] = {"server_us": us / n, "bytes": (snap["net_in"] + snap["net_out"]) / n}
    # both = the sum: a window of its own cost ~7 s a round (paced) and told nothing more
    out["both"] = {k: out["progress"][k] + out["lock"][k] for k in ("server_us", "bytes")}
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
            impl: {k: median([x[k] for x in xs]) for k in ("server_us", "server_cpu_us", "bytes")}
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


def bullmq_paced(n: int, warmup: float, window: float) -> dict[str, Any]:
    """BullMQ's server CPU per update with ``n`` jobs at 1 Hz: each second every job's
    ``updateProgress`` and one ``extendLocks`` call renewing all ``n`` locks (the Worker's lock
    manager batches them so); each half alone and both, one window each."""
    out: dict[str, Any] = {"jobs": n}
    with private_redis() as server, bullmq.NodePeer(server.port, n) as peer:
        probe = Probe(server.port)
        for kind in ("progress", "lock", "both"):
            peer.ask(f"load 1000 {kind}")
            time.sleep(warmup)
            u0, c0 = peer.ask("count")["updates"], _server_cpu(probe)
            time.sleep(window)
            u1, c1 = peer.ask("count")["updates"], _server_cpu(probe)
            peer.ask("stop")
            out[kind] = {
                "updates": u1 - u0,
                "server_us_per_update": 1e6 * (c1 - c0) / (u1 - u0) if u1 > u0 else None,
            }
        probe.close()
    return out


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


def pinning() -> tuple[set[int], set[int]] | None:
    """(server CPUs, client CPUs) for the capacity run: Redis alone on the first CPU this
    process may use, every client process on the others; None with fewer than two CPUs or
    without ``taskset`` (util-linux)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 or shutil.which("taskset") is None:
        return None
    return {cpus[0]}, set(cpus[1:])


def _pin_server(pid: int, cpus: set[int]) -> None:
    """Pin every thread of the redis-server (its main thread and its bio threads)."""
    spec = ",".join(map(str, sorted(cpus)))
    subprocess.run(["taskset", "-a", "-p", "-c", spec, str(pid)], check=True, capture_output=True)


class _Loader:
    """A `benchmarks.load --marks` process (jobpulse, seed) or a Node process (BullMQ) beating
    its jobs as fast as it can on the client CPUs; :meth:`mark` reads its update count
    (client-side)."""

    def __init__(
        self, design: str, server: Any, n: int, interval: float, cpus: set[int] | None
    ) -> None:
        import psutil

        self.design = design
        self.peer: bullmq.NodePeer | None = None
        self.tail: list[str] = []
        if design == "bullmq":
            self.peer = bullmq.NodePeer(server.port, n, cpus=cpus)
            self.peer.ask("load 0")
            self.proc: subprocess.Popen[str] = self.peer.proc
        else:
            load = ["-m", "benchmarks.load", "--marks", design, server.url, str(n), str(interval)]
            cmd = [*bullmq.pinned(cpus), sys.executable, *load]
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            ready = threading.Event()
            threading.Thread(target=self._watch, args=(ready,), daemon=True).start()
            ready.wait(120)
            if self.proc.poll() is not None:
                raise RuntimeError(" / ".join(self.tail)[-200:] or "load process exited")
        self.ps = psutil.Process(self.proc.pid)

    def _watch(self, ready: threading.Event) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if line.strip() == "ready":
                ready.set()
            self.tail = [*self.tail[-5:], line.rstrip()]
        ready.set()  # exited: never wait forever

    def mark(self) -> tuple[int, float]:
        """(updates so far, the process's CPU seconds so far)."""
        t = self.ps.cpu_times()
        if self.peer is not None:
            return int(self.peer.ask("count")["updates"]), t.user + t.system
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write("mark\n")
        self.proc.stdin.flush()
        return int(json.loads(self.proc.stdout.readline())["updates"]), t.user + t.system

    def stop(self) -> None:
        if self.peer is not None:
            with contextlib.suppress(Exception):
                self.peer.ask("stop")
            self.peer.__exit__()
            return
        # killed, not drained: the server is thrown away, and 2,000 final writes queued behind
        # flat-out beats would take longer than the window
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _server_cpu(probe: Probe) -> float:
    info = probe.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _window(probe: Probe, loaders: list[_Loader], seconds: float) -> dict[str, float]:
    m0 = [ld.mark() for ld in loaders]
    c0, t0 = _server_cpu(probe), time.monotonic()
    time.sleep(seconds)
    c1, t1 = _server_cpu(probe), time.monotonic()
    m1 = [ld.mark() for ld in loaders]
    dt = t1 - t0
    rate = sum(b[0] - a[0] for a, b in zip(m0, m1, strict=True)) / dt
    core = (c1 - c0) / dt
    return {
        "updates_per_s": rate,
        "server_core": core,
        "server_us_per_update": 1e6 * core / rate if rate else 0.0,
        "per_core": ratio(rate, core),
        "client_cores": sum(b[1] - a[1] for a, b in zip(m0, m1, strict=True)) / dt,
    }


def _settle(loaders: list[_Loader], most: float, step: float = 1.0) -> None:
    """Wait until the loaders' summed rate over two successive ``step`` s differs by < 10 %
    (every process past its start-up and warm-up), at most ``most`` seconds."""
    t_end = time.monotonic() + most
    last = None

    def total() -> int:
        return sum(ld.mark()[0] for ld in loaders)

    u0 = total()
    while time.monotonic() < t_end:
        time.sleep(step)
        u1 = total()
        rate, u0 = u1 - u0, u1
        if last is not None and rate > 0 and abs(rate - last) < 0.1 * rate:
            return
        last = rate


def saturate(design: str, max_procs: int, seconds: float, settle: float = 10.0) -> dict[str, Any]:
    """Redis pinned alone on one CPU, client processes of ``design`` on the other(s), added one
    at a time (the earlier ones keep running) until Redis uses ≥ 90 % of its CPU or one more
    process raises updates/s by < 5 %. Each step: updates/s (counted by the clients) over the
    server's CPU seconds in the same window; the capacity is the step with the busiest Redis."""
    steps: list[dict[str, Any]] = []
    n, interval = SATURATE[design]
    pins = pinning()
    with private_redis() as server:
        assert server.proc is not None
        if pins:
            _pin_server(server.proc.pid, pins[0])
        probe = Probe(server.port)
        loaders: list[_Loader] = []
        try:
            for procs in range(1, max_procs + 1):
                try:
                    loaders.append(_Loader(design, server, n, interval, pins[1] if pins else None))
                except (RuntimeError, bullmq.Unavailable) as exc:
                    steps.append({"procs": procs, "failed": str(exc)[-200:]})
                    break
                _settle(loaders, settle)
                step = {"procs": procs, "jobs": n * procs, **_window(probe, loaders, seconds)}
                steps.append(step)
                print(
                    f"#     {design} x{procs}: {step['updates_per_s']:,.0f}/s, server "
                    f"{100 * step['server_core']:.0f} % of its core, "
                    f"{step['per_core']:,.0f} per core",
                    flush=True,
                )
                prev = steps[-2] if len(steps) > 1 else None
                if step["server_core"] >= 0.9 or (
                    prev and step["updates_per_s"] < 1.05 * prev.get("updates_per_s", 0)
                ):
                    break
        finally:
            for ld in loaders:
                ld.stop()
            probe.close()
    good = [s for s in steps if "failed" not in s]
    best = max(good, key=lambda s: s["server_core"]) if good else None
    return {"steps": steps, "best": best, "pinned": bool(pins)}


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
                token="tok123456789", fence=1796096775961107, ttl_ms=6000, seq=seq, fields=fields,
                every_key=False,
            )  # fmt: skip
            # as the worker sends it: state and alive (keys in JobKeys.all()'s order)
            return calls.beat_keys((keys[0], keys[2], keys[1], keys[3]), segment), segment

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
        if not quick:
            try:
                data["cpu_per_update"]["bullmq"] = bullmq_paced(n_cpu, 2.0, window)
            except bullmq.Unavailable as exc:
                data["cpu_per_update"]["bullmq"] = {"skipped": str(exc)}
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
            # two steps: the clients share one CPU, so a third process adds no updates, and
            # its start-up beside two flat-out ones took ~40 s on the loaded machine
            data["capacity"][design] = saturate(design, 2, 5.0)
    data["ablation"] = ablation(quick)
    data["bullmq_version"] = bullmq.version()
    data["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    return build(data, method=" ".join((__doc__ or "").split("\n\n", 1)[1].split()))


def main() -> None:
    print(json.dumps(run(quick="--quick" in sys.argv)["tables"], indent=1))


if __name__ == "__main__":
    main()
