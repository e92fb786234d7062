"""A load process: N concurrent jobs of one design, measured from inside.

``python -m benchmarks.load IMPL URL N INTERVAL WARMUP WINDOW`` runs N jobs of IMPL with one
update (beat) per job every INTERVAL seconds (0: as fast as the design goes), waits WARMUP
seconds, then measures WINDOW seconds of updates and of this process's CPU time
(``time.process_time``), and prints one JSON line. Running in a process of its own keeps the
harness out of the CPU figure.

Designs: ``jobpulse`` (the process-wide ticker), ``naive`` (one task and one ``EVALSHA`` of the
same beat script per job: the design the ticker replaced), ``seed`` (the seed's pattern), and
the peers ``saq``, ``rq``, ``celery`` (see :mod:`benchmarks.peers`). Two references for the
client CPU figure (issue 19): ``bodies`` runs jobpulse's N job bodies (an idle task each and the
progress advancer over N ``ProgressCell`` objects) with no heartbeat, so its CPU is what the
bodies cost on their own; ``floor`` beats N jobs with the seed's commands (renew ``EVALSHA``,
``HSET``, ``EXPIRE``) pipelined per 100 ms tick over a raw asyncio socket, each command
pre-encoded as RESP bytes and the replies parsed by hiredis: the least a Python client can
spend per beat.

Once its jobs run, the process writes ``ready`` to stderr (a harness running several load
processes at once starts its own window after every one of them said so).

``python -m benchmarks.load --marks IMPL URL N INTERVAL`` runs the same jobs until ``stop`` (or
EOF) on stdin and answers each ``mark`` line with one JSON line ``{"updates", "cpu", "t"}``: the
updates written so far (counted by the client, whatever the beat's layout inside Redis), this
process's CPU time and its monotonic clock, so a harness can cut one window across several
processes and the server at once (the capacity run in :mod:`benchmarks.bench_goals`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis

from .common import Probe, advancer

NS = "load"


class Meter:
    """Counts updates; the harness reads it (:meth:`read`) at the window's edges only."""

    def __init__(self) -> None:
        self.updates = 0
        self.errors = 0
        self.lost = 0
        self.reader: Callable[[], int] | None = None

    def read(self) -> int:
        return self.reader() if self.reader is not None else self.updates


async def _stop_staggered(tasks: list[asyncio.Task[Any]], release: list[asyncio.Event]) -> None:
    """End the jobs 50 at a time, as a draining worker would."""
    for first in range(0, len(tasks), 50):
        for ev in release[first : first + 50]:
            ev.set()
        await asyncio.gather(*tasks[first : first + 50], return_exceptions=True)


async def _paced(
    beat: Callable[[], Awaitable[bool]], interval: float, meter: Meter, stop: asyncio.Event
) -> None:
    """Call ``beat`` every ``interval`` s (0: back to back) until ``stop``, counting updates,
    errors and a lost lease (``beat`` returned False: the job stops)."""
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            if not await beat():
                meter.lost += 1
                return
            meter.updates += 1
        except Exception:
            meter.errors += 1
        if interval > 0:
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - t0)))


async def _hold(
    n: int,
    job: Callable[[int, asyncio.Event], Any],
    ready: asyncio.Event,
    stop: asyncio.Event,
) -> None:
    """Start ``n`` jobs 50 at a time, say ready, run them until ``stop``, then reap them."""
    tasks: list[asyncio.Task[Any]] = []

    async def start_one(i: int) -> None:
        started = asyncio.Event()
        tasks.append(asyncio.create_task(job(i, started)))
        await started.wait()

    await _staggered(n, 50, start_one)
    ready.set()
    await stop.wait()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _staggered(n: int, batch: int, start_one: Callable[[int], Any]) -> None:
    """Start n jobs, ``batch`` at a time (acquiring 10,000 leases at once would only measure
    the connection pool)."""
    for first in range(0, n, batch):
        await asyncio.gather(*(start_one(i) for i in range(first, min(n, first + batch))))


