"""The processes of a nemesis run: ``python -m tests.nemesis.actors ROLE CONFIG-JSON``.

Each prints ``ready`` once it runs and appends its operations to its own history file
(:mod:`tests.nemesis.history`) until the harness kills it. Roles:

* ``async-worker`` / ``sync-worker``: one job after another (beats from the worker itself, or
  from jobpulse's sidecar helper process with ``sidecar``) (ids ``<proc>-<n>``, unique), each
  ``steps`` of 0.1 s with a checkpoint ``{"n": step}`` every 5 steps, under
  :func:`jobpulse.heartbeat` (beats on the event loop) or :func:`jobpulse.sync.heartbeat` (beats
  on its thread). SIGUSR1 makes the body hold the GIL for ``gil`` seconds (one C call).
* ``sweeper``: ``Sweeper.sweep()`` every 0.3 s; each claim delivered is acknowledged, except one
  in four (a handler that failed: the claim must come again, ``redeliver_after`` later).
* ``async-reader`` / ``sync-reader``: reads every job the workers started (it follows their
  history files) every 0.2 s with :class:`jobpulse.StatusReader` (``cache_ttl`` 0.5) or
  :class:`jobpulse.sync.StatusReader`, until a job has been terminal for 3 reads (or UNKNOWN
  for 50).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import FrameType
from typing import Any

import redis

import jobpulse.sync
from jobpulse import JobpulseError, LeaseLost, StatusReader, Sweeper, heartbeat

from .history import History
from .topology import async_client, factory, sync_client

STEP = 0.1


def _gil_hold(hist: History, seconds: float, signum: int = signal.SIGUSR1) -> None:
    """On ``signum``, hold the GIL for about ``seconds``: ``sum(range(n))`` is one C call that
    never lets another thread (a sync heartbeat's beat thread) or the event loop run."""
    t = time.perf_counter()
    sum(range(1_000_000))
    n = int(1_000_000 * seconds / max(time.perf_counter() - t, 1e-6))

    def hold(signum: int, frame: FrameType | None) -> None:
        start = time.monotonic()
        sum(range(n))
        hist.add("gil", start=start, end=time.monotonic())

    signal.signal(signum, hold)


def _options(cfg: dict[str, Any]) -> dict[str, Any]:
    """The heartbeat's options: a sidecar's helper builds its client with the topology's
    ``client_factory`` (Sentinel, Cluster)."""
    opts = {"namespace": cfg["ns"], "ttl": cfg["ttl"], "interval": cfg["interval"],
            "sidecar": cfg["sidecar"]}  # fmt: skip
    made = factory(cfg["conn"]) if cfg["sidecar"] else None
    if made is not None:
        opts["client_factory"] = made
    return opts


def _steps(cfg: dict[str, Any], n: int) -> int:
    return random.Random(f"{cfg['seed']}-{cfg['proc']}-{n}").randint(15, 45)


async def async_worker(cfg: dict[str, Any], hist: History) -> None:
    client = async_client(cfg["conn"])
    opts = _options(cfg)
    print("ready", flush=True)
    for n in range(1, 1_000_000):
        job, fence, t0 = f"{cfg['proc']}-{n}", None, time.monotonic()
        try:
            async with heartbeat(client, job, **opts) as hb:
                fence = hb.fence
                hist.add(
                    "acquire",
                    job=job,
                    fence=fence,
                    attempt=hb.attempt,
                    shell="async",
                    sidecar=cfg["sidecar"],
                    t0=t0,
                )
                for k in range(1, _steps(cfg, n) + 1):
                    await asyncio.sleep(STEP)
                    hb.progress.advance()
                    if k % 5 == 0:
                        c0 = time.monotonic()
                        await hb.checkpoint(n=k)
                        hist.add("checkpoint", job=job, fence=fence, n=k, t0=c0)
                t0 = time.monotonic()
            hist.add("final", job=job, fence=fence, status="COMPLETED", t0=t0)
        except LeaseLost as exc:
            hist.add("lease_lost", job=job, fence=fence, cause=exc.cause.name)
        except (JobpulseError, redis.RedisError, OSError, TimeoutError) as exc:
            hist.add("job_error", job=job, fence=fence, error=repr(exc))
            await asyncio.sleep(STEP)


def sync_worker(cfg: dict[str, Any], hist: History) -> None:
    # A blocking pipeline is bounded by the client's socket_timeout only: keep it below ttl, as
    # docs/sync.md says (without it a connection that never answers stops the beat thread).
    client = sync_client(cfg["conn"], socket_timeout=cfg["ttl"] / 3)
    opts = _options(cfg)
    print("ready", flush=True)
    for n in range(1, 1_000_000):
        job, fence, t0 = f"{cfg['proc']}-{n}", None, time.monotonic()
        try:
            with jobpulse.sync.heartbeat(client, job, **opts) as hb:
                fence = hb.fence
                hist.add(
                    "acquire",
                    job=job,
                    fence=fence,
                    attempt=hb.attempt,
                    shell="sync",
                    sidecar=cfg["sidecar"],
                    t0=t0,
                )
                for k in range(1, _steps(cfg, n) + 1):
                    time.sleep(STEP)
                    hb.check()
                    hb.progress.advance()
                    if k % 5 == 0:
                        c0 = time.monotonic()
                        if hb.checkpoint(n=k):
                            hist.add("checkpoint", job=job, fence=fence, n=k, t0=c0)
                t0 = time.monotonic()
            hist.add("final", job=job, fence=fence, status="COMPLETED", t0=t0)
        except LeaseLost as exc:
            hist.add("lease_lost", job=job, fence=fence, cause=exc.cause.name)
        except (JobpulseError, redis.RedisError, OSError, TimeoutError) as exc:
            hist.add("job_error", job=job, fence=fence, error=repr(exc))
            time.sleep(STEP)


async def sweeper(cfg: dict[str, Any], hist: History) -> None:
    client = async_client(cfg["conn"])
    sw = Sweeper(client, namespace=cfg["ns"], redeliver_after=cfg["redeliver_after"])
    rng = random.Random(f"{cfg['seed']}-{cfg['proc']}")
    print("ready", flush=True)
    while True:
        await asyncio.sleep(0.3)
        try:
            for job in await sw.sweep():
                n = (job.checkpoint or {}).get("n") if isinstance(job.checkpoint, dict) else None
                hist.add("deliver", job=job.job_id, attempt=job.attempt, fence=job.fence,
                         checkpoint=n)  # fmt: skip
                if rng.random() < 0.25:
                    continue  # the handler failed: no ack, a later sweep delivers it again
                ok = await sw.ack(job)
                hist.add("ack", job=job.job_id, attempt=job.attempt, fence=job.fence, ok=ok)
        except (JobpulseError, redis.RedisError, OSError, TimeoutError) as exc:
            hist.add("sweep_error", error=repr(exc))


class _Jobs:
    """The jobs the workers started, learnt by following their history files."""

    def __init__(self, directory: str) -> None:
        self.dir = Path(directory)
        self.offsets: dict[Path, int] = {}
        self.jobs: list[str] = []

    def poll(self) -> None:
        for path in sorted(self.dir.glob("*worker*.jsonl")):
            with path.open("rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            end = data.rfind(b"\n") + 1
            self.offsets[path] = self.offsets.get(path, 0) + end
            for line in data[:end].splitlines():
                rec = json.loads(line)
                if rec["op"] == "acquire" and rec["job"] not in self.jobs:
                    self.jobs.append(rec["job"])


async def _read_loop(cfg: dict[str, Any], hist: History, name: str,
                     get: Callable[[str], Awaitable[Any]]) -> None:  # fmt: skip
    jobs = _Jobs(cfg["dir"])
    after_end: dict[str, int] = {}  # reads since a job was first read terminal
    unknown: dict[str, int] = {}  # UNKNOWN reads of a job
    print("ready", flush=True)
    while True:
        await asyncio.sleep(0.2)
        jobs.poll()
        for job in jobs.jobs:
            if after_end.get(job, 0) >= 3:
                continue
            t0 = time.monotonic()
            try:
                st = await get(job)
            except (JobpulseError, redis.RedisError, OSError, TimeoutError) as exc:
                hist.add("read_error", job=job, reader=name, error=repr(exc))
                continue
            state = st.state.name
            hist.add("read", job=job, reader=name, t0=t0, state=state, fence=st.fence or 0,
                     seq=st.seq or 0)  # fmt: skip
            if state in ("COMPLETED", "FAILED", "CANCELLED", "LOST") or job in after_end:
                after_end[job] = after_end.get(job, 0) + 1
            elif state == "UNKNOWN":  # gone with lost data: its worker may still bring it back
                unknown[job] = unknown.get(job, 0) + 1
                if unknown[job] >= 50:
                    after_end[job] = 3


async def async_reader(cfg: dict[str, Any], hist: History) -> None:
    reader = StatusReader(async_client(cfg["conn"]), namespace=cfg["ns"])
    await _read_loop(cfg, hist, "async", reader.get)


async def sync_reader(cfg: dict[str, Any], hist: History) -> None:
    client = sync_client(cfg["conn"], socket_timeout=cfg["ttl"] / 3)
    reader = jobpulse.sync.StatusReader(client, namespace=cfg["ns"])

    async def get(job: str) -> Any:
        return reader.get(job)  # blocking on purpose: this process does nothing else

    await _read_loop(cfg, hist, "sync", get)


def main(role: str, cfg: dict[str, Any]) -> None:
    hist = History(cfg["dir"], cfg["proc"])
    if role.endswith("worker"):
        _gil_hold(hist, cfg["gil"])
    if role == "sync-worker":
        sync_worker(cfg, hist)
        return
    run = {"async-worker": async_worker, "sweeper": sweeper, "async-reader": async_reader,
           "sync-reader": sync_reader}[role]  # fmt: skip
    asyncio.run(run(cfg, hist))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main(sys.argv[1], json.loads(sys.argv[2]))
