"""Server-Sent Events: the wire framing and an ASGI response that streams it.

Framing follows the HTML standard's ``text/event-stream``: a message is ``id:``, ``event:``
and one ``data:`` line per line of the payload, ended by a blank line; a line starting with
``:`` is a comment, which clients ignore and proxies see as traffic (keep-alive).

:class:`EventStream` sends the frames of an async iterator and, while the iterator has nothing
to give for ``keepalive`` seconds, a ``: keep-alive`` comment. It listens for the client's
disconnect at the same time, so a client that goes away stops the iterator at once (its
``finally`` blocks run, releasing whatever it holds) instead of at the next write. When the
server drains (``until`` is set: ``jobpulse serve`` received SIGTERM), the stream ends cleanly;
the client reconnects after ``retry`` with its ``Last-Event-ID`` and misses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Mapping

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

__all__ = ["EventStream", "encode_comment", "encode_event"]

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_FIELD_BAD = re.compile(r"[\r\n\x00]")

KEEPALIVE_FRAME = b": keep-alive\n\n"


def encode_event(data: str, *, event: str | None = None, id: str | None = None) -> bytes:
    """One SSE message.

    Args:
        data: the payload; each of its lines becomes one ``data:`` line.
        event: the ``event:`` name (the client's listener name), or None for ``message``.
        id: the ``id:`` (what the client sends back as ``Last-Event-ID``), or None to keep the
            client's last one.

    Returns:
        The message as UTF-8 bytes, ending with a blank line.

    Raises:
        ValueError: ``event`` or ``id`` holds a line break or NUL (it would split the frame).
    """
    parts: list[str] = []
    if id is not None:
        if _FIELD_BAD.search(id):
            raise ValueError(f"an SSE id may not hold a line break or NUL: {id!r}")
        parts.append(f"id: {id}\n")
    if event is not None:
        if _FIELD_BAD.search(event):
            raise ValueError(f"an SSE event name may not hold a line break or NUL: {event!r}")
        parts.append(f"event: {event}\n")
    parts.extend(f"data: {line}\n" for line in _LINE_BREAK.split(data))
    parts.append("\n")
    return "".join(parts).encode()


def encode_comment(text: str) -> bytes:
    """A comment frame (``: text``), ignored by clients; line breaks become separate comments."""
    return "".join(f": {line}\n" for line in _LINE_BREAK.split(text)).encode() + b"\n"


class EventStream(Response):
    """A response streaming SSE frames, with keep-alive and immediate disconnect handling.

    Args:
        frames: the encoded messages to send, in order; the stream ends when it does. An async
            generator is closed (its ``finally`` runs) when the client disconnects.
        keepalive: seconds of silence after which a ``: keep-alive`` comment is sent.
        retry: the reconnection delay to suggest to the client, in ms (None: leave the client's).
        headers: extra response headers.
        until: the stream ends (cleanly, as if the source had ended) once this event is set.
    """

    media_type = "text/event-stream; charset=utf-8"

    def __init__(
        self,
        frames: AsyncIterator[bytes],
        *,
        keepalive: float,
        retry: int | None = None,
        headers: Mapping[str, str] | None = None,
        until: asyncio.Event | None = None,
    ) -> None:
        if not keepalive > 0:
            raise ValueError(f"keepalive must be > 0, got {keepalive!r}")
        super().__init__(status_code=200, media_type=self.media_type)
        self.frames = frames
        self.keepalive = keepalive
        self.retry = retry
        self.extra_headers = dict(headers or {})
        self.until = until

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {
            "content-type": self.media_type,
            "cache-control": "no-store",
            "x-accel-buffering": "no",  # nginx: do not buffer the stream
            **self.extra_headers,
        }
        state = _Writer(send)
        pump = asyncio.ensure_future(self._pump(state))
        listen = asyncio.ensure_future(self._listen(receive))
        keepalive = asyncio.ensure_future(self._keepalive(state))
        ends = {pump, listen}
        if self.until is not None:  # else nothing ends the stream but its source or its client
            ends.add(asyncio.ensure_future(self._drained(self.until, state)))
        tasks = (keepalive, *ends)
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
                }
            )
            await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            # Shielded so that a cancelled request still closes the frame source (releasing
            # what it holds, e.g. a watcher) before this returns.
            await asyncio.shield(self._settle(tasks))
        if pump.done() and not pump.cancelled():
            pump.result()  # a bug in the frame source propagates to the server's error handler

    async def _settle(self, tasks: tuple[asyncio.Future[None], ...]) -> None:
        await asyncio.wait(tasks)
        aclose = getattr(self.frames, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()

    @staticmethod
    async def _drained(until: asyncio.Event, out: _Writer) -> None:
        """Return once the server drains (``until`` is set), after ending the response."""
        await until.wait()
        with contextlib.suppress(OSError):
            await out.end()

    async def _listen(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return

    async def _pump(self, out: _Writer) -> None:
        try:
            first = b": connected\n\n"
            if self.retry is not None:
                first = f"retry: {int(self.retry)}\n\n".encode() + first
            await out.write(first)
            # An async generator cancelled here (the client went away) runs its finally blocks
            # at the await it was suspended in: that is what releases its watcher at once.
            async for frame in self.frames:
                await out.write(frame)
            await out.end()
        except OSError:
            return  # the client went away mid-write (ASGI 2.4 servers raise on send)

    async def _keepalive(self, out: _Writer) -> None:
        loop = asyncio.get_running_loop()
        while True:
            idle = loop.time() - out.last
            if idle < self.keepalive:
                await asyncio.sleep(self.keepalive - idle)
                continue
            try:
                await out.write(KEEPALIVE_FRAME)
            except OSError:
                return


class _Writer:
    """Serialises the writes of the pump, the keep-alive and the drain on one response; once
    the response has ended, further writes are dropped (the drain may end it under the pump)."""

    __slots__ = ("ended", "last", "lock", "loop", "send")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.lock = asyncio.Lock()
        self.loop = asyncio.get_running_loop()
        self.last = self.loop.time()
        self.ended = False

    async def write(self, body: bytes) -> None:
        async with self.lock:
            if self.ended:
                return
            await self.send({"type": "http.response.body", "body": body, "more_body": True})
            self.last = self.loop.time()

    async def end(self) -> None:
        async with self.lock:
            if self.ended:
                return
            self.ended = True
            await self.send({"type": "http.response.body", "body": b"", "more_body": False})
