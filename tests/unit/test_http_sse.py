"""SSE framing and the ``EventStream`` response, driven through the ASGI interface (no Redis)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from jobpulse._reader.status import JobState, JobStatus
from jobpulse.http.app import _matches, etag_of
from jobpulse.http.sse import EventStream, encode_comment, encode_event


def test_an_event_is_id_event_and_one_data_line_per_line() -> None:
    frame = encode_event('{"a": 1}\nsecond\r\nthird', event="beat", id="17-0")
    assert frame == b'id: 17-0\nevent: beat\ndata: {"a": 1}\ndata: second\ndata: third\n\n'
    assert encode_event("x") == b"data: x\n\n"


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\x00b"])
def test_a_line_break_in_id_or_event_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="id"):
        encode_event("x", id=bad)
    with pytest.raises(ValueError, match="event name"):
        encode_event("x", event=bad)


def test_a_comment_never_spills_into_a_field() -> None:
    assert encode_comment("keep-alive") == b": keep-alive\n\n"
    assert encode_comment("a\nb") == b": a\n: b\n\n"


def test_etag_names_fence_seq_and_state_and_matches_weakly() -> None:
    running = JobStatus(job_id="j", state=JobState.RUNNING, fence=2, seq=9)
    stale = JobStatus(job_id="j", state=JobState.STALE, fence=2, seq=9)
    assert etag_of(running) == 'W/"2.9.RUNNING"'
    assert etag_of(stale) != etag_of(running)
    assert _matches('W/"2.9.RUNNING"', etag_of(running))
    assert _matches('"2.9.RUNNING"', etag_of(running))
    assert _matches('"x", W/"2.9.RUNNING"', etag_of(running))
    assert _matches("*", etag_of(running))
    assert not _matches('W/"2.8.RUNNING"', etag_of(running))


class _Client:
    """The server side of one ASGI connection: what was sent, and a disconnect to trigger."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.gone = asyncio.Event()
        self.wrote = asyncio.Event()
        self.requested = False

    async def receive(self) -> dict[str, Any]:
        if not self.requested:
            self.requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        self.wrote.set()

    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")


async def test_frames_then_end_of_response() -> None:
    async def frames() -> AsyncIterator[bytes]:
        yield encode_event("1", id="1-0")
        yield encode_event("2", id="2-0")

    client = _Client()
    await EventStream(frames(), keepalive=60, retry=1500)(
        {"type": "http"}, client.receive, client.send
    )
    start = client.sent[0]
    assert start["status"] == 200
    assert (b"content-type", b"text/event-stream; charset=utf-8") in start["headers"]
    assert (b"cache-control", b"no-store") in start["headers"]
    assert (
        client.body() == b"retry: 1500\n\n: connected\n\nid: 1-0\ndata: 1\n\nid: 2-0\ndata: 2\n\n"
    )
    assert client.sent[-1]["more_body"] is False


async def test_keep_alive_while_the_source_is_idle() -> None:
    release = asyncio.Event()

    async def frames() -> AsyncIterator[bytes]:
        yield encode_event("first")
        await release.wait()
        yield encode_event("last")

    client = _Client()
    stream = asyncio.create_task(
        EventStream(frames(), keepalive=0.05)({"type": "http"}, client.receive, client.send)
    )
    while client.body().count(b": keep-alive\n\n") < 2:
        client.wrote.clear()
        await client.wrote.wait()
    release.set()
    await stream
    body = client.body()
    assert body.index(b"data: first") < body.index(b": keep-alive") < body.index(b"data: last")


async def test_a_disconnect_closes_the_source_at_once() -> None:
    closed = asyncio.Event()

    async def frames() -> AsyncIterator[bytes]:
        try:
            yield encode_event("only")
            await asyncio.Event().wait()  # nothing more, ever
            yield b""  # pragma: no cover
        finally:
            closed.set()

    client = _Client()
    stream = asyncio.create_task(
        EventStream(frames(), keepalive=3600)({"type": "http"}, client.receive, client.send)
    )
    while b"data: only" not in client.body():
        client.wrote.clear()
        await client.wrote.wait()
    client.gone.set()
    await asyncio.wait_for(stream, 10)
    assert closed.is_set()


def test_keepalive_must_be_positive() -> None:
    async def frames() -> AsyncIterator[bytes]:
        yield b""  # pragma: no cover

    with pytest.raises(ValueError, match="keepalive"):
        EventStream(frames(), keepalive=0)


async def test_without_until_the_stream_waits_on_nothing_that_never_happens() -> None:
    """Issue 24 item 8a: without ``until`` no drain waiter runs (it awaited a future that never
    completes); the stream's tasks are its pump, its disconnect listener and its keep-alive."""
    release = asyncio.Event()

    async def frames() -> AsyncIterator[bytes]:
        yield encode_event("first")
        await release.wait()

    client = _Client()
    before = asyncio.all_tasks()
    stream = asyncio.create_task(
        EventStream(frames(), keepalive=3600)({"type": "http"}, client.receive, client.send)
    )
    while b"data: first" not in client.body():
        client.wrote.clear()
        await client.wrote.wait()
    started = asyncio.all_tasks() - before - {stream}
    names = sorted(task.get_coro().__qualname__ for task in started)  # type: ignore[union-attr]
    release.set()
    await asyncio.wait_for(stream, 10)
    assert names == ["EventStream._keepalive", "EventStream._listen", "EventStream._pump"]
    assert client.sent[-1]["more_body"] is False
