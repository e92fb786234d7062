"""A server that refuses ``XREAD … BLOCK`` (Upstash serves only non-blocking XREAD): watch(),
wait() and SSE keep working by polling. The refusal comes from a real server behind the fault
proxy (``refuse_blocking_reads``), so every other command is the real server's answer."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from jobpulse import Event, JobState, StatusReader, heartbeat
from jobpulse._protocol.errors import error_code, refuses_blocking
from jobpulse._protocol.keys import KeySchema

from ..integration.http_server import ServerThread
from ..integration.test_http import collect as collect_sse
from ..support import eventually
from .conftest import Proxied

STEPS = 4


@pytest.fixture
def refusing(proxied: Proxied) -> Proxied:
    proxied.proxy.refuse_blocking_reads = True
    return proxied


async def stream_ids(redis: aioredis.Redis, ns: str, job: str) -> list[str]:
    return [eid.decode() for eid, _ in await redis.xrange(KeySchema(ns).events(job))]


async def gated_job(redis: aioredis.Redis, ns: str, job: str, go: asyncio.Event) -> None:
    """A checkpoint, then (once ``go`` is set: a watcher is following live) STEPS more."""
    async with heartbeat(redis, job, namespace=ns, interval=0.05, total=STEPS) as hb:
        await hb.checkpoint(step="first")
        await go.wait()
        for i in range(STEPS):
            hb.progress.advance()
            await hb.checkpoint(step=i)


async def refused_once(proxied: Proxied) -> bool:
    return proxied.proxy.refused >= 1


async def test_the_proxy_refuses_only_blocking_reads_with_an_err_reply(
    refusing: Proxied,
) -> None:
    via = refusing.via_proxy
    await via.xadd("s", {"a": "1"})
    with pytest.raises(ResponseError) as caught:
        await via.xread({"s": "0-0"}, block=100)
    assert error_code(caught.value) == "ERR"
    assert refuses_blocking(caught.value)
    assert len((await via.xread({"s": "0-0"}))[0][1]) == 1  # non-blocking: served
    async with via.pipeline(transaction=False) as pipe:  # the error keeps its place
        pipe.get("missing").xread({"s": "0-0"}, block=100).set("k", "v")
        replies = await pipe.execute(raise_on_error=False)
    assert replies[0] is None
    assert refuses_blocking(replies[1])
    assert replies[2] is True
    assert refusing.proxy.refused == 2


async def test_watch_polls_after_the_refusal_and_sees_every_event(
    refusing: Proxied, ns: str
) -> None:
    """After the refusal, a running job's entries reach the watcher by polling XREAD. The job
    stays RUNNING until the watcher has seen its step 0, so that entry cannot come from the
    loop's liveness check (which reads the rest of a stream only once the job has ended)."""
    go, seen_live = asyncio.Event(), asyncio.Event()

    async def job() -> None:
        async with heartbeat(refusing.direct, "w", namespace=ns, interval=0.05) as hb:
            await hb.checkpoint(step="first")
            await go.wait()
            await hb.checkpoint(step=0)
            await seen_live.wait()  # still RUNNING: only a poll can deliver step 0
            for i in range(1, STEPS):
                hb.progress.advance()
                await hb.checkpoint(step=i)

    task = asyncio.create_task(job())
    async with StatusReader(refusing.via_proxy, namespace=ns, liveness_interval=0.2) as reader:
        await eventually(lambda: refusing.direct.exists(KeySchema(ns).events("w")))

        async def watch() -> list[Event]:
            out: list[Event] = []
            async for event in reader.watch("w"):
                out.append(event)
                if event.details == {"step": 0}:
                    seen_live.set()
            return out

        watching = asyncio.create_task(watch())
        await eventually(lambda: refused_once(refusing))  # the live loop tried to block
        go.set()
        events = await asyncio.wait_for(watching, 30)
        await task
        stats = reader.statistics().watch
    assert [e.id for e in events] == await stream_ids(refusing.direct, ns, "w")
    assert [e.details for e in events if e.kind == "checkpoint"] == [
        {"step": "first"},
        *({"step": i} for i in range(STEPS)),
    ]
    assert events[-1].kind == "end"
    assert not events[-1].synthetic  # the real end entry
    assert events[-1].status == "COMPLETED"
    assert refusing.proxy.refused == 1  # refused once, then never asked to block again
    assert stats.xreads > 1  # the refused one, then the polls that delivered step 0 live


async def test_wait_returns_the_final_state_without_blocking_reads(
    refusing: Proxied, ns: str
) -> None:
    go = asyncio.Event()
    task = asyncio.create_task(gated_job(refusing.direct, ns, "v", go))
    async with StatusReader(refusing.via_proxy, namespace=ns, cache_ttl=0) as reader:
        await eventually(lambda: refusing.direct.exists(KeySchema(ns).state("v")))
        waiting = asyncio.create_task(reader.wait("v", timeout=30))
        await eventually(lambda: refused_once(refusing))  # wait() follows the stream
        go.set()
        status = await waiting
        await task
    assert status.state is JobState.COMPLETED
    assert status.done == STEPS
    assert refusing.proxy.refused == 1


async def test_sse_streams_every_event_without_blocking_reads(refusing: Proxied, ns: str) -> None:
    go = asyncio.Event()
    task = asyncio.create_task(gated_job(refusing.direct, ns, "e", go))
    with ServerThread(refusing.proxy.url, ns, keepalive=0.3) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            await eventually(lambda: refusing.direct.exists(KeySchema(ns).events("e")))
            streaming = asyncio.create_task(collect_sse(client, "/jobs/e/events"))
            await eventually(lambda: refused_once(refusing))
            go.set()
            frames = await asyncio.wait_for(streaming, 30)
            await task
    assert [f.id for f in frames] == await stream_ids(refusing.direct, ns, "e")
    assert frames[-1].event == "end"
    assert frames[-1].json()["status"] == "COMPLETED"
    assert refusing.proxy.refused == 1
