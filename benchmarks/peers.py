"""The peers: how SAQ, RQ and Celery record a running job's progress in Redis.

Installed only with the ``bench`` extra, pinned (see pyproject.toml). Each peer is driven through
its public calls, as its documentation shows for progress:

- SAQ: ``await job.update(progress=x)`` (reads the stored job, writes the whole job back,
  publishes a notification);
- RQ: ``job.meta["progress"] = x; job.save_meta()`` plus the heartbeat a worker sends for a
  running job (``Worker.maintain_heartbeats``: worker, execution and job heartbeats in one
  transaction). RQ sends that heartbeat every ``job_monitoring_interval`` rather than per update;
  one per update is what "progress + liveness" costs there;
- Celery: ``task.update_state(task_id=..., state="PROGRESS", meta={...})`` on the Redis result
  backend (Redis also as the broker; nothing beyond Redis is needed);
- BullMQ (Node, :mod:`benchmarks.bullmq`, full run only): ``job.updateProgress(x)`` plus
  ``job.extendLock(token, duration)``, measured server-side only (its client is not redis-py).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import threading
import uuid
from collections.abc import Callable
from typing import Any

from .common import Probe, UpdateCost

PINNED = {"saq": "saq==0.26.4", "rq": "rq==3.0.0", "celery": "celery[redis]==5.7.0"}

WHAT = {
    "SAQ": "GET job + SET whole job + PUBLISH; no lease, no fence, no liveness key",
    "RQ": "HSET meta + heartbeat transaction (worker, execution, registries); no fence",
    "Celery": "SET result + PUBLISH; no lease, no liveness",
    "BullMQ": "updateProgress script (EXISTS, HGET, HSET, XADD event) + extendLock script (GET, "
    "SET PX, SREM): two round trips; lock token checked, no fence",
}


def _have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# -- per-update cost (in this process, counted by benchmarks.common.UpdateCost) -------------


def saq_cost(url: str, probe: Probe, n: int, updates: int) -> dict[str, Any]:
    from saq import Queue

    async def go() -> dict[str, Any]:
        queue = Queue.from_url(url, name="bench")
        await queue.connect()
        jobs = [await queue.enqueue("work", timeout=0) for _ in range(n)]
        for job in jobs:
            assert job is not None
            await job.update(progress=0.0)
        with UpdateCost(probe) as cost:
            for i in range(updates):
                await jobs[i % n].update(progress=i / updates)  # type: ignore[union-attr]
        await queue.disconnect()
        return cost.per(updates)

    res = asyncio.run(go())
    res["what"] = WHAT["SAQ"]
    return res


def _rq_setup(url: str, n: int) -> tuple[Any, Any, list[Any], list[Any]]:
    from redis import Redis
    from rq import Queue, Worker
    from rq.executions import Execution

    conn = Redis.from_url(url)
    queue = Queue("bench", connection=conn)
    worker = Worker([queue], connection=conn, name=f"bench-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    worker.register_birth()
    jobs, executions = [], []
    for _ in range(n):
        job = queue.enqueue("builtins.len", "x")
        with conn.pipeline() as pipe:
            executions.append(
                Execution.create(job, ttl=600, pipeline=pipe, worker_name=worker.name)
            )
            pipe.execute()
        jobs.append(job)
    return conn, worker, jobs, executions


def rq_update(worker: Any, job: Any, execution: Any, value: float) -> None:
    job.meta["progress"] = value
    job.save_meta()
    worker.maintain_heartbeats(job, execution)


def rq_cost(url: str, probe: Probe, n: int, updates: int) -> dict[str, Any]:
    conn, worker, jobs, executions = _rq_setup(url, n)
    for i in range(n):
        rq_update(worker, jobs[i], executions[i], 0.0)
    with UpdateCost(probe) as cost:
        for i in range(updates):
            rq_update(worker, jobs[i % n], executions[i % n], i / updates)
    conn.close()
    res = cost.per(updates)
    res["what"] = WHAT["RQ"]
    return res


def _celery_task(url: str) -> Any:
    from celery import Celery

    app = Celery("bench", broker=url, backend=url)

    @app.task(bind=True, name="bench.work")  # type: ignore[untyped-decorator]
    def work(self: Any) -> None:  # never executed: only its update_state is used
        return None

    return work


def celery_cost(url: str, probe: Probe, n: int, updates: int) -> dict[str, Any]:
    work = _celery_task(url)
    ids = [uuid.uuid4().hex for _ in range(n)]
    for tid in ids:
        work.update_state(task_id=tid, state="PROGRESS", meta={"progress": 0.0})
    with UpdateCost(probe) as cost:
        for i in range(updates):
            work.update_state(task_id=ids[i % n], state="PROGRESS", meta={"progress": i / updates})
    res = cost.per(updates)
    res["what"] = WHAT["Celery"]
    return res


def bullmq_cost(url: str, probe: Probe, n: int, updates: int) -> dict[str, Any]:
    """Server side only: commandstats and net bytes of the Node process's calls."""
    from . import bullmq

    port = int(url.rsplit(":", 1)[1].split("/")[0])
    with bullmq.NodePeer(port, n) as peer:
        probe.reset()
        done = peer.ask(f"both {updates} 0")["updates"]
        snap = probe.snapshot()
    top = ("evalsha", "eval")
    calls = sum(snap["cmds"].get(c, (0, 0))[0] for c in top)
    return {
        "updates": done,
        "round_trips": calls / done,
        "commands": calls / done,
        "server_us": sum(snap["cmds"].get(c, (0, 0))[1] for c in top) / done,
        "bytes_in": snap["net_in"] / done,
        "bytes_out": snap["net_out"] / done,
        "inner_calls": sum(
            c for k, (c, _) in snap["cmds"].items() if k not in (*top, "config|resetstat")
        )
        / done,
        "what": WHAT["BullMQ"],
    }


