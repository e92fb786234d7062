"""One XREAD loop: one dedicated connection following the watched streams of one server.

See ``watch.py`` for how watchers join without a gap or a duplicate, the liveness check and
overflow; see ``routing.py`` for how streams are spread over the loops of a cluster.

Servers without blocking reads (Upstash serves only non-blocking XREAD): when the server answers
``XREAD … BLOCK`` with an error that says it will not serve it (:func:`refuses_blocking`: an
``ERR`` reply, never WRONGTYPE, NOPERM or a transient READONLY/LOADING/MOVED…), or the hub
was told so (``blocking=False``), the loop reads without BLOCK and pauses between empty reads on
a :class:`Backoff` schedule (``poll`` growing to ``poll_cap``), reset by every entry that arrives
and cut short when a watcher joins. Nothing is lost on the switch: the cursors are unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from redis.exceptions import AskError, ClusterDownError, MovedError, ResponseError, TryAgainError

from .._protocol.clock import clock_of
from .._protocol.cluster import pipelined
from .._protocol.codec import parse_stream_id, to_text
from .._protocol.errors import (
    error_code,
    is_redis_fault,
    is_unknown_command,
    is_wrongtype,
    refuses_blocking,
    tolerate_faults,
)
from ..errors import ProtocolError
from .backoff import Backoff
from .event import Event, decode_event
from .follow import liveness_commands, liveness_verdict, synthetic_event
from .hubtypes import Stream

__all__ = ["LoopOwner", "XReadLoop"]

log = logging.getLogger("jobpulse")


def _entries(reply: Any) -> list[tuple[str, list[Any]]]:
    """XREAD's reply (RESP2 list or RESP3 map, bytes or str) as ``[(key, entries)]``."""
    if not reply:
        return []
    pairs = reply.items() if isinstance(reply, dict) else reply
    return [(to_text(key) or "", list(entries or ())) for key, entries in pairs]


class LoopOwner(Protocol):
    """What a loop needs of the hub that owns it (``routing.WatchHub``)."""

    blocking: bool

    def drop(self, stream: Stream) -> None: ...

    async def reroute(self, loop: XReadLoop) -> None: ...