async def run_jobpulse(url: str, n: int, interval: float, meter: Meter, ready: asyncio.Event,
                       stop: asyncio.Event) -> None:  # fmt: skip
    from jobpulse import LeaseLost, heartbeat

    client = aioredis.Redis.from_url(url)
    ttl = max(6.0, 4 * interval) if interval > 0 else 5.0
    iv = interval if interval > 0 else 0.001
    hbs: list[Any] = []
    prefix = secrets.token_hex(3)
    release: list[asyncio.Event] = []

    async def job(i: int, started: asyncio.Event, done: asyncio.Event) -> None:
        try:
            async with heartbeat(client, f"{prefix}-{i:06d}", namespace=NS, interval=iv, ttl=ttl,
                                 total=1_000_000) as hb:  # fmt: skip
                hbs.append(hb)
                started.set()
                await done.wait()  # an idle body: the computation runs elsewhere
        except LeaseLost:
            meter.lost += 1
        finally:
            started.set()

    tasks: list[asyncio.Task[Any]] = []

    async def start_one(i: int) -> None:
        started, done = asyncio.Event(), asyncio.Event()
        release.append(done)
        tasks.append(asyncio.create_task(job(i, started, done)))
        await started.wait()

    await _staggered(n, 50, start_one)
    meter.reader = lambda: sum(h.statistics().beats_written for h in hbs)
    adv = asyncio.create_task(advancer([h.progress for h in hbs], max(iv, 0.5), stop))
    ready.set()
    await stop.wait()
    await adv
    await _stop_staggered(tasks, release)
    await client.aclose()


async def run_naive(url: str, n: int, interval: float, meter: Meter, ready: asyncio.Event,
                    stop: asyncio.Event) -> None:  # fmt: skip
    """One task and one round trip per job per beat, the same Lua script as jobpulse (a batch
    of one, every field sent)."""
    from jobpulse._protocol import calls
    from jobpulse._protocol.keys import KeySchema
    from jobpulse._protocol.scripts import SCRIPTS

    pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=100, timeout=None)
    client = aioredis.Redis(connection_pool=pool)
    ttl_ms = int((max(6.0, 4 * interval) if interval > 0 else 5.0) * 1000)
    schema = KeySchema(NS)
    prefix = secrets.token_hex(3)
    await client.script_load(SCRIPTS.beat.text)
    await client.script_load(SCRIPTS.acquire.text)

    async def job(i: int, started: asyncio.Event) -> None:
        keys = schema.job(f"{prefix}-n{i:06d}").all()
        beat_keys = schema.job(f"{prefix}-n{i:06d}").beat()
        token = secrets.token_hex(8)
        try:
            reply = await client.evalsha(SCRIPTS.acquire.sha, len(keys), *keys, token, ttl_ms, 1000,
                                         "naive", "1000000", "", "", "")  # fmt: skip
        finally:
            started.set()
        fence, seq = int(reply[1]), int(reply[3])
        done = 0

        async def beat() -> bool:
            nonlocal seq, done
            seq += 1
            done += 1
            kind = "beat" if seq % 10 == 0 else ""
            fields = {"done": done, "total": 1000000, "stage": "", "rate": "0", "loop_lag_ms": "0"}
            event = (kind, "", 1000) if kind else None
            segment = calls.beat_segment(
                token=token, fence=fence, ttl_ms=ttl_ms, seq=seq, fields=fields, event=event,
                every_key=False,
            )  # fmt: skip
            sent = calls.beat_keys(beat_keys, segment)  # as the worker: state, alive (events)
            r = await client.execute_command(*calls.beat_command([(sent, segment)]))
            return int(r[0]) >= 0

        await _paced(beat, interval, meter, stop)

    await _hold(n, job, ready, stop)
    await client.aclose()