def cost_functions(
    quick: bool = False,
) -> dict[str, tuple[Callable[..., dict[str, Any]] | None, str]]:
    """The per-update cost of each peer, or why it cannot run (BullMQ: full run only)."""
    out: dict[str, tuple[Callable[..., dict[str, Any]] | None, str]] = {}
    for name, module, fn in (("SAQ", "saq", saq_cost), ("RQ", "rq", rq_cost),
                             ("Celery", "celery", celery_cost)):  # fmt: skip
        if _have(module):
            out[name] = (fn, "")
        else:
            out[name] = (None, f"{PINNED[module]} is not installed (pip install -e '.[bench]')")
    out["BullMQ"] = (None, "full run only") if quick else (bullmq_cost, "")
    return out


# -- load designs for benchmarks.load (one process, N jobs) -------------------------------------


async def load_saq(url: str, n: int, interval: float, meter: Any, ready: asyncio.Event,
                   stop: asyncio.Event) -> None:  # fmt: skip
    """N asyncio tasks, one per job, each updating its job's progress."""
    from saq import Queue

    queue = Queue.from_url(url, name="bench")
    await queue.connect()
    jobs = []
    for first in range(0, n, 200):
        jobs += await asyncio.gather(
            *(queue.enqueue("work", timeout=0) for _ in range(first, min(n, first + 200)))
        )

    async def one(job: Any) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                await job.update(progress=i)
                meter.updates += 1
            except Exception:
                meter.errors += 1
            if interval > 0:
                await asyncio.sleep(interval)

    tasks = [asyncio.create_task(one(j)) for j in jobs]
    ready.set()
    await stop.wait()
    await asyncio.gather(*tasks, return_exceptions=True)
    await queue.disconnect()


def _sync_loop(update: Callable[[int], None], n: int, interval: float, meter: Any,
               halt: threading.Event) -> None:  # fmt: skip
    i = 0
    while not halt.is_set():
        try:
            update(i % n)
            meter.updates += 1
        except Exception:
            meter.errors += 1
        i += 1
        if interval > 0 and i % n == 0:
            halt.wait(interval)


async def _run_sync(update: Callable[[int], None], n: int, interval: float, meter: Any,
                    ready: asyncio.Event, stop: asyncio.Event) -> None:  # fmt: skip
    """A sync client updates its N jobs in turn from one thread (the loop stays free for the
    harness); RQ and Celery run one job per process or thread, so this is their best case for
    many jobs from one process."""
    halt = threading.Event()
    worker = asyncio.create_task(asyncio.to_thread(_sync_loop, update, n, interval, meter, halt))
    ready.set()
    await stop.wait()
    halt.set()
    await worker


async def load_rq(url: str, n: int, interval: float, meter: Any, ready: asyncio.Event,
                  stop: asyncio.Event) -> None:  # fmt: skip
    conn, worker, jobs, executions = await asyncio.to_thread(_rq_setup, url, n)

    def update(i: int) -> None:
        rq_update(worker, jobs[i], executions[i], float(i))

    await _run_sync(update, n, interval, meter, ready, stop)
    conn.close()


async def load_celery(url: str, n: int, interval: float, meter: Any, ready: asyncio.Event,
                      stop: asyncio.Event) -> None:  # fmt: skip
    work = _celery_task(url)
    ids = [uuid.uuid4().hex for _ in range(n)]

    def update(i: int) -> None:
        work.update_state(task_id=ids[i], state="PROGRESS", meta={"progress": i})

    await _run_sync(update, n, interval, meter, ready, stop)


def load_functions() -> dict[str, Any]:
    out: dict[str, Any] = {}
    if _have("saq"):
        out["saq"] = load_saq
    if _have("rq"):
        out["rq"] = load_rq
    if _have("celery"):
        out["celery"] = load_celery
    return out