class XReadLoop:
    """One XREAD BLOCK loop on one dedicated connection, over the streams of one server (a
    single Redis, or one master of a cluster). Created by :class:`WatchHub`; not public.

    Args:
        hub: the hub that owns the loop (it routes streams to loops and moves them).
        node: a client of this loop's server alone: the dedicated connection comes from its
            pool and ``CLIENT UNBLOCK`` is sent through it (for a single Redis, the reader's
            own client).
        redis: the reader's client, for history, liveness and flush reads (a ``RedisCluster``
            routes each of those by key).
        name: the server's name (``host:port``; empty for a single Redis).
        block: XREAD BLOCK timeout in seconds (kept under the node client's socket timeout).
        poll: on a cluster, seconds between polls of a node whose streams span several slots;
            without blocking reads, the first pause after an empty read.
        liveness_interval: seconds between liveness checks of the followed jobs.
        count: XREAD COUNT per stream and call.
        clock: monotonic clock.
        blocking: False: never send ``XREAD … BLOCK`` (poll from the start); True (default):
            block, and fall back to polling if the server refuses.
        poll_cap: without blocking reads, the longest pause between empty reads.
    """

    def __init__(
        self,
        hub: LoopOwner,
        node: Any,
        redis: Any,
        *,
        name: str,
        block: float,
        poll: float,
        liveness_interval: float,
        count: int,
        clock: Callable[[], float],
        blocking: bool = True,
        poll_cap: float = 2.0,
    ) -> None:
        self._hub = hub
        self._node = node
        self._redis = redis
        self.name = name
        self.cluster = node is not redis
        timeout = getattr(getattr(node, "connection_pool", None), "connection_kwargs", {}).get(
            "socket_timeout"
        )
        if timeout:
            block = min(block, timeout / 2)
        self._block_ms = max(int(block * 1000), 1)
        self._poll = poll
        self._interval = liveness_interval
        self._count = count
        self._clock = clock
        self.streams: dict[str, Stream] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._unblocker: asyncio.Task[None] | None = None
        self._client_id: int | None = None
        self._unblock_allowed = True
        self._reading = False
        self._sent: frozenset[str] = frozenset()
        self._next_liveness = 0.0
        self._poll_until = 0.0  # a slot of this node is migrating: poll, do not block
        self.blocking = blocking  # False once the server refused XREAD BLOCK
        self._pauses = Backoff(poll, max(poll, poll_cap), 1.5, 0.1)
        self.closed = False
        self.xreads = self.unblocks = self.checks = self.overflows = self.reroutes = 0

    def __repr__(self) -> str:
        return f"<XReadLoop node={self.name or 'redis'} streams={len(self.streams)}>"

    # -- membership (synchronous: no await may split them) -------------------------------------

    def add(self, stream: Stream) -> None:
        """Follow ``stream`` (new to this loop); starts the loop's task when needed."""
        stream.loop = self
        self.streams[stream.key] = stream
        self._next_liveness = 0.0  # check the new job's liveness right away
        self.wake(stream)

    def wake(self, stream: Stream) -> None:
        """A watcher joined ``stream``: make sure the XREAD names it soon."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"jobpulse-watch {self.name}".rstrip()
            )
        self._wake.set()
        if stream.key not in self._sent:
            self._request_unblock()

    def discard(self, stream: Stream) -> None:
        if self.streams.get(stream.key) is stream:
            del self.streams[stream.key]

    def _drop(self, stream: Stream) -> None:
        self._hub.drop(stream)

    async def close_node(self) -> None:
        """Close the node client when it is this loop's own (a cluster node's)."""
        if self.cluster:
            await self._node.aclose()

    async def aclose(self) -> None:
        """Stop the loop and close its connection."""
        self.closed = True
        for task in (self._unblocker, self._task):
            if task is not None and not task.done():
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        raise

    # -- the loop ------------------------------------------------------------------------------

    async def _run(self) -> None:
        conn = self._node.client()
        backoff: Backoff | None = None
        try:
            while not self.closed:
                if not self.streams:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                try:
                    await self._step(conn)
                    backoff = None
                except (MovedError, AskError, TryAgainError, ClusterDownError) as exc:
                    # The slot map changed under us (resharding, failover): re-resolve.
                    self._client_id = None
                    await self._redirected(exc)
                    backoff = backoff or Backoff(0.05, 2.0, 2.0, 0.1)
                    await asyncio.sleep(next(backoff))
                except ResponseError as exc:
                    if not is_wrongtype(exc):
                        raise
                    await self._fail_foreign_keys()
                except UnicodeDecodeError:  # decode_responses and a foreign, non-UTF-8 entry
                    await self._fail_undecodable()
                except Exception as exc:
                    if not is_redis_fault(exc):
                        raise
                    self._client_id = None
                    log.warning("jobpulse watch: XREAD failed, retrying: %r", exc)
                    # A fresh connection from the pool: a Sentinel pool resolves the master
                    # again only for those (redis-py reconnects a held one to its old address,
                    # redis/redis-py#3874), so a held one would follow a dead master forever.
                    await asyncio.shield(conn.aclose())
                    conn = self._node.client()
                    if self.cluster:  # the node may be gone (failover): re-resolve
                        await self._hub.reroute(self)
                    backoff = backoff or Backoff(0.05, 2.0, 2.0, 0.1)
                    await asyncio.sleep(next(backoff))
        except Exception as exc:  # a bug, not a Redis fault: end the watchers instead of hanging
            log.exception("jobpulse watch hub crashed; ending its watchers")
            for stream in list(self.streams.values()):
                self._fail(stream, exc)
        finally:
            self._reading = False
            await asyncio.shield(conn.aclose())

    async def _redirected(self, exc: Exception) -> None:
        if isinstance(exc, MovedError | ClusterDownError):
            await self._hub.reroute(self)
        else:  # ASK or TRYAGAIN: a slot is migrating; poll through the cluster client meanwhile
            self._poll_until = self._clock() + max(self._block_ms / 1000, self._poll) * 5
        self.reroutes += 1

    async def _step(self, conn: Any) -> None:
        groups = self._groups()
        if self.blocking and len(groups) == 1 and self._clock() >= self._poll_until:
            await self._block(conn, groups[0])
        else:
            await self._poll_groups(groups)
        if self._clock() >= self._next_liveness:
            self._next_liveness = self._clock() + self._interval
            await self._check_liveness()

    def _groups(self) -> list[dict[str, str]]:
        """The XREAD requests: one for a single Redis; on a cluster one per hash slot, since
        Redis refuses a multi-key command across slots (CROSSSLOT) even on one node."""
        if not self.cluster:
            return [{s.key: s.cursor for s in self.streams.values()}]
        by_slot: dict[int, dict[str, str]] = {}
        for s in self.streams.values():
            by_slot.setdefault(s.slot, {})[s.key] = s.cursor
        return list(by_slot.values())

    async def _block(self, conn: Any, request: dict[str, str]) -> None:
        if self._client_id is None and self._unblock_allowed:
            try:
                self._client_id = int(await conn.client_id())
            except ResponseError as exc:  # CLIENT ID refused: rely on the block timeout
                if error_code(exc) not in ("ERR", "NOPERM"):
                    raise
                self._unblock_allowed = False
        self._sent = frozenset(request)
        self._reading = True
        self.xreads += 1
        try:
            reply = await conn.xread(request, count=self._count, block=self._block_ms)
        except ResponseError as exc:
            if not refuses_blocking(exc):
                raise
            # Upstash and the like: no blocking reads. Poll (same cursors: nothing is lost).
            self.blocking = self._hub.blocking = False  # later loops of the hub poll too
            log.warning("jobpulse watch: the server refused XREAD BLOCK (%s); polling", exc)
            return
        finally:
            self._reading = False
            self._sent = frozenset()
        self._deliver_reply(reply)

    async def _poll_groups(self, groups: list[dict[str, str]]) -> None:
        """Several slots on one node: one pipeline of non-blocking XREADs, one per slot, then
        a pause of ``poll`` seconds (cut short when a stream joins) if nothing came."""
        self._wake.clear()
        self.xreads += len(groups)
        async with self._node.pipeline(transaction=False) as pipe:
            for request in groups:
                pipe.xread(request, count=self._count)
            replies = await pipe.execute(raise_on_error=False)
        got = False
        for request, reply in zip(groups, replies, strict=True):
            if isinstance(reply, MovedError | ClusterDownError):
                raise reply
            if isinstance(reply, AskError | TryAgainError):
                # The slot is migrating: read through the cluster client, which follows ASK
                # (``ASKING`` and the XREAD on one connection: _protocol/cluster.py).
                self._poll_until = self._clock() + self._poll * 20
                keys = list(request)
                xread = ("XREAD", "COUNT", self._count, "STREAMS", *keys, *request.values())
                (reply,) = await pipelined(self._redis, [xread])
                if isinstance(reply, Exception):
                    raise reply
            elif isinstance(reply, Exception):
                raise reply
            got |= bool(reply)
            self._deliver_reply(reply)
        if got:
            self._pauses.reset()
        else:
            # Without blocking reads the pause grows while nothing happens (Backoff); on a
            # cluster node spanning several slots it stays ``poll``.
            pause = self._poll if self.blocking else next(self._pauses)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await self._wake.wait()
            if self._wake.is_set():  # a watcher joined: read its stream soon again
                self._pauses.reset()

    def _deliver_reply(self, reply: Any) -> None:
        for key, entries in _entries(reply):
            stream = self.streams.get(key)
            if stream is not None:
                self._deliver(stream, entries)

    def _deliver(self, stream: Stream, entries: list[Any]) -> bool:
        """Hand ``entries`` to the stream's watchers; True when the stream ended."""
        for entry_id, raw in entries:
            item: Event | BaseException
            key: tuple[int, int] | None = None
            try:
                item = decode_event(entry_id, raw)  # once per entry, whatever the watchers
                key = parse_stream_id(item.id)
            except ProtocolError as exc:
                item = exc
            stream.cursor = to_text(entry_id) or stream.cursor
            self._offer(stream, item, key)
            if not isinstance(item, Event) or item.terminal:
                self._drop(stream)
                return True
        return False

    def _offer(
        self, stream: Stream, item: Event | BaseException, key: tuple[int, int] | None = None
    ) -> None:
        entry = (item, key)  # one tuple for all the watchers
        full = [watcher for watcher in stream.watchers if not watcher.offer(entry)]
        for watcher in full:
            stream.watchers.discard(watcher)
            self.overflows += 1
        if not stream.watchers:
            self._drop(stream)

    async def _check_liveness(self) -> None:
        streams = list(self.streams.values())
        self.checks += 1
        commands: list[tuple[str, ...]] = []
        for s in streams:
            commands += liveness_commands(s.state_key, s.alive_key)
        replies = await pipelined(self._redis, commands)
        for i, stream in enumerate(streams):
            verdict = liveness_verdict(replies[2 * i], replies[2 * i + 1])
            if verdict is None:
                continue
            if self.streams.get(stream.key) is not stream:
                continue
            # The verdict's time, on this server's clock, read before the flush below: every
            # entry written after it has a larger id (see synthetic_event).
            server_ms = await self._server_ms()
            if self.streams.get(stream.key) is not stream:
                continue
            # Entries may be in the stream that no XREAD returned yet: deliver them first.
            try:
                rest = await self._redis.xrange(stream.key, min=f"({stream.cursor}", max="+")
            except UnicodeDecodeError:
                self._fail(stream, ProtocolError(f"{stream.key} holds text that is not UTF-8"))
                continue
            if self.streams.get(stream.key) is not stream or self._deliver(stream, rest):
                continue
            synthetic = synthetic_event(
                verdict, cursor=stream.cursor, server_ms=server_ms, wall=time.time()
            )
            self._offer(stream, synthetic)
            self._drop(stream)

    async def _server_ms(self) -> int | None:
        """This server's clock (``TIME``, or the name ``script_time`` gave it, on the loop's
        node), or None when the server refuses it (renamed away, an ACL)."""
        command = clock_of(self._redis).time_command
        if command is None:
            return None
        try:
            reply = await self._node.execute_command(command)
        except ResponseError as exc:
            if is_unknown_command(exc) or error_code(exc) == "NOPERM":
                return None
            raise
        return int(reply[0]) * 1000 + int(reply[1]) // 1000

    async def _fail_foreign_keys(self) -> None:
        """XREAD said WRONGTYPE: end the watchers of every key that is not a stream."""
        streams = list(self.streams.values())
        async with self._redis.pipeline(transaction=False) as pipe:
            for s in streams:
                pipe.type(s.key)
            types = await pipe.execute()
        for stream, kind in zip(streams, types, strict=True):
            if to_text(kind) not in ("stream", "none"):
                self._fail(
                    stream, ProtocolError(f"{stream.key} is a {to_text(kind)}, not a stream")
                )

    async def _fail_undecodable(self) -> None:
        """XREAD could not decode its reply as UTF-8: end the watchers of the streams at fault."""
        for stream in list(self.streams.values()):
            try:
                await self._redis.xrange(stream.key, min=f"({stream.cursor}", max="+", count=100)
            except UnicodeDecodeError:
                self._fail(stream, ProtocolError(f"{stream.key} holds text that is not UTF-8"))

    def _fail(self, stream: Stream, error: BaseException) -> None:
        for watcher in list(stream.watchers):
            watcher.fail(error)
        self._drop(stream)

    # -- interrupting a blocked XREAD ----------------------------------------------------------

    def _request_unblock(self) -> None:
        if (
            self._reading
            and self._unblock_allowed
            and self._client_id is not None
            and (self._unblocker is None or self._unblocker.done())
        ):
            self._unblocker = asyncio.get_running_loop().create_task(self._unblock())

    async def _unblock(self) -> None:
        # Retried: CLIENT UNBLOCK answers 0 when the XREAD has not reached the server yet (or
        # has just returned); stop once the call in flight names every stream, or none is.
        def failed(exc: BaseException) -> None:
            if isinstance(exc, ResponseError):
                self._unblock_allowed = False  # e.g. NOPERM: rely on the block timeout
            log.warning("jobpulse watch: CLIENT UNBLOCK failed: %r", exc)

        with tolerate_faults(failed):
            for _ in range(1000):
                if not self._reading or self._sent.issuperset(self.streams):
                    return
                client_id = self._client_id
                if client_id is None:
                    return
                self.unblocks += 1
                await self._node.client_unblock(client_id)
                await asyncio.sleep(0.002)
