"""The HTTP app over real uvicorn on a free port, real Redis, httpx as the client.

JSON status with ETag / 304, the error statuses (400 / 403 / 404 / 503, short JSON bodies),
SSE framing, ``Last-Event-ID`` resume with no gap and no duplicate, the ``snapshot`` event of a
trimmed stream, keep-alive comments, a disconnect freeing its watcher at once, the job list,
and 200 concurrent SSE clients of one job each receiving every event.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
import redis.asyncio as aioredis
from starlette.requests import Request

from jobpulse import heartbeat
from jobpulse._protocol.codec import parse_stream_id
from jobpulse._protocol.keys import KeySchema
from jobpulse._provision import RedisServer
from tests.integration.http_server import ServerThread
from tests.support import eventually, spawn_worker, stop


@dataclass
class Frame:
    id: str | None = None
    event: str = "message"
    data: list[str] = field(default_factory=list)

    def json(self) -> Any:
        return orjson.loads("\n".join(self.data))


async def frames(
    response: httpx.Response, comments: list[str] | None = None
) -> AsyncIterator[Frame]:
    """Parse an SSE body as the HTML standard says (fields, comments, blank-line dispatch)."""
    current = Frame()
    async for line in response.aiter_lines():
        if line == "":
            if current.data:
                yield current
            current = Frame()
        elif line.startswith(":"):
            if comments is not None:
                comments.append(line[1:].strip())
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "id":
                current.id = value
            elif name == "event":
                current.event = value
            elif name == "data":
                current.data.append(value)


async def collect(
    client: httpx.AsyncClient, path: str, headers: dict[str, str] | None = None,
    limit: int | None = None,
) -> list[Frame]:  # fmt: skip
    """The frames of one SSE request, until the server closes it (or ``limit`` frames)."""
    out: list[Frame] = []
    async with client.stream("GET", path, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        async for frame in frames(response):
            out.append(frame)
            if limit is not None and len(out) >= limit:
                break
    return out


async def stream_ids(redis: aioredis.Redis, ns: str, job: str) -> list[str]:
    return [eid.decode() for eid, _ in await redis.xrange(KeySchema(ns).events(job))]


@pytest.fixture
def server(redis_url: str, ns: str) -> Iterator[ServerThread]:
    with ServerThread(redis_url, ns, keepalive=0.3) as srv:
        yield srv


@pytest.fixture
async def client(server: ServerThread) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as c:
        yield c


# -- JSON status ------------------------------------------------------------------------------


async def test_status_is_the_job_status_as_json(
    client: httpx.AsyncClient, redis: aioredis.Redis, ns: str
) -> None:
    async with heartbeat(redis, "etl/2024:part-1", namespace=ns, total=8, meta={"k": 1}) as hb:
        hb.set_stage("load")
        hb.progress.advance(2)
        await hb.checkpoint(row=2)
        r = await client.get("/jobs/etl/2024:part-1")
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/json"
        body = r.json()
        assert body["job_id"] == "etl/2024:part-1"
        assert body["state"] == "RUNNING"
        assert (body["done"], body["total"], body["percent"]) == (2, 8, 25.0)
        assert body["stage"] == "load"
        assert body["meta"] == {"k": 1}
        for name in ("rate", "eta", "rss_bytes", "cpu_seconds", "seq", "fence", "attempt",
                     "worker", "heartbeat_age", "progress_age", "error"):  # fmt: skip
            assert name in body
        # the same job through a percent-encoded id
        assert (await client.get("/jobs/etl%2F2024%3Apart-1")).json()["job_id"] == body["job_id"]

    async def completed() -> bool:
        return bool((await client.get("/jobs/etl/2024:part-1")).json()["state"] == "COMPLETED")

    await eventually(completed, within=10)  # once the reader's cache entry expired


async def test_etag_answers_304_until_the_snapshot_changes(
    redis_url: str, redis: aioredis.Redis, ns: str
) -> None:
    with ServerThread(redis_url, ns, reader_options={"cache_ttl": 0}) as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=30) as c:
            async with heartbeat(redis, "tagged", namespace=ns, total=10, interval=5, ttl=15):
                first = await c.get("/jobs/tagged")
                etag = first.headers["etag"]
                body = first.json()
                assert etag == f'W/"{body["fence"]}.{body["seq"]}.RUNNING"'
                assert first.headers["cache-control"] == "max-age=0, stale-while-revalidate=1"
                again = await c.get("/jobs/tagged", headers={"If-None-Match": etag})
                assert again.status_code == 304
                assert again.content == b""
                assert again.headers["etag"] == etag
                listed = await c.get("/jobs/tagged", headers={"If-None-Match": f'"x", {etag}'})
                assert listed.status_code == 304
                other = await c.get("/jobs/tagged", headers={"If-None-Match": 'W/"0.0.RUNNING"'})
                assert other.status_code == 200
            ended = await c.get("/jobs/tagged", headers={"If-None-Match": etag})
            assert ended.status_code == 200
            assert ended.headers["etag"] != etag
            assert ended.json()["state"] == "COMPLETED"


async def test_cache_control_matches_the_reader_ttl(
    redis_url: str, redis: aioredis.Redis, ns: str
) -> None:
    with ServerThread(redis_url, ns, reader_options={"cache_ttl": 3.0, "terminal_ttl": 20}) as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=30) as c:
            async with heartbeat(redis, "cc", namespace=ns):
                r = await c.get("/jobs/cc")
                assert r.headers["cache-control"] == "max-age=3, stale-while-revalidate=1"
            async with heartbeat(redis, "cc2", namespace=ns):
                pass
            r = await c.get("/jobs/cc2")
            assert r.headers["cache-control"] == "max-age=20, stale-while-revalidate=1"


async def test_errors_are_short_json(client: httpx.AsyncClient) -> None:
    cases = {
        "/jobs/no-such-job": 404,
        "/jobs/bad%20id": 400,
        "/jobs/" + "x" * 201: 400,
        "/jobs/%7Bbrace%7D": 400,
        "/jobs/bad%20id/events": 400,
        "/jobs/no-such-job/events": 404,
    }
    for path, code in cases.items():
        r = await client.get(path)
        assert r.status_code == code, path
        assert r.headers["content-type"] == "application/json"
        body = r.json()
        assert list(body) == ["error"]
        assert len(body["error"]) < 60
        assert "Traceback" not in r.text
        assert "redis" not in r.text.lower()


async def test_invalid_last_event_id_is_400(
    client: httpx.AsyncClient, redis: aioredis.Redis, ns: str
) -> None:
    async with heartbeat(redis, "j", namespace=ns):
        r = await client.get("/jobs/j/events", headers={"Last-Event-ID": "not-an-id"})
        assert r.status_code == 400
        assert r.json() == {"error": "invalid last event id"}


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_authorize_denied_is_403_and_hides_jobs(
    redis_url: str, redis: aioredis.Redis, ns: str, kind: str
) -> None:
    seen: list[str] = []

    def allow(request: Request, job_id: str) -> bool:
        seen.append(job_id)
        return request.headers.get("x-user") == "alice" or not job_id.startswith("secret")

    async def allow_async(request: Request, job_id: str) -> bool:
        await asyncio.sleep(0)
        return allow(request, job_id)

    authorize = allow if kind == "sync" else allow_async
    with ServerThread(redis_url, ns, authorize=authorize) as srv:
        async with (
            httpx.AsyncClient(base_url=srv.base_url, timeout=30) as c,
            heartbeat(redis, "secret-1", namespace=ns),
            heartbeat(redis, "public-1", namespace=ns),
        ):
            assert (await c.get("/jobs/secret-1")).status_code == 403
            assert (await c.get("/jobs/secret-1")).json() == {"error": "forbidden"}
            assert (await c.get("/jobs/secret-1/events")).status_code == 403
            assert (await c.get("/jobs/public-1")).status_code == 200
            ok = await c.get("/jobs/secret-1", headers={"x-user": "alice"})
            assert ok.status_code == 200
            listed = [j["job_id"] for j in (await c.get("/jobs")).json()["jobs"]]
            assert listed == ["public-1"]
    assert "secret-1" in seen


async def test_redis_outage_is_503_without_details(ns: str) -> None:
    with RedisServer() as private:
        client = aioredis.Redis.from_url(private.url)
        try:
            with ServerThread(private.url, ns, reader_options={"cache_ttl": 0}) as srv:
                async with (
                    httpx.AsyncClient(base_url=srv.base_url, timeout=30) as c,
                    heartbeat(client, "outage", namespace=ns),
                ):
                    assert (await c.get("/jobs/outage")).status_code == 200
                    private.stop()
                    for path in ("/jobs/outage", "/jobs/outage/events", "/jobs"):
                        r = await c.get(path)
                        assert r.status_code == 503, path
                        assert r.json() == {"error": "status store unavailable"}
                    private.start()
        finally:
            with contextlib.suppress(Exception):
                await client.aclose()


# -- SSE --------------------------------------------------------------------------------------


async def test_events_are_sse_frames_of_the_stream(
    client: httpx.AsyncClient, redis: aioredis.Redis, ns: str
) -> None:
    async with heartbeat(redis, "ev", namespace=ns, total=3) as hb:
        hb.set_stage("one")
        for i in range(3):
            hb.progress.advance()
            await hb.checkpoint(i=i)
        task = asyncio.create_task(collect(client, "/jobs/ev/events"))
        await asyncio.sleep(0)
    got = await asyncio.wait_for(task, 30)
    ids = await stream_ids(redis, ns, "ev")
    assert [f.id for f in got] == ids
    assert got[0].event == "start"
    assert got[-1].event == "end"
    assert [f.json()["details"] for f in got if f.event == "checkpoint"] == [
        {"i": 0},
        {"i": 1},
        {"i": 2},
    ]
    for f in got:
        data = f.json()
        assert data["id"] == f.id
        assert data["kind"] == f.event
        assert data["job_id"] == "ev"
    assert got[-1].json()["status"] == "COMPLETED"
    assert got[-1].json()["done"] == 3


async def test_last_event_id_resumes_with_no_gap_and_no_duplicate(
    client: httpx.AsyncClient, redis: aioredis.Redis, ns: str
) -> None:
    release = asyncio.Event()

    async def job() -> None:
        async with heartbeat(redis, "resume", namespace=ns, total=20) as hb:
            for i in range(10):
                hb.progress.advance()
                await hb.checkpoint(i=i)
            await release.wait()
            for i in range(10, 20):
                hb.progress.advance()
                await hb.checkpoint(i=i)

    worker = asyncio.create_task(job())
    try:
        await eventually(lambda: _has_entries(redis, ns, "resume", 11), within=30)
        first = await collect(client, "/jobs/resume/events", limit=6)  # then disconnect
        release.set()
        last = first[-1].id
        assert last is not None
        rest = await collect(client, "/jobs/resume/events", headers={"Last-Event-ID": last})
        await worker
    finally:
        release.set()
        await asyncio.gather(worker, return_exceptions=True)
    ids = await stream_ids(redis, ns, "resume")
    assert [f.id for f in first + rest] == ids  # every entry once, in order
    assert rest[-1].event == "end"
    # the query parameter of an EventSource reconnect works the same way
    mid = ids[len(ids) // 2]
    again = await collect(client, f"/jobs/resume/events?last_event_id={mid}")
    assert [f.id for f in again] == ids[ids.index(mid) + 1 :]


async def _has_entries(redis: aioredis.Redis, ns: str, job: str, n: int) -> bool:
    return bool(await redis.xlen(KeySchema(ns).events(job)) >= n)


async def test_resume_after_a_trimmed_id_starts_with_a_gap_snapshot(
    client: httpx.AsyncClient, redis: aioredis.Redis, ns: str
) -> None:
    async with heartbeat(redis, "trim", namespace=ns, total=400, maxlen=10) as hb:
        first_id = (await stream_ids(redis, ns, "trim"))[0]
        for i in range(400):  # MAXLEN ~ trims whole radix nodes (100 entries): write plenty
            hb.progress.advance()
            await hb.checkpoint(i=i)
        ids = await stream_ids(redis, ns, "trim")
        assert ids[0] != first_id, "the stream was not trimmed"
        got = await collect(
            client, "/jobs/trim/events", headers={"Last-Event-ID": first_id}, limit=len(ids) + 1
        )
    snapshot = got[0]
    assert snapshot.event == "snapshot"
    assert snapshot.id is None  # the client keeps its Last-Event-ID until the first real entry
    data = snapshot.json()
    assert data["gap"] is True
    assert data["state"] == "RUNNING"
    assert data["job_id"] == "trim"
    assert data["done"] >= 1
    assert [f.id for f in got[1:]] == ids  # then everything the stream still holds
    # an id that was not trimmed: no snapshot
    async with client.stream("GET", "/jobs/trim/events", headers={"Last-Event-ID": ids[0]}) as r:
        parser = frames(r)
        first = await anext(parser)
        await parser.aclose()
    assert first.event != "snapshot"
    assert first.id == ids[1]


async def test_keep_alive_frames_arrive_without_events(
    client: httpx.AsyncClient, redis: aioredis.Redis, ns: str
) -> None:
    comments: list[str] = []
    async with (
        heartbeat(redis, "idle2", namespace=ns, interval=5, ttl=15),
        client.stream("GET", "/jobs/idle2/events") as response,
    ):
        parser = frames(response, comments)
        assert (await anext(parser)).event == "start"
        reading = asyncio.create_task(anext(parser))
        await eventually(lambda: _true(comments.count("keep-alive") >= 2), within=20)
        assert not reading.done()  # no event was made up to fill the silence
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
            await reading
    assert comments.count("keep-alive") >= 2


async def _true(value: bool) -> bool:
    return value


async def test_disconnect_frees_the_watcher_at_once(
    redis_url: str, redis: aioredis.Redis, ns: str
) -> None:
    # keep-alive far away: only the disconnect itself can free the watcher in time
    with ServerThread(redis_url, ns, keepalive=300) as srv:
        async with heartbeat(redis, "gone", namespace=ns, interval=5, ttl=15):
            clients = [httpx.AsyncClient(base_url=srv.base_url, timeout=30) for _ in range(3)]
            streams, parsers = [], []  # keep the parsers: closing one closes its connection
            for c in clients:
                cm = c.stream("GET", "/jobs/gone/events")
                response = await cm.__aenter__()
                parsers.append(frames(response))
                assert (await anext(parsers[-1])).event == "start"
                streams.append(cm)
            await eventually(lambda: _equals(srv.watchers(), 3), within=30)
            await streams[0].__aexit__(None, None, None)
            await clients[0].aclose()
            await eventually(lambda: _equals(srv.watchers(), 2), within=30)
            for cm, c in zip(streams[1:], clients[1:], strict=True):
                await cm.__aexit__(None, None, None)
                await c.aclose()
            await eventually(lambda: _equals(srv.watchers(), 0), within=30)


async def _equals(value: Any, expected: int) -> bool:
    return bool(await value == expected)


async def test_stream_of_a_dead_worker_ends_with_stale(
    client: httpx.AsyncClient, redis_url: str, ns: str
) -> None:
    proc = spawn_worker(redis_url, ns, "doomed", ttl=1.0)
    try:
        async with client.stream("GET", "/jobs/doomed/events") as response:
            parser = frames(response)
            first = await anext(parser)
            assert first.event == "start"
            proc.send_signal(signal.SIGKILL)
            rest = [first, *[f async for f in parser]]
        # Issue 24 item 7: the verdict has a time and an id of its own, after the last entry,
        # and a client resuming from it gets no entry again, only the verdict again.
        stale = rest[-1]
        resumed = await collect(client, "/jobs/doomed/events", {"last-event-id": str(stale.id)})
    finally:
        stop(proc)
    assert stale.event == "stale"
    data = stale.json()
    assert (data["status"], data["synthetic"]) == ("STALE", True)
    real = [f for f in rest[:-1] if f.id is not None]
    assert real
    assert stale.id is not None
    assert stale.id != real[-1].id
    assert parse_stream_id(stale.id) > parse_stream_id(str(real[-1].id))
    assert isinstance(data["ts"], float)
    assert data["ts"] >= real[-1].json()["ts"] + 1.0  # one ttl after the last entry, at least
    assert [(f.event, f.json()["synthetic"]) for f in resumed] == [("stale", True)]
    assert parse_stream_id(str(resumed[0].id)) >= parse_stream_id(stale.id)


async def test_jobs_lists_running_and_stale_jobs(
    client: httpx.AsyncClient, redis: aioredis.Redis, redis_url: str, ns: str
) -> None:
    async with heartbeat(redis, "finished", namespace=ns):
        pass
    proc = spawn_worker(redis_url, ns, "dead", ttl=1.0)
    try:
        stop(proc)
        async with heartbeat(redis, "run-a", namespace=ns), heartbeat(redis, "run/b", namespace=ns):

            async def listed() -> dict[str, str] | None:
                r = await client.get("/jobs")
                assert r.status_code == 200
                jobs = {j["job_id"]: j["state"] for j in r.json()["jobs"]}
                return jobs if jobs.get("dead") == "STALE" else None

            jobs = await eventually(listed, within=30)
            assert jobs == {"dead": "STALE", "run-a": "RUNNING", "run/b": "RUNNING"}
    finally:
        stop(proc)


# -- many clients -----------------------------------------------------------------------------


async def test_200_sse_clients_of_one_job_all_receive_every_event(
    server: ServerThread, redis: aioredis.Redis, ns: str
) -> None:
    n_clients = 200
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120, limits=limits) as c:
        start = asyncio.Event()

        async def job() -> None:
            async with heartbeat(redis, "crowd", namespace=ns, total=30) as hb:
                await start.wait()
                for i in range(30):
                    hb.progress.advance()
                    await hb.checkpoint(i=i)
                    await asyncio.sleep(0.01)

        worker = asyncio.create_task(job())
        await eventually(lambda: _has_entries(redis, ns, "crowd", 1), within=30)
        readers = [asyncio.create_task(collect(c, "/jobs/crowd/events")) for _ in range(n_clients)]
        try:

            async def all_attached() -> bool:
                failed = [t for t in readers if t.done()]
                if failed:  # a client that could not connect: say why instead of timing out
                    failed[0].result()
                    raise AssertionError("an SSE client ended before the job started")
                return await server.watchers() == n_clients

            await eventually(all_attached, within=90, step=0.1)
            start.set()
            await worker
            results = await asyncio.wait_for(asyncio.gather(*readers), 100)
        finally:
            start.set()
            for t in readers:
                t.cancel()
            await asyncio.gather(worker, *readers, return_exceptions=True)
    ids = await stream_ids(redis, ns, "crowd")
    assert len(ids) >= 32
    for got in results:
        assert [f.id for f in got] == ids
    assert await server.watchers() == 0


async def test_events_without_last_event_id_follow_the_current_attempt_past_a_stale_entry(
    client: httpx.AsyncClient, redis: aioredis.Redis, redis_url: str, ns: str
) -> None:
    """Issue 12, item 2: attempt 1 died and was claimed (a ``stale`` entry); attempt 2 runs.
    An SSE client with no Last-Event-ID gets attempt 1's entries, then follows attempt 2 to
    its own ``end`` (it used to stop at the ``stale`` entry)."""
    from jobpulse import Sweeper

    stop(spawn_worker(redis_url, ns, "sse-again", 0.3))
    sweeper = Sweeper(redis, namespace=ns)
    await eventually(sweeper.sweep, within=10)
    async with heartbeat(redis, "sse-again", namespace=ns, interval=30, ttl=60) as hb:
        task = asyncio.create_task(collect(client, "/jobs/sse-again/events"))
        await eventually(lambda: _stream_has(redis, ns, "sse-again", hb.fence), within=10)
        await asyncio.sleep(0.2)
        assert not task.done()  # the stale entry of attempt 1 did not end the stream
        await hb.checkpoint(step=1)
    got = await asyncio.wait_for(task, 30)
    events = [(f.event, f.json()["attempt"]) for f in got if f.event != "beat"]
    assert events == [("start", 1), ("stale", 1), ("start", 2), ("checkpoint", None), ("end", 2)]
    assert got[-1].json()["fence"] == hb.fence


async def _stream_has(redis: aioredis.Redis, ns: str, job: str, fence: int) -> bool:
    entries = await redis.xrange(KeySchema(ns).events(job))
    return any(e[b"kind"] == b"start" and int(e[b"fence"]) == fence for _, e in entries)