async def run_seed(url: str, n: int, interval: float, meter: Meter, ready: asyncio.Event,
                   stop: asyncio.Event) -> None:  # fmt: skip
    from .seed import SeedJob

    pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=100, timeout=None)
    client = aioredis.Redis(connection_pool=pool)
    prefix = secrets.token_hex(3)

    async def job(i: int, started: asyncio.Event) -> None:
        seed = SeedJob(client, f"{prefix}-s{i:06d}", interval=interval, ttl=6.0)
        try:
            ok = await client.set(seed.lock_key, seed.lock_val, nx=True, px=seed.ttl_ms)
        finally:
            started.set()
        assert ok

        async def beat() -> bool:
            seed.progress += 1
            return bool(await seed.beat())

        await _paced(beat, interval, meter, stop)

    await _hold(n, job, ready, stop)
    await client.aclose()


async def run_bodies(url: str, n: int, interval: float, meter: Meter, ready: asyncio.Event,
                     stop: asyncio.Event) -> None:  # fmt: skip
    """jobpulse's job bodies without jobpulse: N idle tasks and the advancer over N cells."""
    from jobpulse import ProgressCell

    cells = [ProgressCell(total=1_000_000) for _ in range(n)]
    release = [asyncio.Event() for _ in range(n)]
    tasks = [asyncio.create_task(ev.wait()) for ev in release]
    iv = interval if interval > 0 else 0.001
    adv = asyncio.create_task(advancer(cells, max(iv, 0.5), stop))
    ready.set()
    await stop.wait()
    await adv
    await _stop_staggered(tasks, release)


