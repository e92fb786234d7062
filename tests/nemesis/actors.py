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
* ``watch-reader``: follows every job the workers started with :meth:`StatusReader.watch` (one
  watch per job, resumed after its last event id when it fails, and again after a synthetic
  ``stale``: a stopped worker may come back) and records each event it yields as an ``event``
  (job, reader ``watch``, kind, id, state: the entry's ``status``, fence and seq: the entry's own
  ``fence`` and ``seq`` fields, which every entry carries from the snapshot it was written with;
  a synthetic event carries none: it is recorded with the last real entry's pair).
* ``http-reader``: serves :func:`jobpulse.http.create_app` with uvicorn on a free port of its
  own, and polls it with httpx: reader ``etag``, a plain ``GET /jobs/{id}`` of every job every
  0.2 s with ``If-None-Match`` (a 304 is recorded as the version it held); reader ``longpoll``,
  one task per job of ``GET /jobs/{id}?wait=2`` with ``If-None-Match`` (``given``: the version
  it held). A version is the ``(fence, seq)`` of a 200's body; a 404 reads UNKNOWN, a 503
  (Redis unreachable) is a ``read_error``; any other answer (a 500: the app's defect) ends the
  process, which the run's ``actor-alive`` rule names.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
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


_STALE_AGAIN = 30  # a watch ended by a synthetic stale is resumed this many times at most


async def watch_reader(cfg: dict[str, Any], hist: History) -> None:
    reader = StatusReader(async_client(cfg["conn"]), namespace=cfg["ns"])
    jobs = _Jobs(cfg["dir"])
    tasks: dict[str, asyncio.Task[None]] = {}
    print("ready", flush=True)
    while True:
        await asyncio.sleep(0.2)
        jobs.poll()
        for job in jobs.jobs:
            if job not in tasks:
                tasks[job] = asyncio.create_task(_follow(reader, hist, job))
        _raise_failed(tasks)


def _raise_failed(tasks: dict[str, asyncio.Task[None]]) -> None:
    """Re-raise what a per-job task died of (not a Redis or HTTP fault: those it records): the
    process then exits on its own, and the run's ``actor-alive`` rule names it."""
    for task in tasks.values():
        if task.done() and task.exception() is not None:
            raise RuntimeError("a reader's task failed") from task.exception()


async def _follow(reader: StatusReader, hist: History, job: str) -> None:
    """Watch ``job`` to its end; a failed watch resumes after the last event id it yielded."""
    last: str | None = None
    version = (0, 0)  # the (fence, seq) of the last real entry yielded
    stale = 0
    while stale < _STALE_AGAIN:
        t0 = time.monotonic()
        synthetic = False
        try:
            async with reader.watch(job, last_event_id=last) as events:
                async for ev in events:
                    if not ev.synthetic:
                        version = (ev.fence or 0, ev.seq or 0)
                    hist.add("event", job=job, reader="watch", t0=t0, kind=ev.kind, id=ev.id,
                             state=ev.status, fence=version[0], seq=version[1],
                             synthetic=ev.synthetic)  # fmt: skip
                    last, synthetic, t0 = ev.id, ev.synthetic, time.monotonic()
        except (JobpulseError, redis.RedisError, OSError, TimeoutError) as exc:
            hist.add("read_error", job=job, reader="watch", error=repr(exc))
            await asyncio.sleep(0.5)
            continue
        if not synthetic:
            return  # the job's last attempt ended (end, or a sweeper's stale entry)
        stale += 1  # nobody claimed it yet; a stopped worker may beat again
        await asyncio.sleep(0.5)


def _version(response: httpx.Response) -> tuple[str, int, int]:
    """The (state, fence, seq) of a 200's body."""
    body = response.json()
    return body["state"], body["fence"] or 0, body["seq"] or 0


async def http_reader(cfg: dict[str, Any], hist: History) -> None:
    import uvicorn  # the http extra: only this role needs it

    from jobpulse.http import create_app

    reader = StatusReader(async_client(cfg["conn"]), namespace=cfg["ns"])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(reader), log_level="warning",
                                           access_log=False, lifespan="off"))  # fmt: skip
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if serving.done():  # it could not start: the harness reads no "ready"
            await serving
            raise RuntimeError("uvicorn did not start")
        await asyncio.sleep(0.05)
    base = f"http://127.0.0.1:{sock.getsockname()[1]}/jobs/"
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=base, timeout=10.0, limits=limits) as client:
        jobs = _Jobs(cfg["dir"])
        polls: dict[str, asyncio.Task[None]] = {}
        held: dict[str, tuple[str, str, int, int]] = {}  # job -> etag, state, fence, seq
        ended: dict[str, int] = {}  # reads since a job was first read terminal
        unknown: dict[str, int] = {}
        print("ready", flush=True)
        while not serving.done():
            await asyncio.sleep(0.2)
            jobs.poll()
            for job in jobs.jobs:
                if job not in polls:
                    polls[job] = asyncio.create_task(_long_polls(client, hist, job))
            _raise_failed(polls)
            for job in jobs.jobs:
                if ended.get(job, 0) >= 3 or unknown.get(job, 0) >= 50:
                    continue
                state = await _http_read(client, hist, job, "etag", held, None)
                if state in TERMINAL_STATES or job in ended:
                    ended[job] = ended.get(job, 0) + 1
                elif state == "UNKNOWN":
                    unknown[job] = unknown.get(job, 0) + 1
    await serving  # uvicorn stopped on its own: a crash the harness sees (actor-alive)


TERMINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "LOST"})


async def _http_read(client: httpx.AsyncClient, hist: History, job: str, kind: str,
                     held: dict[str, tuple[str, str, int, int]],
                     wait: float | None) -> str | None:  # fmt: skip
    """One GET of ``job`` with If-None-Match (the version ``held``), recorded as a read of
    reader ``kind``; returns the state read (None: the request failed)."""
    mine = held.get(job)
    headers = {} if mine is None else {"if-none-match": mine[0]}
    params = {} if wait is None else {"wait": str(wait)}
    given = {} if mine is None else {"given": [mine[2], mine[3]]}
    t0 = time.monotonic()
    try:
        response = await client.get(job, headers=headers, params=params)
    except httpx.HTTPError as exc:
        hist.add("read_error", job=job, reader=kind, error=repr(exc))
        return None
    if response.status_code == 304 and mine is not None:
        state, fence, seq = mine[1], mine[2], mine[3]
    elif response.status_code == 200:
        state, fence, seq = _version(response)
        held[job] = (response.headers["etag"], state, fence, seq)
    elif response.status_code == 404:
        state, fence, seq = "UNKNOWN", 0, 0
    else:  # 503: Redis unreachable; anything else is the app's defect
        error = f"HTTP {response.status_code}: {response.text[:200]}"
        hist.add("read_error", job=job, reader=kind, error=error)
        if response.status_code != 503:  # the process ends: actor-alive names it
            raise RuntimeError(f"GET /jobs/{job} ({kind}) answered {error}")
        return None
    hist.add("read", job=job, reader=kind, t0=t0, state=state, fence=fence, seq=seq,
             http=response.status_code, **given)  # fmt: skip
    return state


async def _long_polls(client: httpx.AsyncClient, hist: History, job: str) -> None:
    """Long polls of ``job`` (``?wait=2``, If-None-Match: the version held) until it has been
    read terminal 3 times (or UNKNOWN 50 times)."""
    held: dict[str, tuple[str, str, int, int]] = {}
    ended, unknown = 0, 0
    while ended < 3 and unknown < 50:
        state = await _http_read(client, hist, job, "longpoll", held, 2.0)
        if state is None or state == "UNKNOWN":
            unknown += state == "UNKNOWN"
            await asyncio.sleep(0.2)
        elif state in TERMINAL_STATES:
            ended += 1
            await asyncio.sleep(0.2)


def main(role: str, cfg: dict[str, Any]) -> None:
    hist = History(cfg["dir"], cfg["proc"])
    if role.endswith("worker"):
        _gil_hold(hist, cfg["gil"])
    if role == "sync-worker":
        sync_worker(cfg, hist)
        return
    run = {"async-worker": async_worker, "sweeper": sweeper, "async-reader": async_reader,
           "sync-reader": sync_reader, "watch-reader": watch_reader,
           "http-reader": http_reader}[role]  # fmt: skip
    asyncio.run(run(cfg, hist))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main(sys.argv[1], json.loads(sys.argv[2]))
