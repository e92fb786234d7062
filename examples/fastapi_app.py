"""A FastAPI service: POST starts a CPU-heavy job in a process pool and answers 202 Accepted;
GET follows it (JSON with Retry-After, a long poll, or Server-Sent Events).

    pip install ".[http]" fastapi                              # in the jobpulse checkout
    python examples/fastapi_app.py [--redis URL] [--port 8000]   # from the checkout's root

    curl -i -X POST 'localhost:8000/reports?items=3000'      # 202, Location: /jobpulse/jobs/<id>
    curl -i localhost:8000/jobpulse/jobs/<job_id>             # JSON status, ETag, Retry-After
    curl -i -H 'If-None-Match: <etag>' 'localhost:8000/jobpulse/jobs/<job_id>?wait=30'
                                                              # long poll: 200 on a change, or 304
    curl -N localhost:8000/jobpulse/jobs/<job_id>/events      # Server-Sent Events, live
    open http://localhost:8000/jobpulse/                      # the dashboard

The jobpulse app is mounted in one line (``app.mount("/jobpulse", create_app(reader))``); the
POST returns ``accepted(request, job_id, mount="/jobpulse")`` once the job's lease is held, so
the ``Location`` answers at once. The job runs under ``jobpulse.heartbeat`` in the server
process while the hashing itself runs in a ``ProcessPoolExecutor``, reporting through the
shared-memory ``ProgressCell``. Another Python service waits on it with
``await jobpulse.http.poll(url)``. Uses the Redis at ``--redis``, else ``REDIS_URL``, else
``redis://localhost:6379/0`` (``redis-server`` or ``docker run -p 6379:6379 redis:7`` starts one).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import multiprocessing
import os
import secrets
from collections.abc import AsyncIterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import asynccontextmanager

import redis.asyncio as aioredis
import uvicorn
from fastapi import FastAPI, Query, Request
from fastapi.responses import Response

from jobpulse import ProgressCell, StatusReader, heartbeat
from jobpulse.http import accepted, create_app


def crunch(cell: ProgressCell, items: int) -> str:
    """The heavy part, in a pool process: progress goes through shared memory, no I/O."""
    digest = b"report"
    for _ in range(items):
        cell.check()  # stops promptly when the job is cancelled or its lease is lost
        for _ in range(3000):
            digest = hashlib.sha256(digest).digest()
        cell.advance()
    return digest.hex()[:16]


async def run_job(app: FastAPI, job_id: str, items: int, started: asyncio.Future[None]) -> None:
    try:
        async with heartbeat(app.state.redis, job_id, total=items, meta={"items": items}) as hb:
            started.set_result(None)  # the lease is held: GET /jobpulse/jobs/{id} answers now
            hb.set_stage("hashing")
            loop = asyncio.get_running_loop()
            result = await loop.run_in_executor(app.state.pool, crunch, hb.progress, items)
            await hb.checkpoint(result=result)
    except BaseException as exc:
        if not started.done():
            started.set_exception(exc)
        if not isinstance(exc, Exception):
            raise


def build(redis_url: str) -> FastAPI:
    redis = aioredis.Redis.from_url(redis_url)
    reader = StatusReader(redis)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"))
        app.state.jobs = set()
        yield
        for task in app.state.jobs:
            task.cancel()
        await asyncio.gather(*app.state.jobs, return_exceptions=True)
        app.state.pool.shutdown(cancel_futures=True)
        await reader.aclose()
        await redis.aclose()

    app = FastAPI(title="jobpulse example", lifespan=lifespan)
    app.state.redis = redis
    app.mount("/jobpulse", create_app(reader))  # status, events and the dashboard: one line

    @app.post("/reports", status_code=202)
    async def start_report(
        request: Request, items: int = Query(2000, ge=1, le=100_000)
    ) -> Response:
        job_id = f"report-{secrets.token_hex(4)}"
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(run_job(app, job_id, items, started))
        app.state.jobs.add(task)
        task.add_done_callback(app.state.jobs.discard)
        await started
        # 202 Accepted: Location is the status URL (behind any --root-path), Retry-After 1.
        return accepted(request, job_id, mount="/jobpulse")

    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    print(f"open http://{args.host}:{args.port}/jobpulse/ (the dashboard)", flush=True)
    uvicorn.run(build(args.redis), host=args.host, port=args.port)