def _resp(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


async def run_floor(url: str, n: int, interval: float, meter: Meter, ready: asyncio.Event,
                    stop: asyncio.Event) -> None:  # fmt: skip
    """The seed's beat for N jobs, pipelined per 100 ms tick, pre-encoded, hiredis replies."""
    import hiredis
    import redis as sync_redis

    from .seed import RENEW

    port = int(url.rsplit(":", 1)[1].split("/")[0])
    setup = sync_redis.Redis(port=port)
    sha = setup.script_load(RENEW).encode()
    prefix = secrets.token_hex(3)
    ttl = b"%d" % int(max(6.0, 4 * interval) * 1000)
    token = b"tok-" + prefix.encode()
    renew, hset_head, expire = [], [], []
    for i in range(n):
        lock, tele = b"lock:job:f%s-%d" % (prefix.encode(), i), b"job:telemetry:f%s-%d" % (
            prefix.encode(), i)  # fmt: skip
        setup.set(lock, token, px=int(ttl))
        renew.append(_resp(b"EVALSHA", sha, b"1", lock, token, ttl))
        hset_head.append(b"*12\r\n$4\r\nHSET\r\n$%d\r\n%s\r\n$8\r\nprogress\r\n" % (
            len(tele), tele))  # fmt: skip
        expire.append(_resp(b"EXPIRE", tele, b"3600"))
    setup.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    parser = hiredis.Reader()
    progress = [0] * n
    tick = 0.1
    per_tick = max(1, round(n * tick / interval)) if interval > 0 else n
    ready.set()
    cursor = 0
    t_next = time.monotonic()
    while not stop.is_set():
        now = int(time.time())
        parts = []
        for _ in range(per_tick):
            i = cursor
            cursor = (cursor + 1) % n
            progress[i] += 1
            p = b"%d" % progress[i]
            tail = _resp(b"RUNNING")[4:]  # the value only
            parts.append(renew[i])
            parts.append(hset_head[i] + b"$%d\r\n%s\r\n" % (len(p), p)
                         + b"$5\r\nstage\r\n$7\r\nRUNNING\r\n$8\r\nalloc_mb\r\n$2\r\n58\r\n"
                         + b"$14\r\nlast_heartbeat\r\n" + _resp(b"%d" % now)[4:]
                         + b"$6\r\nstatus\r\n" + tail)  # fmt: skip
            parts.append(expire[i])
        writer.write(b"".join(parts))
        want = 3 * per_tick
        got = 0
        while got < want:
            parser.feed(await reader.read(65536))
            while got < want and (reply := parser.gets()) is not False:
                if isinstance(reply, hiredis.ReplyError):
                    meter.errors += 1
                got += 1
        meter.updates += per_tick
        if interval > 0:
            t_next += tick
            await asyncio.sleep(max(0.0, t_next - time.monotonic()))
    writer.close()
    await writer.wait_closed()


def _server_cpu(probe: Probe) -> float:
    info = probe.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def designs() -> dict[str, Any]:
    from . import peers

    return {
        "jobpulse": run_jobpulse,
        "naive": run_naive,
        "seed": run_seed,
        "bodies": run_bodies,
        "floor": run_floor,
        **peers.load_functions(),
    }


async def measure(impl: str, url: str, n: int, interval: float, warmup: float,
                  window: float) -> dict[str, Any]:  # fmt: skip
    meter = Meter()
    ready, stop = asyncio.Event(), asyncio.Event()
    t_setup = time.monotonic()
    task = asyncio.create_task(designs()[impl](url, n, interval, meter, ready, stop))
    waiter = asyncio.create_task(ready.wait())
    await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()  # raise the design's error
    setup = time.monotonic() - t_setup
    print("ready", file=sys.stderr, flush=True)
    await asyncio.sleep(warmup)
    probe = Probe(int(url.rsplit(":", 1)[1].split("/")[0]))
    s0 = _server_cpu(probe)
    u0, c0, w0 = meter.read(), time.process_time(), time.monotonic()
    lag_max = 0.0
    t_next = w0
    while time.monotonic() - w0 < window:  # also watch this loop's own lag
        t_next += 0.1
        await asyncio.sleep(max(0.0, t_next - time.monotonic()))
        lag_max = max(lag_max, time.monotonic() - t_next)
    u1, c1, w1 = meter.read(), time.process_time(), time.monotonic()
    s1 = _server_cpu(probe)
    probe.close()
    stop.set()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(60):
            await task
    rate = (u1 - u0) / (w1 - w0)
    cpu = (c1 - c0) / (w1 - w0)
    return {
        "impl": impl,
        "jobs": n,
        "interval": interval,
        "target_rate": n / interval if interval > 0 else None,
        "rate": rate,
        "cpu_core_fraction": cpu,
        "cpu_pct_per_1k": 100 * cpu / (rate / 1000) if rate else None,
        "server_us_per_update": 1e6 * (s1 - s0) / (u1 - u0) if u1 > u0 else None,
        "server_cpu_core_fraction": (s1 - s0) / (w1 - w0),
        "server_cpu_pct_per_1k": 100 * (s1 - s0) / (w1 - w0) / (rate / 1000) if rate else None,
        "setup_s": setup,
        "window_s": w1 - w0,
        "loop_lag_max_s": lag_max,
        "errors": meter.errors,
        "lost": meter.lost,
    }


async def marks(impl: str, url: str, n: int, interval: float) -> None:
    """Run ``n`` jobs of ``impl`` and answer ``mark`` on stdin until ``stop`` (see the module
    docstring)."""
    meter = Meter()
    ready, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(designs()[impl](url, n, interval, meter, ready, stop))
    waiter = asyncio.create_task(ready.wait())
    await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()  # raise the design's error
    print("ready", file=sys.stderr, flush=True)
    while True:
        line = (await asyncio.to_thread(sys.stdin.readline)).strip()
        if line != "mark":
            break  # "stop" or EOF
        mark = {"updates": meter.read(), "cpu": time.process_time(), "t": time.monotonic()}
        print(json.dumps(mark), flush=True)
    stop.set()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(60):
            await task


def main() -> None:
    if sys.argv[1] == "--marks":
        impl, url, n, interval = sys.argv[2:6]
        asyncio.run(marks(impl, url, int(n), float(interval)))
        return
    impl, url, n, interval, warmup, window = sys.argv[1:7]
    res = asyncio.run(measure(impl, url, int(n), float(interval), float(warmup), float(window)))
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
